"""Attention family: scaled_dot_product_attention (NNC's SCALED_DOT_PRODUCT_ATTENTION).

Layout is NNC's: ``q [B, S, H, D]``, ``k [B, T, Hk, D]``, ``v [B, T, Hk, Dv]`` and the
output ``[B, S, H, Dv]``. ``Hk`` may divide ``H`` (grouped-query attention): query head
``h`` reads key/value head ``h // (H // Hk)``, as in NNC's
``lib/nnc/cmd/scaled_dot_product_attention/ccv_nnc_scaled_dot_product_attention_cpu_ref.c``.

The logits are ``scale * q.k`` plus an optional float mask; a bool mask (True =
attend) and ``is_causal`` drop keys. Causal masking is aligned bottom-right, as in
NNC: query ``i`` attends keys ``j <= i + T - S`` (the usual lower triangle when
``S == T``; with a KV cache, ``S = 1``, the query sees every key). A query that
attends no key at all gets zeros, as in NNC.

The backward is hand-written: it recomputes the softmax from ``q`` and ``k`` instead
of keeping the ``[B, H, S, T]`` probabilities alive.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from fnnc.core.command import Spec, Uses, defcommand
from fnnc.errors import DTypeError
from fnnc.ops._rules import fail, require_float, require_same_dtype, show, to_shape, unbroadcast


def _sdpa_shape(q, k, v, mask=None, *, scale, is_causal):
    name = "scaled_dot_product_attention"
    require_float(name, q, k, v)
    dtype = require_same_dtype(name, q, k, v)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        fail(
            f"{name}: q, k, v must be [B, S, H, D], [B, T, Hk, D], [B, T, Hk, Dv]; "
            f"got {show(q)}, {show(k)}, {show(v)}"
        )
    (b, s, h, d), (bk, t, hk, dk), (bv, tv, hv, _) = q.shape, k.shape, v.shape
    if not (b == bk == bv and d == dk and t == tv and hk == hv):
        fail(
            f"{name}: q [B, S, H, D], k [B, T, Hk, D], v [B, T, Hk, Dv] disagree: "
            f"q {show(q)}, k {show(k)}, v {show(v)}"
        )
    if hk == 0 or h % hk:
        fail(
            f"{name}: q has {h} heads but k and v have {hk}; the key/value heads must divide the "
            f"query heads (q {show(q)}, k {show(k)})"
        )
    if mask is not None:
        if mask.dtype != jnp.bool_ and mask.dtype != dtype:
            raise DTypeError(
                f"{name}: mask {show(mask)} must be bool (True = attend) or {dtype.name} (added)"
            )
        full = (b, h, s, t)
        if mask.ndim > 4 or any(n not in (1, f) for n, f in zip(mask.shape[::-1], full[::-1])):
            fail(f"{name}: mask {show(mask)} must broadcast to [B, H, S, T] = {list(full)}")
    return Spec((b, s, h, v.shape[-1]), q.dtype)


def _expand_heads(x, heads):
    """Repeats key/value heads so head ``h`` of the result is head ``h // r`` of ``x``."""
    return x if x.shape[2] == heads else jnp.repeat(x, heads // x.shape[2], axis=2)


def _probabilities(q, k, mask, scale, is_causal):
    """Attention probabilities ``[B, H, S, T]``; rows that attend nothing are zero."""
    (_, s, h, d), t = q.shape, k.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    logits = jnp.einsum("bshd,bthd->bhst", q, _expand_heads(k, h)) * jnp.asarray(scale, q.dtype)
    shape = logits.shape
    keep = None
    if mask is not None and mask.dtype == jnp.bool_:
        keep = to_shape(mask, shape)
    elif mask is not None:
        logits = logits + to_shape(mask, shape)
    if is_causal:
        rows = lax.broadcasted_iota(jnp.int32, shape, 2)
        cols = lax.broadcasted_iota(jnp.int32, shape, 3)
        causal = cols <= rows + (t - s)
        keep = causal if keep is None else keep & causal
    if keep is not None:
        logits = jnp.where(keep, logits, -jnp.inf)
    m = lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    e = jnp.exp(logits - jnp.where(jnp.isfinite(m), m, 0))
    total = jnp.sum(e, axis=-1, keepdims=True)
    return e / jnp.where(total == 0, 1, total)


@defcommand(family="attention", shape=_sdpa_shape, uses=Uses(inputs=None, outputs=(0,)))
def scaled_dot_product_attention(q, k, v, mask=None, *, scale=None, is_causal=False):
    """``softmax(scale * q kᵀ + mask) v`` per head; ``scale=None`` means ``1 / sqrt(D)``.

    ``mask`` broadcasts to ``[B, H, S, T]``: bool keeps the True keys, float is added to
    the logits. See the module docstring for layouts and causal alignment.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> q = jnp.ones((2, 5, 4, 8))
    >>> ops.scaled_dot_product_attention(is_causal=True)(q, q, q).shape
    (2, 5, 4, 8)
    """
    p = _probabilities(q, k, mask, scale, is_causal)
    return jnp.einsum("bhst,bthd->bshd", p, _expand_heads(v, q.shape[2]))


def _fold_heads(g, heads):
    """Sums the gradient of repeated heads back onto the ``heads`` key/value heads."""
    b, t, h, d = g.shape
    return g if h == heads else jnp.sum(jnp.reshape(g, (b, t, heads, h // heads, d)), axis=3)


def _sdpa_grads(go, q, k, v, o, m, *, scale, is_causal):
    h, d = q.shape[2], q.shape[3]
    scale = 1 / math.sqrt(d) if scale is None else scale
    p = _probabilities(q, k, m, scale, is_causal)
    gv = jnp.einsum("bhst,bshd->bthd", p, go)
    dp = jnp.einsum("bshd,bthd->bhst", go, _expand_heads(v, h))
    # sum_t p * dp == sum_d go * o: the softmax backward without the [S, T] product.
    delta = jnp.transpose(jnp.sum(go * o, axis=-1), (0, 2, 1))[..., None]
    ds = p * (dp - delta)
    gq = jnp.einsum("bhst,bthd->bshd", ds, _expand_heads(k, h)) * jnp.asarray(scale, q.dtype)
    gk = jnp.einsum("bhst,bshd->bthd", ds, q) * jnp.asarray(scale, q.dtype)
    result = (gq, _fold_heads(gk, k.shape[2]), _fold_heads(gv, v.shape[2]))
    if m is None:
        return result
    return (*result, None if m.dtype == jnp.bool_ else unbroadcast(ds, m.shape))


@scaled_dot_product_attention.backward
def _sdpa_backward(grads, inputs, outputs, *, scale, is_causal):
    (go,), (q, k, v, *mask), (o,) = grads, inputs, outputs
    return _sdpa_grads(go, q, k, v, o, mask[0] if mask else None, scale=scale, is_causal=is_causal)
