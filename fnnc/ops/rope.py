"""Rotary-embedding family: rotate_half, cmul, rmsnorm_cmul (NNC's ROTATE_HALF, CMUL and
RMSNORM_CMUL).

Two layouts of RoPE exist and NNC has a command for each:

* *rotate-half* (GPT-NeoX, Llama in Hugging Face): ``x * cos + rotate(x) * sin`` where
  ``rotate`` swaps the halves of the last axis. NNC's ``rotate_half`` only swaps them
  (``[1, 2, 3, 4] -> [3, 4, 1, 2]``, its test ``rotate_half.tests.c``), the minus sign
  of ``[-x2, x1]`` living in the sine table; the traced JAX idiom ``concatenate([-x2,
  x1])`` becomes ``rotate_half`` times a constant sign row.
* *interleaved* (Meta's Llama, complex frequencies): ``cmul`` multiplies pairs
  ``(re, im)`` along the last axis as complex numbers, with broadcasting.

All three are differentiable. NNC's rotate_half backward is rotate_half of the gradient
(the swap is its own inverse). NNC's CMUL backward multiplies the gradient by the other
operand; the derivative of a complex product for a real loss multiplies by its
*conjugate*, which is what this backward does (equal to ``jax.vjp``). rmsnorm_cmul is
forward-only in NNC; here its backward is derived from ``jax.vjp`` of the reference.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from fnnc.core.command import NOTHING, Spec, Uses, defcommand
from fnnc.core.dtypes import at_least_float32
from fnnc.ops._rules import (
    broadcast_shape,
    fail,
    norm_axes,
    require_float,
    require_norm_scale,
    require_same_dtype,
    show,
    to_shape,
    unbroadcast,
)


def _rotate_rule(x: Spec) -> Spec:
    require_float("rotate_half", x)
    if x.ndim == 0 or x.shape[-1] % 2:
        fail(f"rotate_half: the last axis must have an even size, got {show(x)}")
    return Spec(tuple(x.shape), x.dtype)


@defcommand(family="rope", shape=_rotate_rule, uses=NOTHING)
def rotate_half(x):
    """The two halves of the last axis swapped: ``[x1, x2] -> [x2, x1]``.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.rotate_half()(jnp.array([1.0, 2.0, 3.0, 4.0])).tolist()
    [3.0, 4.0, 1.0, 2.0]
    """
    half = x.shape[-1] // 2
    return jnp.concatenate([x[..., half:], x[..., :half]], axis=-1)


@rotate_half.backward
def _rotate_half_backward(grads, inputs, outputs):
    return (rotate_half.definition.forward(grads[0]),)


def _cmul_rule(a: Spec, b: Spec, *, conjugate: bool = False) -> Spec:
    require_float("cmul", a, b)
    dtype = require_same_dtype("cmul", a, b)
    shape = broadcast_shape("cmul", a.shape, b.shape)
    if not shape or shape[-1] % 2 or a.shape[-1] != shape[-1] or b.shape[-1] != shape[-1]:
        fail(
            f"cmul: both inputs need the same even-sized last axis of (re, im) pairs, got "
            f"{show(a)} and {show(b)}"
        )
    return Spec(shape, dtype)


def _pairs(x, shape):
    x = to_shape(x, shape)
    return x[..., 0::2], x[..., 1::2]


def _interleave(re, im):
    return jnp.stack([re, im], axis=-1).reshape(*re.shape[:-1], re.shape[-1] * 2)


def _cmul(a, b, shape, conjugate_b=False):
    """The complex product in float32 at least, rounded to ``a``'s type once: in
    bfloat16 each of ``a0 b0`` and ``a1 b1`` was rounded before their difference
    cancelled (RoPE's real parts up to 740 half-ulps off)."""
    dtype, wide = a.dtype, at_least_float32(a.dtype)
    a0, a1 = _pairs(a.astype(wide), shape)
    b0, b1 = _pairs(b.astype(wide), shape)
    if conjugate_b:
        b1 = -b1
    return _interleave(a0 * b0 - a1 * b1, a0 * b1 + a1 * b0).astype(dtype)


def _complex_ones(inputs, outputs, **params):
    """NNC's null output gradient of CMUL: complex ones, ``(1, 0)`` pairs."""
    a, b = inputs
    shape = jnp.broadcast_shapes(a.shape, b.shape)
    pair = jnp.asarray([1, 0], jnp.result_type(a.dtype, b.dtype))
    return (jnp.broadcast_to(jnp.tile(pair, shape[-1] // 2), shape),)


@defcommand(
    family="rope",
    shape=_cmul_rule,
    uses=Uses(inputs=(0, 1)),
    null_gradient=_complex_ones,
    commutative=lambda cmd: not cmd.kwargs.get("conjugate", False),  # a * b; not a * conj(b)
)
def cmul(a, b, *, conjugate=False):
    """Complex product of interleaved pairs ``(re, im)`` along the last axis
    (broadcasting the other axes): RoPE with complex frequencies. ``conjugate=True``
    multiplies by ``b``'s conjugate, ``a * conj(b)`` (NNC's ``cmul.conjugate``)."""
    return _cmul(a, b, broadcast_shape("cmul", a.shape, b.shape), conjugate_b=conjugate)


@cmul.backward
def _cmul_backward(grads, inputs, outputs, *, conjugate=False):
    (g,), (a, b) = grads, inputs
    # Products and their sums over broadcast axes in float32 at least, rounded once.
    wide = at_least_float32(g.dtype)
    gw, aw, bw = g.astype(wide), a.astype(wide), b.astype(wide)
    if conjugate:  # z = a conj(b): dA = g b, dB = a conj(g)
        da, db = _cmul(gw, bw, g.shape), _cmul(aw, gw, g.shape, conjugate_b=True)
    else:
        da, db = _cmul(gw, bw, g.shape, True), _cmul(gw, aw, g.shape, conjugate_b=True)
    return unbroadcast(da, a.shape).astype(a.dtype), unbroadcast(db, b.shape).astype(b.dtype)


def _rmsnorm_cmul_rule(x: Spec, freqs: Spec, scale: Spec | None = None, *, axes, epsilon):
    require_float("rmsnorm_cmul", x, freqs)
    require_norm_scale("rmsnorm_cmul", x, scale, norm_axes("rmsnorm_cmul", axes, x.ndim))
    out = _cmul_rule(x, freqs)
    if out.shape != tuple(x.shape):
        fail(f"rmsnorm_cmul: freqs {show(freqs)} must broadcast to x {show(x)}")
    return out


@defcommand(family="rope", shape=_rmsnorm_cmul_rule)
def rmsnorm_cmul(x, freqs, scale=None, *, axes=(-1,), epsilon=1e-6):
    """RMS normalisation of ``x`` over ``axes`` (times ``scale``, NNC's
    ``elementwise_affine``, which broadcasts to x by NumPy rules) followed by ``cmul``
    with ``freqs``: query/key normalisation and interleaved RoPE in one command."""
    ax = norm_axes("rmsnorm_cmul", axes, x.ndim)
    wide = at_least_float32(x.dtype)
    xf = x.astype(wide)
    y = xf * lax.rsqrt(jnp.mean(xf * xf, axis=ax, keepdims=True) + epsilon)
    if scale is not None:
        y = y * to_shape(scale.astype(wide), x.shape)
    return _cmul(y, freqs, tuple(x.shape)).astype(x.dtype)
