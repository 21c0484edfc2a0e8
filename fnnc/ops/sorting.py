"""Sorting and counting family: sort, argsort, partition, unique_consecutive, scatter_add
(NNC's SORT, ARGSORT, PARTITION, UNIQUE_CONSECUTIVE and SCATTER_ADD).

sort and partition return ``(values, indices)`` with ``int32`` indices, as NNC does
(``CMD_SORT_FORWARD(along_axis, descending)``, ``CMD_PARTITION_FORWARD(kth, along_axis,
descending)``); argsort returns only sort's indices (``CMD_ARGSORT_FORWARD(along_axis,
descending)``). Ties keep the order of the
input (a stable sort), so ``partition(descending=True)`` is ``jax.lax.top_k``.

Gradients: NNC's sort and partition are forward-only; here their *values* are
differentiable because they are a gather of the input (each value's gradient goes back
to where it came from, as ``jax.vjp`` of ``jnp.sort`` does), which lets traced
``top_k`` routing train. scatter_add has NNC's backward (a gather of the gradient by
the indices). argsort and unique_consecutive are forward-only, as in NNC: its outputs are counts
and padded values of a data-dependent run-length code.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from fnnc.core.command import NOTHING, Spec, Uses, defcommand
from fnnc.errors import CommandError, DTypeError
from fnnc.ops._rules import fail, norm_axes, require_ints, require_number, show, summing_dtype


def _axis(name: str, x: Spec, axis: int) -> int:
    if x.ndim == 0:
        fail(f"{name}: needs an input of rank >= 1, got {show(x)}")
    return norm_axes(name, (axis,), x.ndim)[0]


def _sort_rule(x: Spec, *, axis, descending) -> tuple[Spec, Spec]:
    _axis("sort", x, axis)
    return Spec(tuple(x.shape), x.dtype), Spec(tuple(x.shape), jnp.int32)


def _order(x, axis: int, descending: bool):
    return jnp.argsort(x, axis=axis, stable=True, descending=descending).astype(jnp.int32)


@defcommand(family="sorting", shape=_sort_rule, uses=Uses(inputs=(), outputs=(1,)))
def sort(x, *, axis=-1, descending=False):
    """``x`` sorted along ``axis`` and the ``int32`` indices that sort it (argsort).

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> values, indices = ops.sort(axis=0)(jnp.array([1.0, 3.0, 2.0]))
    >>> values.tolist(), indices.tolist()
    ([1.0, 2.0, 3.0], [0, 2, 1])
    """
    ax = _axis("sort", x, axis)
    idx = _order(x, ax, descending)
    return jnp.take_along_axis(x, idx, axis=ax), idx


def _argsort_rule(x: Spec, *, axis, descending) -> Spec:
    _axis("argsort", x, axis)
    return Spec(tuple(x.shape), jnp.int32)


@defcommand(family="sorting", shape=_argsort_rule, uses=NOTHING, differentiable=False)
def argsort(x, *, axis=-1, descending=False):
    """The ``int32`` indices that sort ``x`` along ``axis`` (NNC's ARGSORT); ties keep
    the input's order. Forward-only: indices carry no gradient.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.argsort(axis=0, descending=True)(jnp.array([1.0, 3.0, 2.0])).tolist()
    [1, 2, 0]
    """
    return _order(x, _axis("argsort", x, axis), descending)


def _scatter_back(g, idx, shape, axis: int):
    """The gradient of ``take_along_axis(x, idx, axis)``: ``g`` added back at ``idx``."""
    axis = axis % len(shape)
    grid = jnp.indices(idx.shape, sparse=True)
    where = tuple(idx if d == axis else grid[d] for d in range(len(shape)))
    return jnp.zeros(shape, g.dtype).at[where].add(g)


@sort.backward
def _sort_backward(grads, inputs, outputs, *, axis, descending):
    (g, _), (x,), (_, idx) = grads, inputs, outputs
    if g is None or not jnp.issubdtype(x.dtype, jnp.inexact):
        return (None,)
    return (_scatter_back(g, idx, x.shape, axis),)


def _partition_rule(x: Spec, *, kth, axis, descending) -> tuple[Spec, Spec]:
    ax = _axis("partition", x, axis)
    kth = require_ints("partition", "kth", kth)
    if not 1 <= kth <= x.shape[ax]:
        raise CommandError(
            f"partition: kth must be in [1, {x.shape[ax]}] for axis {axis} of {show(x)}, got {kth}"
        )
    shape = tuple(kth if d == ax else n for d, n in enumerate(x.shape))
    return Spec(shape, x.dtype), Spec(shape, jnp.int32)


@defcommand(family="sorting", shape=_partition_rule, uses=Uses(inputs=(), outputs=(1,)))
def partition(x, *, kth, axis=-1, descending=False):
    """The ``kth`` smallest entries along ``axis`` (largest with ``descending=True``,
    ``jax.lax.top_k``), in order, and their ``int32`` indices."""
    ax, kth = _axis("partition", x, axis), require_ints("partition", "kth", kth)
    if descending:
        values, idx = lax.top_k(jnp.moveaxis(x, ax, -1), kth)
        return jnp.moveaxis(values, -1, ax), jnp.moveaxis(idx.astype(jnp.int32), -1, ax)
    idx = lax.slice_in_dim(_order(x, ax, False), 0, kth, axis=ax)
    return jnp.take_along_axis(x, idx, axis=ax), idx


@partition.backward
def _partition_backward(grads, inputs, outputs, *, kth, axis, descending):
    (g, _), (x,), (_, idx) = grads, inputs, outputs
    if g is None or not jnp.issubdtype(x.dtype, jnp.inexact):
        return (None,)
    return (_scatter_back(g, idx, x.shape, axis),)


def _unique_rule(x: Spec, *, bincount) -> tuple[Spec, Spec]:
    if x.ndim != 1:
        fail(f"unique_consecutive: expected a 1-d tensor, got {show(x)}")
    bincount = require_ints("unique_consecutive", "bincount", bincount)
    if bincount < 1:
        raise CommandError(f"unique_consecutive: bincount must be >= 1, got {bincount}")
    return Spec((bincount,), x.dtype), Spec((bincount,), jnp.int32)


@defcommand(family="sorting", shape=_unique_rule, uses=NOTHING, differentiable=False)
def unique_consecutive(x, *, bincount):
    """Run-length code of a 1-d tensor: each run's value and length, in order, in
    outputs of ``bincount`` entries (NNC's UNIQUE_CONSECUTIVE). Unused slots hold -1
    (values) and 0 (counts), so an empty x gives only unused slots; runs past
    ``bincount`` are dropped."""
    bincount = require_ints("unique_consecutive", "bincount", bincount)
    starts = jnp.concatenate([jnp.ones((min(1, x.shape[0]),), bool), x[1:] != x[:-1]])
    run = jnp.cumsum(starts.astype(jnp.int32)) - 1
    values = jnp.full((bincount,), -1, x.dtype).at[run].set(x, mode="drop")
    counts = jnp.zeros((bincount,), jnp.int32).at[run].add(1, mode="drop")
    return values, counts


def _scatter_add_rule(x: Spec, indices: Spec, *, bincount) -> Spec:
    if x.ndim == 0:
        fail(f"scatter_add: expected rows to add (rank >= 1), got {show(x)}")
    require_number("scatter_add", x)
    if indices.dtype != jnp.int32:
        raise DTypeError(f"scatter_add: indices must be int32, got {show(indices)}")
    if tuple(indices.shape) != (x.shape[0],):
        fail(f"scatter_add: indices must be [{x.shape[0]}] (one per row), got {show(indices)}")
    if bincount < 0:
        raise CommandError(f"scatter_add: bincount must be >= 0, got {bincount}")
    rows = bincount if bincount > 0 else indices.shape[0]
    return Spec((rows, *x.shape[1:]), x.dtype)


@defcommand(family="sorting", shape=_scatter_add_rule, uses=Uses(inputs=(1,)))
def scatter_add(x, indices, *, bincount=0):
    """Row ``i`` of ``x`` added into row ``indices[i]`` of a zero tensor of
    ``bincount`` rows (``indices``' length when 0, NNC's default); rows whose index is
    out of range (negative included) are dropped. The inverse of ``index_select``.
    16-bit rows are added in float32 and the sums rounded once
    (:func:`~fnnc.ops._rules.summing_dtype`): in bfloat16, 4096 rows of 0.1 into one
    bin stopped at 32."""
    rows = bincount if bincount > 0 else indices.shape[0]
    where = _in_range(indices, rows)
    acc = summing_dtype(x.dtype)
    total = jnp.zeros((rows, *x.shape[1:]), acc).at[where].add(x.astype(acc), mode="drop")
    return total.astype(x.dtype)


def _in_range(indices, rows: int):
    """Negative indices made out of range too: dropped (``lax.scatter_add``'s rule), not
    counted from the end as NumPy indexing would."""
    return jnp.where(indices < 0, rows, indices)


@scatter_add.backward
def _scatter_add_backward(grads, inputs, outputs, *, bincount):
    (g,), (x, indices) = grads, inputs
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return (None, None)
    where = _in_range(indices, g.shape[0])
    return (jnp.take(g, where, axis=0, mode="fill", fill_value=0), None)
