"""Reduce family: reduce_sum, reduce_mean, reduce_max, reduce_min, reduce_norm2,
reduce_isnan, argmax, argmin (NNC's REDUCE_* and ARGMAX / ARGMIN).

As in NNC, reduced axes stay in the output with size 1, so a result broadcasts back
against its input without reshaping: ``reduce_sum(axes=(1,))`` maps ``[2, 3, 4]`` to
``[2, 1, 4]``. ``axes`` may be negative. argmax / argmin take one axis and return
``int32`` indices; they and ``reduce_isnan`` (``int32`` flags) have no gradient.
A backward given NNC's null output gradient (``None``) takes ones, the reduction's own
derivative (:meth:`fnnc.core.opdef.OpDef.backward` fills it in), as NNC's REDUCE_NORM2 backward
does (``x / norm``).
"""

from __future__ import annotations

import jax.numpy as jnp

from fnnc.core.command import NOTHING, Spec, Uses, defcommand, is_float
from fnnc.core.dtypes import at_least_float32
from fnnc.errors import DTypeError
from fnnc.ops._rules import (
    fail,
    leading_sum,
    norm_axes,
    require_float,
    show,
    summing_dtype,
    to_shape,
)

EXTREMUM_USES = Uses(inputs=(0,), outputs=(0,))


def _kept(shape, axes) -> tuple[int, ...]:
    return tuple(1 if d in axes else n for d, n in enumerate(shape))


def _count(shape, axes) -> int:
    n = 1
    for a in axes:
        n *= shape[a]
    return n


def _reduce_rule(name: str, need_float: bool = False, nonempty: bool = False, count=False):
    def rule(x: Spec, *, axes) -> Spec:
        if need_float:
            require_float(name, x)
        if count and x.dtype == jnp.bool_:
            raise DTypeError(
                f"{name}: {show(x)} would sum in bool (a logical or); to count the True "
                "entries convert x to an integer type first (datatype_conversion to int32)"
            )
        axes = norm_axes(name, axes, x.ndim)
        if nonempty:
            _nonempty(name, x, axes)
        return Spec(_kept(x.shape, axes), x.dtype)

    return rule


def _nonempty(name: str, x: Spec, axes: tuple[int, ...]) -> None:
    """A maximum, minimum or arg-extremum of no values is undefined (JAX raises a bare
    ValueError while tracing): a ShapeError naming the empty axis instead."""
    empty = [a for a in axes if x.shape[a] == 0]
    if empty:
        fail(f"{name}: axis {empty[0]} of {show(x)} is empty; it has no value to pick")


@defcommand(family="reduce", shape=_reduce_rule("reduce_sum", count=True), uses=NOTHING)
def reduce_sum(x, *, axes):
    """Sum over ``axes`` (kept as size 1), in ``x``'s dtype (not bool: convert a mask
    to an integer type to count it, as ``jnp.sum`` does); 16-bit floats are summed in
    float32 and rounded once (:func:`fnnc.ops._rules.summing_dtype`), as ``jnp.sum``
    does. Over all axes but the last it sums in batch_norm's order
    (:func:`fnnc.ops._rules.leading_sum`)."""
    ax = norm_axes("reduce_sum", axes, x.ndim)
    total = leading_sum(x, ax, dtype=summing_dtype(x.dtype)).astype(x.dtype)
    return jnp.reshape(total, _kept(x.shape, ax))


@reduce_sum.backward
def _reduce_sum_backward(grads, inputs, outputs, *, axes):
    (g,), (x,) = grads, inputs
    if not is_float(x):
        return (None,)
    return (to_shape(g, x.shape),)


@defcommand(family="reduce", shape=_reduce_rule("reduce_mean", need_float=True), uses=NOTHING)
def reduce_mean(x, *, axes):
    """Mean over ``axes`` (kept as size 1); 16-bit floats are summed in float32, as
    ``jnp.mean`` does. Over all axes but the last it sums in batch_norm's order and
    divides as it does (:func:`fnnc.ops._rules.leading_sum`): equal batch means."""
    ax = norm_axes("reduce_mean", axes, x.ndim)
    wide = at_least_float32(x.dtype)
    total = leading_sum(x, ax, dtype=wide)
    return jnp.reshape(total / _count(x.shape, ax), _kept(x.shape, ax)).astype(x.dtype)


@reduce_mean.backward
def _reduce_mean_backward(grads, inputs, outputs, *, axes):
    (g,), (x,) = grads, inputs
    n = _count(x.shape, norm_axes("reduce_mean", axes, x.ndim))
    return (to_shape(g, x.shape) / n,)


def _extremum(name: str, pick, doc: str):
    def forward(x, *, axes):
        return pick(x, axis=norm_axes(name, axes, x.ndim), keepdims=True)

    forward.__name__ = name
    forward.__doc__ = doc
    rule = _reduce_rule(name, nonempty=True)
    factory = defcommand(family="reduce", shape=rule, uses=EXTREMUM_USES)(forward)

    @factory.backward
    def _backward(grads, inputs, outputs, *, axes):
        (g,), (x,), (y,) = grads, inputs, outputs
        if not is_float(x):
            return (None,)
        ax = norm_axes(name, axes, x.ndim)
        hit = (x == to_shape(y, x.shape)).astype(g.dtype)
        share = g / jnp.sum(hit, axis=ax, keepdims=True)
        return (hit * to_shape(share, x.shape),)

    return factory


_TIES = "; ties share the gradient equally (as jax.vjp of jnp.{} does)."
reduce_max = _extremum(
    "reduce_max", jnp.max, "Maximum over ``axes`` (kept as size 1)" + _TIES.format("max")
)
reduce_min = _extremum(
    "reduce_min", jnp.min, "Minimum over ``axes`` (kept as size 1)" + _TIES.format("min")
)


@defcommand(
    family="reduce", shape=_reduce_rule("reduce_norm2", need_float=True), uses=EXTREMUM_USES
)
def reduce_norm2(x, *, axes):
    """Euclidean norm ``sqrt(sum(x^2))`` over ``axes`` (kept as size 1). A 16-bit x is
    squared and summed in float32 and the norm rounded once: float16 squares of 256 and
    more overflow (a norm of 600 came out inf)."""
    ax = norm_axes("reduce_norm2", axes, x.ndim)
    w = x.astype(at_least_float32(x.dtype))
    return jnp.sqrt(jnp.sum(w * w, axis=ax, keepdims=True)).astype(x.dtype)


@reduce_norm2.backward
def _reduce_norm2_backward(grads, inputs, outputs, *, axes):
    (g,), (x,), (y,) = grads, inputs, outputs
    wide = at_least_float32(x.dtype)
    return ((x.astype(wide) * to_shape(g.astype(wide) / y.astype(wide), x.shape)).astype(x.dtype),)


def _isnan_rule(x: Spec, *, axes) -> Spec:
    return Spec(_kept(x.shape, norm_axes("reduce_isnan", axes, x.ndim)), jnp.int32)


@defcommand(family="reduce", shape=_isnan_rule, uses=NOTHING, differentiable=False)
def reduce_isnan(x, *, axes):
    """1 where a NaN is among the entries reduced over ``axes`` (kept as size 1), else
    0, as ``int32`` (NNC's REDUCE_ISNAN). It has no gradient: NNC's backward is
    ``CCV_NNC_EXEC_INVALID``. Integer inputs hold no NaN and give zeros."""
    ax = norm_axes("reduce_isnan", axes, x.ndim)
    return jnp.any(jnp.isnan(x), axis=ax, keepdims=True).astype(jnp.int32)


def _arg_rule(name: str):
    def rule(x: Spec, *, axis) -> Spec:
        if x.ndim == 0:
            fail(f"{name}: needs an input of rank >= 1, got {show(x)}")
        axes = norm_axes(name, (axis,), x.ndim)
        _nonempty(name, x, axes)
        return Spec(_kept(x.shape, axes), jnp.int32)

    return rule


@defcommand(family="reduce", shape=_arg_rule("argmax"), uses=NOTHING, differentiable=False)
def argmax(x, *, axis):
    """Index of the largest entry along ``axis`` (kept as size 1), ``int32``; the first
    one on ties."""
    return jnp.argmax(x, axis=axis, keepdims=True).astype(jnp.int32)


@defcommand(family="reduce", shape=_arg_rule("argmin"), uses=NOTHING, differentiable=False)
def argmin(x, *, axis):
    """Index of the smallest entry along ``axis`` (kept as size 1), ``int32``; the first
    one on ties."""
    return jnp.argmin(x, axis=axis, keepdims=True).astype(jnp.int32)
