"""Quantisation family: conform_data_format, walsh_hadamard_transform (NNC's
CONFORM_DATA_FORMAT and WALSH_HADAMARD_TRANSFORM).

``conform_data_format`` is FP8-E4M3 *fake* quantisation as NNC does it for a KV cache:
along the last axis, every block of 64 values before a ``preserved_tail`` (left
untouched, e.g. the RoPE part of a head) is scaled by a power of two ``2^ceil(log2(amax
/ 448))`` (``amax`` at least ``1e-4``), rounded to the nearest E4M3 value (ties to
even; ``jnp.float8_e4m3fn``'s rounding) and scaled back. Its backward is NNC's
straight-through copy of the gradient. Unlike NNC, which refuses a block holding
a non-finite value at run time, a NaN or inf here turns its block's results into NaN.

``walsh_hadamard_transform`` is the unnormalised fast Walsh-Hadamard transform of the
last axis (a power of two) times ``scale``; with ``scale = 1/sqrt(n)`` it is its own
inverse (QuaRot-style rotations before quantisation). The transform matrix is
symmetric, so the backward is the same transform of the gradient, as in NNC.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from fnnc.core.command import NOTHING, Spec, defcommand
from fnnc.core.dtypes import at_least_float32
from fnnc.errors import CommandError
from fnnc.ops._rules import fail, require_choice, require_float, show

BLOCK = 64
E4M3_MAX = 448.0


def _conform_rule(x: Spec, *, datatype, preserved_tail) -> Spec:
    require_float("conform_data_format", x)
    require_choice("conform_data_format", "datatype", datatype, ("fp8_e4m3",))
    if x.ndim == 0:
        fail(f"conform_data_format: needs rows along a last axis, got {show(x)}")
    head = x.shape[-1]
    if not 0 <= preserved_tail <= head or (head - preserved_tail) % BLOCK:
        raise CommandError(
            f"conform_data_format: the last axis ({head}) minus preserved_tail "
            f"({preserved_tail}) must be a non-negative multiple of {BLOCK}"
        )
    return Spec(tuple(x.shape), x.dtype)


def _block_scale(amax):
    """NNC's ``ldexpf(1, ceilf(log2f(amax / 448)))``, exactly a power of two.

    XLA's ``exp2`` and ``log2`` are approximations (on CPU ``exp2(-15)`` is not ``2**-15``
    and ``log2(2**-13)`` is ``-12.999999``), so ``amax / 448 = m 2**e`` (``m`` in [1, 2))
    is split exactly by ``frexp``, ``log2f``'s float32 rounding of ``e + log2(m)`` is
    replayed as a float32 sum (``log1p`` is exact enough near ``m = 1``, where that
    rounding can fall back onto ``e``), and the power of two is made by ``ldexp``.
    """
    ratio = amax / E4M3_MAX
    frac, exp = jnp.frexp(ratio)  # ratio = frac 2**exp, frac in [0.5, 1)
    e = exp - 1
    log2 = e.astype(jnp.float32) + jnp.log1p(2 * frac - 1) * (1 / math.log(2))
    scale = jnp.ldexp(jnp.float32(1), jnp.ceil(log2).astype(jnp.int32))
    return jnp.where(jnp.isfinite(amax), scale, jnp.nan)  # a NaN or inf: the block is NaN


@defcommand(family="quantize", shape=_conform_rule, uses=NOTHING)
def conform_data_format(x, *, datatype="fp8_e4m3", preserved_tail=0):
    """``x`` rounded to FP8-E4M3 in blocks of 64 with a power-of-two scale per block,
    returned in its own dtype; the last ``preserved_tail`` entries of each row kept."""
    head = x.shape[-1]
    prefix = head - preserved_tail
    if prefix == 0:
        return x
    wide = x[..., :prefix].astype(jnp.float32)
    blocks = wide.reshape(*x.shape[:-1], prefix // BLOCK, BLOCK)
    amax = jnp.maximum(jnp.max(jnp.abs(blocks), axis=-1, keepdims=True), 1e-4)
    scale = _block_scale(amax)
    normal = jnp.clip(blocks / scale, -E4M3_MAX, E4M3_MAX)
    # The barrier keeps the rounding: XLA:GPU drops a float32 -> fp8 -> float32 round trip
    # as excess precision (xla_allow_excess_precision), which left values unquantised.
    e4m3 = lax.optimization_barrier(normal.astype(jnp.float8_e4m3fn))
    rounded = e4m3.astype(jnp.float32) * scale
    head_part = rounded.reshape(*x.shape[:-1], prefix).astype(x.dtype)
    conformed = jnp.concatenate([head_part, x[..., prefix:]], axis=-1)
    # Straight-through: the value is the conformed one, the derivative the identity's.
    return x + lax.stop_gradient(conformed - x)


@conform_data_format.backward
def _conform_data_format_backward(grads, inputs, outputs, *, datatype, preserved_tail):
    return (grads[0],)


def _wht_rule(x: Spec, *, scale) -> Spec:
    require_float("walsh_hadamard_transform", x)
    n = x.shape[-1] if x.ndim else 0
    if n <= 0 or n & (n - 1):
        fail(f"walsh_hadamard_transform: the last axis must be a power of two, got {show(x)}")
    return Spec(tuple(x.shape), x.dtype)


def _transform(x, scale):
    """The transform in float32 at least, rounded to x's type once: each of the log2(n)
    butterfly stages had rounded a 16-bit x (bfloat16 at n = 1024: 3.4x the rms error
    of one rounding)."""
    dtype, x = x.dtype, x.astype(at_least_float32(x.dtype))
    n = x.shape[-1]
    lead = x.shape[:-1]
    h = 1
    while h < n:
        pairs = x.reshape(*lead, n // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        x = jnp.stack([a + b, a - b], axis=-2).reshape(*lead, n)
        h *= 2
    return (x * jnp.asarray(scale, x.dtype)).astype(dtype)


@defcommand(family="quantize", shape=_wht_rule, uses=NOTHING)
def walsh_hadamard_transform(x, *, scale=1.0):
    """The fast Walsh-Hadamard transform of the last axis (natural order) times
    ``scale``; a 16-bit x is transformed in float32 and rounded once.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.walsh_hadamard_transform()(jnp.array([1.0, 0.0, 0.0, 0.0])).tolist()
    [1.0, 1.0, 1.0, 1.0]
    """
    return _transform(x, scale)


@walsh_hadamard_transform.backward
def _walsh_hadamard_transform_backward(grads, inputs, outputs, *, scale):
    return (_transform(grads[0], scale),)
