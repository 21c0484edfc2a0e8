"""Memory family: commands that exist to shape a program's memory, not its values.

``optimization_barrier(*xs)`` returns its inputs unchanged, but XLA may not look
through it: values computed from its outputs cannot be merged with (CSE) or moved
before (scheduling) the same computation on its inputs. The ``remat`` pass routes the
inputs of a recomputed forward segment through one, together with a tensor of the
backward, so the recomputation really happens in the backward (as ``jax.checkpoint``
does) instead of being folded back into the forward by XLA.

``lssc_compress`` / ``lssc_decompress`` are NNC's LSSC activation compression
(``cmd/compression``): the ``memory_compression`` pass keeps convolution activations
for the backward in this 8x smaller (than float32), lossy form.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import NOTHING, Spec, defcommand
from fnnc.errors import ShapeError
from fnnc.ops._rules import fail, show


def _same_specs(*xs: Spec) -> tuple[Spec, ...]:
    if not xs:
        raise ShapeError("optimization_barrier: expected at least one input")
    return tuple(Spec(tuple(x.shape), x.dtype) for x in xs)


@defcommand(family="memory", shape=_same_specs, uses=NOTHING, min_inputs=1)
def optimization_barrier(*inputs):
    """The inputs, unchanged, behind ``lax.optimization_barrier`` (see the module doc).

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.optimization_barrier()(jnp.ones(2), jnp.zeros(1))
    (Array([1., 1.], dtype=float32), Array([0.], dtype=float32))
    """
    return tuple(lax.optimization_barrier(tuple(inputs)))


@optimization_barrier.backward
def _optimization_barrier_backward(grads, inputs, outputs):
    return tuple(grads)


# --- LSSC: NNC's lossy activation compression (cmd/compression) ---------------------
#
# NNC's ccv_nnc_lssc_cpu_ref.c, for a half-precision NCHW tensor, per (n, c) plane:
# every 4x4 block of the spatial axes (a partial block at the bottom/right edge is
# filled with the block's first element) becomes four 16-bit words, laid along the
# width: the block's min and max as halves, then 2-bit indices of the 16 elements in
# row-major order (elements 0-7 in word 2, 8-15 in word 3, element c at bits 2c).
# Index of a: clamp((int)((a - bottom) * scale), 0, 3) with bottom = min*7/6 - max/6
# and scale = 3 / max(max - min, 1e-6) (so a rounds to the nearest of min, min + r/3,
# min + 2r/3, max). Decompression gives those four levels, converted to half by ccv's
# table conversion, which truncates toward zero. fnnc's tensors are channels-last, so
# the same planes are [..., H, W, C] -> [..., ceil(H/4), 4*ceil(W/4), C] (NNC:
# [..., C, H, W] -> [..., C, ceil(H/4), 4*ceil(W/4)]). NNC types the compressed tensor
# 16F; fnnc types it uint16 (a bag of words, never read as halves). Inputs of any float
# type are rounded to half first (NNC's commands take half only), so values beyond
# float16's range (|x| > 65504) become infinities, and their blocks decompress to them.

_F16, _F32, _U16 = np.float16, np.float32, np.uint16


def _lssc_check(name: str, x: Spec) -> tuple[int, int]:
    if len(x.shape) not in (3, 4):
        fail(f"{name}: expected [H, W, C] or [N, H, W, C], got {show(x)}")
    return x.shape[-3], x.shape[-2]


def _lssc_compress_shape(x: Spec) -> Spec:
    h, w = _lssc_check("lssc_compress", x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        fail(f"lssc_compress: expected a float tensor, got {show(x)}")
    return Spec((*x.shape[:-3], -(-h // 4), -(-w // 4) * 4, x.shape[-1]), _U16)


def _lssc_size(c: Spec, size: Any) -> tuple[int, int]:
    hb, w4 = _lssc_check("lssc_decompress", c)
    if w4 % 4:
        fail(f"lssc_decompress: the compressed width must be a multiple of 4, got {show(c)}")
    h, w = (hb * 4, w4) if size is None else (int(size[0]), int(size[1]))
    if -(-h // 4) != hb or -(-w // 4) * 4 != w4:
        fail(f"lssc_decompress: size {[h, w]} does not compress to {show(c)}")
    return h, w


def _lssc_decompress_shape(c: Spec, *, size: Any, dtype: Any) -> Spec:
    if np.dtype(c.dtype) != _U16:
        fail(f"lssc_decompress: expected the uint16 words of lssc_compress, got {show(c)}")
    h, w = _lssc_size(c, size)
    return Spec((*c.shape[:-3], h, w, c.shape[-1]), np.dtype(dtype))


def _blocks(a: jax.Array) -> jax.Array:
    """[..., H, W, C] -> [..., Hb, Wb, C, 16], edge blocks filled with their element 0."""
    *lead, h, w, c = a.shape
    hb, wb, n = -(-h // 4), -(-w // 4), len(lead)
    a = jnp.pad(a, [(0, 0)] * n + [(0, hb * 4 - h), (0, wb * 4 - w), (0, 0)])
    a = jnp.moveaxis(a.reshape(*lead, hb, 4, wb, 4, c), (n + 1, n + 3), (-2, -1))
    a = a.reshape(*lead, hb, wb, c, 16)
    rows = (np.arange(hb)[:, None] * 4 + np.arange(16) // 4) < h
    cols = (np.arange(wb)[:, None] * 4 + np.arange(16) % 4) < w
    valid = rows[:, None, None, :] & cols[None, :, None, :]
    return jnp.where(valid.reshape((1,) * n + valid.shape), a, a[..., :1])


def _lanes(values: np.ndarray, rank: int) -> np.ndarray:
    """``values`` along the last axis of a rank-``rank`` array (explicit broadcasting)."""
    return values.reshape((1,) * (rank - 1) + (-1,))


def _constants() -> tuple[jax.Array, ...]:
    """float32 2, 3, 6, 7 that XLA cannot see: it would rewrite ``x / 3`` as
    ``x * 0.33333334`` (and ``x * 2 / 3`` as ``x * 0.6666667``), which rounds differently
    from C's division."""
    return lax.optimization_barrier(tuple(jnp.asarray(_F32(v)) for v in (2, 3, 6, 7)))


def _to_f16(x: jax.Array) -> jax.Array:
    """``x`` rounded to float16, a rounding XLA must keep: XLA:GPU removes a float32 ->
    float16 -> float32 round trip as excess precision (``xla_allow_excess_precision``),
    which the barrier between the two conversions prevents."""
    return lax.optimization_barrier(x.astype(_F16))


def _f16_toward_zero(x: jax.Array) -> jax.Array:
    """float32 -> float16 truncating toward zero, as ccv_float_to_half_precision."""
    r = _to_f16(x)
    bits = lax.bitcast_convert_type(r, _U16)
    away = jnp.abs(r.astype(_F32)) > jnp.abs(x)
    return jnp.where(away, lax.bitcast_convert_type(bits - _U16(1), _F16), r)


@defcommand(family="memory", shape=_lssc_compress_shape, uses=NOTHING, differentiable=False)
def lssc_compress(x):
    """NNC's COMPRESSION_LSSC_FORWARD: 4x4 spatial blocks to 4 words each (see above).

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.lssc_compress()(jnp.ones((2, 8, 8, 3))).shape  # 8x smaller than float32
    (2, 2, 8, 3)
    """
    a = _blocks(_to_f16(x).astype(_F32))
    amin, amax = a.min(-1), a.max(-1)
    _, three, six, seven = _constants()
    bottom = amin * seven / six - amax / six
    span = amax - amin
    scale = jnp.where(span > _F32(1e-6), three / span, _F32(3 / 1e-6))
    index = (a - bottom[..., None]) * scale[..., None]
    # A block beyond float16's range (an element over 65504 rounds to an infinity) gives
    # inf * 0 = NaN for every index, which C's (int) leaves undefined; its infinities
    # take the level that holds them, so the block decompresses to an infinity (which
    # the numerics check names) instead of to its finite minimum everywhere.
    index = jnp.where(jnp.isnan(index), jnp.where(a == amax[..., None], 3, 0), index)
    index = index.astype(jnp.int32)
    shifts = _lanes((2 * (np.arange(16) % 8)).astype(np.uint32), index.ndim)
    index = jnp.clip(index, 0, 3).astype(jnp.uint32) << shifts
    low, high = index[..., :8].sum(-1), index[..., 8:].sum(-1)
    words = [lax.bitcast_convert_type(v.astype(_F16), _U16) for v in (amin, amax)]
    words += [low.astype(_U16), high.astype(_U16)]
    out = jnp.moveaxis(jnp.stack(words, -1), -1, -2)  # [..., Hb, Wb, 4, C]
    *lead, hb, wb, _, c = out.shape
    return out.reshape(*lead, hb, wb * 4, c)


@defcommand(family="memory", shape=_lssc_decompress_shape, uses=NOTHING, differentiable=False)
def lssc_decompress(c, *, size=None, dtype="float16"):
    """NNC's COMPRESSION_LSSC_BACKWARD: words of :func:`lssc_compress` back to values.

    ``size``: the ``(H, W)`` compressed (default NNC's ``(4 * rows, width)``);
    ``dtype``: of the result (the values are halves, converted).

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> x = jnp.arange(16.0).reshape(1, 4, 4, 1)
    >>> y = ops.lssc_decompress(size=(4, 4), dtype="float32")(ops.lssc_compress()(x))
    >>> y[0, :, :, 0].tolist()[0]  # levels 0, 5, 10, 15
    [0.0, 0.0, 0.0, 5.0]
    """
    h, w = _lssc_size(Spec(c.shape, c.dtype), size)
    *lead, hb, w4, ch = c.shape
    n = len(lead)
    words = jnp.moveaxis(c.reshape(*lead, hb, w4 // 4, 4, ch), -2, -1)  # [..., Hb, Wb, C, 4]
    lo = lax.bitcast_convert_type(words[..., 0], _F16).astype(_F32)
    hi = lax.bitcast_convert_type(words[..., 1], _F16).astype(_F32)
    two_, three, _, _ = _constants()
    one = hi / three + lo * two_ / three
    two = hi * two_ / three + lo / three
    levels = jnp.stack([lo, one, two, hi], -1)
    packed = jnp.repeat(words[..., 2:].astype(jnp.int32), 8, axis=-1)
    index = (packed >> _lanes(2 * (np.arange(16) % 8), packed.ndim)) & 3
    values = _f16_toward_zero(jnp.take_along_axis(levels, index, -1))
    values = values.reshape(*lead, hb, w4 // 4, ch, 4, 4)
    values = jnp.transpose(values, (*range(n), n, n + 3, n + 1, n + 4, n + 2))
    values = values.reshape(*lead, hb * 4, w4, ch)[..., :h, :w, :]
    return values.astype(np.dtype(dtype))
