"""Data-movement family: reshape, transpose, format_transform, datatype_conversion,
concat, slice, index_select, broadcast_to, data_transfer (pad, set and masked_fill, which
write values of their own, live in :mod:`fnnc.ops.fill`; upsample in
:mod:`fnnc.ops.upsample`, as NNC keeps it in its own folder).

These commands move or copy values without arithmetic (bilinear upsampling aside), so
most backwards need only the *shapes* of the forward tensors: they declare
``uses=NOTHING`` and never keep an activation alive. Linear commands whose backward is
tedious to write by hand (reflect / edge padding, upsampling) transpose their own
forward with :func:`jax.linear_transpose`, which needs no values either.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import NOTHING, Spec, Uses, defcommand, is_float
from fnnc.errors import DTypeError
from fnnc.ops._rules import (
    fail,
    jax_dtype,
    norm_axes,
    require_choice,
    require_ints,
    require_same_dtype,
    same_shape,
    show,
    summing_dtype,
    to_shape,
    unbroadcast,
)


def _transpose_back(g: Any, perm: tuple[int, ...]) -> Any:
    return jnp.transpose(g, tuple(int(i) for i in np.argsort(perm)))


# --- reshape, transpose, format_transform -------------------------------------------


def _reshape_target(x: Spec, shape: tuple[int, ...]) -> tuple[int, ...]:
    shape = require_ints("reshape", "shape", shape)
    size = math.prod(x.shape)
    holes = [i for i, n in enumerate(shape) if n == -1]
    if len(holes) > 1 or any(n < -1 for n in shape):
        fail(f"reshape: shape {list(shape)} may hold one -1 and otherwise sizes >= 0")
    known = math.prod(n for n in shape if n != -1)
    if holes:
        if known == 0 or size % known:
            fail(f"reshape: cannot infer the -1 in {list(shape)} for {show(x)} ({size} elements)")
        return (*shape[: holes[0]], size // known, *shape[holes[0] + 1 :])
    if known != size:
        fail(
            f"reshape: input {show(x)} has {size} elements but shape {list(shape)} holds {known}; "
            "the sizes must multiply to the same count (use -1 for one inferred axis)"
        )
    return shape


def _reshape_shape(x: Spec, *, shape: tuple[int, ...]) -> Spec:
    return Spec(_reshape_target(x, shape), x.dtype)


@defcommand(family="data", shape=_reshape_shape, uses=NOTHING)
def reshape(x, *, shape):
    """Same values in a new shape (row-major); one entry of ``shape`` may be -1."""
    return jnp.reshape(x, _reshape_target(x, shape))


@reshape.backward
def _reshape_backward(grads, inputs, outputs, *, shape):
    return (jnp.reshape(grads[0], inputs[0].shape),)


def _transpose_shape(x: Spec, *, perm: tuple[int, ...]) -> Spec:
    perm = require_ints("transpose", "perm", perm)
    if sorted(perm) != list(range(x.ndim)):
        fail(f"transpose: perm {list(perm)} is not a permutation of 0..{x.ndim - 1} for {show(x)}")
    return Spec(tuple(x.shape[p] for p in perm), x.dtype)


@defcommand(family="data", shape=_transpose_shape, uses=NOTHING)
def transpose(x, *, perm):
    """Permutes axes: output axis ``i`` is input axis ``perm[i]``."""
    return jnp.transpose(x, require_ints("transpose", "perm", perm))


@transpose.backward
def _transpose_backward(grads, inputs, outputs, *, perm):
    return (_transpose_back(grads[0], require_ints("transpose", "perm", perm)),)


FORMATS = ("NCHW", "NHWC", "CHWN")


def _format_perm(x: Spec, src: str, dst: str) -> tuple[int, ...]:
    require_choice("format_transform", "src", src, FORMATS)
    require_choice("format_transform", "dst", dst, FORMATS)
    if src == dst:  # NNC copies the data as it is, at any rank
        return tuple(range(x.ndim))
    if x.ndim == 3 and "CHWN" not in (src, dst):  # NNC's 3-d tensors: no batch axis
        src, dst = src.replace("N", ""), dst.replace("N", "")
    elif x.ndim != 4:
        fail(
            f"format_transform: expected a rank-4 {src} tensor (or rank-3 without the batch "
            f"axis, for NCHW / NHWC), got {show(x)}"
        )
    return tuple(src.index(c) for c in dst)


def _format_shape(x: Spec, *, src: str, dst: str) -> Spec:
    return Spec(tuple(x.shape[p] for p in _format_perm(x, src, dst)), x.dtype)


@defcommand(family="data", shape=_format_shape, uses=NOTHING)
def format_transform(x, *, src="NCHW", dst="NHWC"):
    """Converts a rank-4 tensor between NNC formats NCHW, NHWC and CHWN (a transpose);
    a rank-3 tensor is one image without the batch axis (CHW / HWC), as in NNC. With
    ``src == dst`` it copies a tensor of any rank, as NNC does."""
    return jnp.transpose(x, _format_perm(x, src, dst))


@format_transform.backward
def _format_transform_backward(grads, inputs, outputs, *, src, dst):
    return (_transpose_back(grads[0], _format_perm(inputs[0], src, dst)),)


# --- datatype_conversion, concat, slice, index_select ---------------------------------


@defcommand(family="data", shape=lambda x, *, dtype: Spec(x.shape, jax_dtype(dtype)), uses=NOTHING)
def datatype_conversion(x, *, dtype):
    """Converts ``x`` to ``dtype`` (float64 becomes float32 unless x64 is on)."""
    return lax.convert_element_type(x, jax_dtype(dtype))


@datatype_conversion.backward
def _datatype_conversion_backward(grads, inputs, outputs, *, dtype):
    (g,), (x,) = grads, inputs
    if not is_float(x):
        return (None,)
    if g is None or not is_float(g):  # converted to an integer type: no gradient flows
        return (jnp.zeros(x.shape, x.dtype),)
    return (g.astype(x.dtype),)


def _concat_shape(*inputs: Spec, axis: int) -> Spec:
    if not inputs:
        fail("concat: needs at least one input")
    dtype = require_same_dtype("concat", *inputs)
    first = inputs[0]
    (ax,) = norm_axes("concat", (axis,), first.ndim)
    total = 0
    for i, x in enumerate(inputs):
        rest_x = tuple(n for d, n in enumerate(x.shape) if d != ax)
        rest_0 = tuple(n for d, n in enumerate(first.shape) if d != ax)
        if x.ndim != first.ndim or rest_x != rest_0:
            fail(
                f"concat: input {i} {show(x)} does not fit input 0 {show(first)}; "
                f"all sizes except axis {axis} must match"
            )
        total += x.shape[ax]
    return Spec((*first.shape[:ax], total, *first.shape[ax + 1 :]), dtype)


@defcommand(family="data", shape=_concat_shape, uses=NOTHING)
def concat(*inputs, axis=0):
    """Joins any number of tensors along ``axis``; other sizes must match."""
    return jnp.concatenate(inputs, axis=axis)


@concat.backward
def _concat_backward(grads, inputs, outputs, *, axis):
    (g,) = grads
    if not is_float(inputs[0]):
        return (None,) * len(inputs)
    ax = axis % g.ndim
    pieces, start = [], 0
    for x in inputs:
        pieces.append(lax.slice_in_dim(g, start, start + x.shape[ax], axis=ax))
        start += x.shape[ax]
    return tuple(pieces)


def _slice_dims(x: Spec, start, limit, strides) -> tuple[tuple[int, ...], tuple[int, ...]]:
    strides = (1,) * x.ndim if strides is None else tuple(strides)
    start, limit, strides = require_ints(
        "slice", "start, limit and strides", (start, limit, strides)
    )
    if not len(start) == len(limit) == len(strides) == x.ndim:
        fail(
            f"slice: start {list(start)}, limit {list(limit)} and strides {list(strides)} "
            f"need one entry per axis of {show(x)}"
        )
    out = []
    for d, (s, lim, k, n) in enumerate(zip(start, limit, strides, x.shape)):
        if not 0 <= s <= lim <= n or k < 1:
            fail(
                f"slice: axis {d} of {show(x)} needs 0 <= start <= limit <= {n} and stride >= 1, "
                f"got start={s}, limit={lim}, stride={k}"
            )
        out.append(-(-(lim - s) // k))
    return strides, tuple(out)


def _slice_ints(x: Any, start, limit, strides) -> tuple[tuple[int, ...], ...]:
    """``start``, ``limit`` and ``strides`` as Python ints (strides all 1 when None)."""
    strides = (1,) * x.ndim if strides is None else strides
    return require_ints("slice", "start, limit and strides", (start, limit, strides))


def _slice_shape(x: Spec, *, start, limit, strides) -> Spec:
    return Spec(_slice_dims(x, start, limit, strides)[1], x.dtype)


@defcommand(family="data", shape=_slice_shape, uses=NOTHING)
def slice(x, *, start, limit, strides=None):
    """``x[start:limit:strides]`` per axis (all non-negative, in bounds)."""
    start, limit, strides = _slice_ints(x, start, limit, strides)
    return lax.slice(x, start, limit, strides)


@slice.backward
def _slice_backward(grads, inputs, outputs, *, start, limit, strides):
    (g,), (x,) = grads, inputs
    if not is_float(x):
        return (None,)
    start, limit, strides = _slice_ints(x, start, limit, strides)
    out = _slice_dims(x, start, limit, strides)[1]
    config = [
        (s, n - s - m - max(m - 1, 0) * (k - 1), k - 1)
        for s, k, n, m in zip(start, strides, x.shape, out)
    ]
    return (lax.pad(g, jnp.zeros((), g.dtype), config),)


def _index_select_shape(x: Spec, idx: Spec, *, axis: int) -> Spec:
    floating = jnp.issubdtype(idx.dtype, jnp.floating)
    if idx.ndim != 1 or not (floating or jnp.issubdtype(idx.dtype, jnp.integer)):
        raise DTypeError(
            f"index_select: idx must be an integer vector (indices) or a float vector "
            f"(positions, interpolated as in NNC), got {show(idx)}"
        )
    if floating and not jnp.issubdtype(x.dtype, jnp.floating):
        raise DTypeError(
            f"index_select: float positions {show(idx)} interpolate, so x must be floating, "
            f"got {show(x)}; pass integer indices to pick rows of an integer x"
        )
    (ax,) = norm_axes("index_select", (axis,), x.ndim)
    if x.shape[ax] == 0 and idx.shape[0]:
        fail(
            f"index_select: axis {axis} of x {show(x)} is empty, so none of the "
            f"{idx.shape[0]} entries of idx can be picked from it; give x rows to pick "
            "along that axis, or an empty idx for an empty result"
        )
    return Spec((*x.shape[:ax], idx.shape[0], *x.shape[ax + 1 :]), x.dtype)


def _interpolation(idx: Any, n: int) -> tuple[Any, Any, Any]:
    """NNC's float positions: rows ``j0 = int(i)`` and ``min(j0 + 1, n - 1)``, and the
    weight ``i - j0`` of the second."""
    j0 = idx.astype(jnp.int32)
    return j0, jnp.minimum(j0 + 1, n - 1), idx - j0.astype(idx.dtype)


@defcommand(family="data", shape=_index_select_shape, uses=Uses(inputs=(1,)))
def index_select(x, idx, *, axis=0):
    """Picks the entries ``idx`` of ``x`` along ``axis`` (negative indices count from
    the end). Out-of-range ones read ``jnp.take``'s fill: NaN for floats, the smallest
    value of a signed integer type, the largest of an unsigned one, True for bool.
    NNC's INDEX_SELECT is ``axis=0``.

    Float ``idx`` are positions between entries, interpolated linearly as in NNC
    (``ccv_nnc_index_select_cpu_ref.c``): position ``i`` reads
    ``x[j] * (1 - w) + x[min(j + 1, n - 1)] * w`` with ``j = int(i)``, ``w = i - j``, so
    rows ``[[1, 2], [2, 3], [3, 4]]`` at ``[1.5, 0.4]`` give ``[[2.5, 3.5], [1.4, 2.4]]``.
    Positions must lie in ``[0, n)``. The positions get no gradient (NNC gives none).
    """
    if not jnp.issubdtype(idx.dtype, jnp.floating):
        return jnp.take(x, idx, axis=axis)
    j0, j1, w = _interpolation(idx, x.shape[axis % x.ndim])
    keep = [1] * x.ndim
    keep[axis % x.ndim] = idx.shape[0]
    # Blended in float32 at least and rounded once (a bfloat16 weight 0.3 is 0.30078).
    wide = jnp.promote_types(summing_dtype(x.dtype), w.dtype)
    w = jnp.reshape(w.astype(wide), keep)
    a, b = jnp.take(x, j0, axis=axis).astype(wide), jnp.take(x, j1, axis=axis).astype(wide)
    return (a * (1 - w) + b * w).astype(x.dtype)


@index_select.backward
def _index_select_backward(grads, inputs, outputs, *, axis):
    (g,), (x, idx) = grads, inputs
    if not is_float(x):
        return None, None
    ax = axis % x.ndim
    rest = tuple(n for d, n in enumerate(x.shape) if d != ax)
    dtype = g.dtype
    g = jnp.moveaxis(g, ax, 0).astype(summing_dtype(dtype))  # 16-bit: summed in float32
    acc = jnp.zeros((x.shape[ax], *rest), g.dtype)
    if not jnp.issubdtype(idx.dtype, jnp.floating):
        acc = acc.at[idx].add(g)
    else:
        j0, j1, w = _interpolation(idx, x.shape[ax])
        w = jnp.reshape(w.astype(g.dtype), (-1,) + (1,) * len(rest))
        acc = acc.at[j0].add(g * (1 - w)).at[j1].add(g * w)
    return jnp.moveaxis(acc, 0, ax).astype(dtype), None


def _broadcast_to_shape(x: Spec, *, shape) -> Spec:
    shape = require_ints("broadcast_to", "shape", shape)
    lead = len(shape) - x.ndim
    if lead < 0 or any(n not in (1, m) for n, m in zip(x.shape, shape[lead:])):
        fail(f"broadcast_to: {show(x)} does not broadcast to {list(shape)} (NumPy rules)")
    return Spec(shape, x.dtype)


@defcommand(family="data", shape=_broadcast_to_shape, uses=NOTHING)
def broadcast_to(x, *, shape):
    """``x`` broadcast to ``shape`` by NumPy rules (new leading axes, size-1 axes grow)."""
    return to_shape(x, require_ints("broadcast_to", "shape", shape))


@broadcast_to.backward
def _broadcast_to_backward(grads, inputs, outputs, *, shape):
    (g,), (x,) = grads, inputs
    return (unbroadcast(g, x.shape) if is_float(x) else None,)


@defcommand(family="data", shape=same_shape, uses=NOTHING)
def data_transfer(x):
    """A copy of ``x`` (NNC's DATA_TRANSFER); writes a value into an alias view."""
    return x


@data_transfer.backward
def _data_transfer_backward(grads, inputs, outputs):
    return (grads[0],)
