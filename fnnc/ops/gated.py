"""Gated-unit family: swish_mul, swiglu, segmented_swiglu, rmsnorm_gated (NNC's
SWISH_MUL, SWIGLU, SEGMENTED_SWIGLU and RMSNORM_GATED).

* ``swish_mul(a, b)`` is the SwiGLU product ``scale * a * swish(b, beta)`` of a value
  ``a`` and a gate ``b`` of one shape; with ``clamp > 0`` the gate is clamped above at
  ``clamp`` and the value to ``[-clamp, clamp]`` (gpt-oss), and an optional ``weight``
  scales contiguous blocks of rows (NNC's weighted variant, one weight per
  ``size(a) / size(weight)`` elements: a router probability per token).
* ``swiglu(a, gate_w, up_w)`` is the whole SwiGLU projection ``swish(a gate_w^T) *
  (a up_w^T)``, weights ``[n, k]`` as NNC stores them.
* ``segmented_swiglu`` is that projection for mixture-of-experts rows grouped by expert:
  segment ``s`` holds ``counts[s]`` consecutive rows run by expert ``indices[s]``, each
  row scaled by its ``route_weight``.
* ``rmsnorm_gated(x, gate)`` is ``rms_norm(x) * scale * swish(gate)`` (Gated DeltaNet's
  output norm).

NNC's swiglu, segmented_swiglu and rmsnorm_gated are forward-only, and its swish_mul
backward leaves the clamp and the weight out. Here all four are differentiable with the
backward derived from ``jax.vjp`` of the reference (exact with clamps and weights),
because these commands sit inside the layers that train (SwiGLU MLPs, MoE experts).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from fnnc.core.command import Spec, defcommand
from fnnc.core.dtypes import at_least_float32
from fnnc.errors import DTypeError
from fnnc.ops._rules import (
    fail,
    norm_axes,
    require_float,
    require_norm_scale,
    require_same_dtype,
    show,
    to_shape,
)


def _clamped(value, gate, clamp):
    if clamp > 0:
        gate = jnp.minimum(gate, jnp.asarray(clamp, gate.dtype))
        value = jnp.clip(value, -clamp, clamp)
    return value, gate


def _swish_mul_rule(a: Spec, b: Spec, weight: Spec | None = None, *, beta, scale, clamp) -> Spec:
    require_float("swish_mul", a, b)
    dtype = require_same_dtype("swish_mul", a, b)
    if tuple(a.shape) != tuple(b.shape):
        fail(f"swish_mul: value and gate must have one shape, got {show(a)} and {show(b)}")
    if weight is not None:
        wsize = _count(weight.shape)
        if wsize == 0 or _count(a.shape) % wsize:
            fail(f"swish_mul: weight {show(weight)} must divide {show(a)} into equal blocks")
    return Spec(tuple(a.shape), dtype)


def _count(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@defcommand(family="gated", shape=_swish_mul_rule)
def swish_mul(a, b, weight=None, *, beta=1.0, scale=1.0, clamp=0.0):
    """``scale * a * b * sigmoid(beta * b)`` (times ``weight`` per block of rows); a
    16-bit product is computed in float32 and rounded once."""
    dtype, wide = a.dtype, at_least_float32(a.dtype)
    value, gate = _clamped(a.astype(wide), b.astype(wide), clamp)
    y = jnp.asarray(scale, wide) * value * gate * jax.nn.sigmoid(gate * jnp.asarray(beta, wide))
    if weight is not None:
        blocks = y.reshape(_count(weight.shape), -1) * weight.reshape(-1, 1).astype(wide)
        y = blocks.reshape(a.shape)
    return y.astype(dtype)


def _swiglu_rule(a: Spec, gate_w: Spec, up_w: Spec, *, clamp) -> Spec:
    require_float("swiglu", a, gate_w, up_w)
    dtype = require_same_dtype("swiglu", a, gate_w, up_w)
    if a.ndim < 1 or gate_w.ndim != 2 or tuple(up_w.shape) != tuple(gate_w.shape):
        fail(
            f"swiglu: expected a [..., k] and two weights [n, k], got {show(a)}, "
            f"{show(gate_w)}, {show(up_w)}"
        )
    if gate_w.shape[1] != a.shape[-1]:
        fail(f"swiglu: weights {show(gate_w)} must have k = {a.shape[-1]} columns (from a)")
    return Spec((*a.shape[:-1], gate_w.shape[0]), dtype)


def _project(a, gate_w, up_w, clamp):
    # Products kept in float32 at least (a 16-bit GEMM's operands stay 16-bit) and the
    # SwiGLU rounded once: bfloat16 rounded gate, up and each product (2.4x the error).
    wide = at_least_float32(a.dtype)
    gate = jnp.einsum("...k,nk->...n", a, gate_w, preferred_element_type=wide)
    up = jnp.einsum("...k,nk->...n", a, up_w, preferred_element_type=wide)
    up, gate = _clamped(up, gate, clamp)
    return (up * gate * jax.nn.sigmoid(gate)).astype(a.dtype)


@defcommand(family="gated", shape=_swiglu_rule)
def swiglu(a, gate_w, up_w, *, clamp=0.0):
    """``swish(a @ gate_w.T) * (a @ up_w.T)``; ``clamp > 0`` clamps the gate above and
    the up projection to ``[-clamp, clamp]`` first."""
    return _project(a, gate_w, up_w, clamp)


def _segmented_rule(a, indices, counts, gate_w, up_w, route_weight, *, clamp) -> Spec:
    require_float("segmented_swiglu", a, gate_w, up_w, route_weight)
    dtype = require_same_dtype("segmented_swiglu", a, gate_w, up_w, route_weight)
    for name, s in (("indices", indices), ("counts", counts)):
        if s.dtype != jnp.int32 or s.ndim != 1:
            raise DTypeError(f"segmented_swiglu: {name} must be int32 [segments], got {show(s)}")
    if indices.shape != counts.shape:
        fail(f"segmented_swiglu: indices {show(indices)} and counts {show(counts)} differ")
    if gate_w.ndim != 3 or tuple(up_w.shape) != tuple(gate_w.shape):
        fail(f"segmented_swiglu: weights must be [experts, n, k], got {show(gate_w)}, {show(up_w)}")
    rows = _count(route_weight.shape)
    if a.ndim != 2 or a.shape[1] != gate_w.shape[2] or a.shape[0] not in (1, rows):
        fail(
            f"segmented_swiglu: a must be [{rows} or 1, {gate_w.shape[2]}] (rows of "
            f"route_weight {show(route_weight)}), got {show(a)}"
        )
    return Spec((rows, gate_w.shape[1]), dtype)


@defcommand(family="gated", shape=_segmented_rule)
def segmented_swiglu(a, indices, counts, gate_w, up_w, route_weight, *, clamp=0.0):
    """SwiGLU of row ``r`` with the weights of expert ``indices[s]`` for the segment
    ``s`` holding it (``counts[s]`` consecutive rows each), times ``route_weight[r]``.
    Rows past ``sum(counts)`` give zeros (NNC rejects such inputs at run time).

    Each projection is one grouped product (``jax.lax.ragged_dot`` over the segments'
    weights, as :func:`~fnnc.ops.segmented_gemm`), never a copy of an expert's
    ``[n, k]`` weights per row; 16-bit operands give float32 products, and the SwiGLU
    is rounded once (as :func:`swiglu`)."""
    rows = _count(route_weight.shape)
    counts = jnp.maximum(counts, 0)
    ends = jnp.cumsum(counts)
    segment = jnp.searchsorted(ends, jnp.arange(rows, dtype=ends.dtype), side="right")
    covered = segment < counts.shape[0]
    picked = jnp.clip(indices, 0, gate_w.shape[0] - 1)
    x = to_shape(a, (rows, a.shape[1]))
    wide = at_least_float32(a.dtype)  # as swiglu: 16-bit operands, one rounding at the end

    def project(w):  # [experts, n, k] -> [rows, n]
        w = jnp.swapaxes(jnp.take(w, picked, axis=0), 1, 2)
        return lax.ragged_dot(x, w, counts, preferred_element_type=wide)

    up, gate = _clamped(project(up_w), project(gate_w), clamp)
    y = route_weight.reshape(rows, 1).astype(wide) * up * gate * jax.nn.sigmoid(gate)
    return jnp.where(covered[:, None], y, jnp.zeros((), y.dtype)).astype(a.dtype)


def _rmsnorm_gated_rule(x: Spec, gate: Spec, scale: Spec | None = None, *, axes, epsilon) -> Spec:
    require_float("rmsnorm_gated", x, gate)
    require_norm_scale("rmsnorm_gated", x, scale, norm_axes("rmsnorm_gated", axes, x.ndim))
    if tuple(gate.shape) != tuple(x.shape):
        fail(f"rmsnorm_gated: gate must be shaped like x {show(x)}, got {show(gate)}")
    return Spec(tuple(x.shape), x.dtype)


@defcommand(family="gated", shape=_rmsnorm_gated_rule)
def rmsnorm_gated(x, gate, scale=None, *, axes=(-1,), epsilon=1e-6):
    """``x / sqrt(mean(x^2) + epsilon) * scale * swish(gate)``, the mean over ``axes``
    (``scale`` broadcasts to x by NumPy rules, as NNC's of x's rank does); computed in
    float32 at least (a 16-bit square overflows past 256), cast back."""
    ax = norm_axes("rmsnorm_gated", axes, x.ndim)
    dtype, wide = x.dtype, at_least_float32(x.dtype)
    x, gate = x.astype(wide), gate.astype(wide)
    y = x * lax.rsqrt(jnp.mean(x * x, axis=ax, keepdims=True) + epsilon)
    if scale is not None:
        y = y * to_shape(scale.astype(wide), x.shape)
    return (y * gate * jax.nn.sigmoid(gate)).astype(dtype)
