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

With ``weights`` (and optionally ``bias``), NNC's fused output projection ("unify
head") follows: the heads are joined, ``[B, S, H * Dv]``, and projected,
``y = joined @ weights^T + bias``; the command then returns ``(y, o)``, NNC's first and
third outputs (its softmax statistics are not kept). NNC's input order is kept: ``q, k,
v, mask, weights, bias``; in an eager call ``None`` leaves the mask out
(``cmd(q, k, v, None, w, b)``); a graph node has no gap, so there a mask that changes
nothing (a float zero, shape ``[]``) stands in.

The backward is hand-written: it recomputes the softmax from ``q`` and ``k`` instead
of keeping the ``[B, H, S, T]`` probabilities alive.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import Spec, Uses, defcommand
from fnnc.core.dtypes import at_least_float32
from fnnc.errors import CommandError, DTypeError
from fnnc.ops._rules import fail, require_float, require_same_dtype, show, to_shape, unbroadcast


def finite_real(value: Any) -> bool:
    """Whether ``value`` is a finite real number, not a bool (an int too large for a
    float, ``10**400``, is not finite)."""
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_scale(name: str, scale) -> None:
    """Raises unless ``scale`` is ``None`` or a finite real number (not a bool): the
    ``None`` default let any value through, so ``scale="x"`` failed inside ``jnp.asarray``
    and ``scale=nan`` gave numbers."""
    if scale is not None and not finite_real(scale):
        raise CommandError(
            f"{name}: scale is {scale!r:.40} ({type(scale).__name__}); expected a finite "
            "number (the factor on q kᵀ) or None for 1 / sqrt(D)"
        )


def _sdpa_shape(q, k, v, mask=None, weights=None, bias=None, *, scale, is_causal):
    name = "scaled_dot_product_attention"
    check_scale(name, scale)
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
    o = Spec((b, s, h, v.shape[-1]), q.dtype)
    if weights is None and bias is None:
        return o
    return Spec((b, s, _projection(q, v, weights, bias)), q.dtype), o


def _projection(q, v, weights, bias) -> int:
    """Checks the unify-head weights ``[E, H * Dv]`` and bias ``[E]``; returns ``E``."""
    name = "scaled_dot_product_attention"
    joined = q.shape[2] * v.shape[3]
    if weights is None:
        fail(
            f"{name}: bias {show(bias)} without weights; the output projection's bias needs "
            "its weights (input 4), as in NNC"
        )
    require_same_dtype(name, q, *(t for t in (weights, bias) if t is not None))
    if weights.ndim != 2 or weights.shape[1] != joined:
        fail(
            f"{name}: weights {show(weights)} must be [E, H * Dv] = [E, {joined}] to project "
            f"the joined heads of q {show(q)} and v {show(v)} (NNC's is square, E = {joined})"
        )
    if bias is not None and tuple(bias.shape) != (weights.shape[0],):
        fail(f"{name}: bias {show(bias)} must be [{weights.shape[0]}], one per output feature")
    return weights.shape[0]


def default_scale(d: int) -> float:
    """``1 / sqrt(D)``, the scale ``scale=None`` means; ``1`` for an empty head (``D = 0``:
    every logit is 0 whatever the scale, and ``1 / sqrt(0)`` was a ZeroDivisionError)."""
    return 1 / math.sqrt(d) if d else 1.0


def _expand_heads(x, heads):
    """Repeats key/value heads so head ``h`` of the result is head ``h // r`` of ``x``."""
    return x if x.shape[2] == heads else jnp.repeat(x, heads // x.shape[2], axis=2)


def _probabilities(q, k, mask, scale, is_causal, dtype=None):
    """Attention probabilities ``[B, H, S, T]``; rows that attend nothing are zero.
    ``dtype``: the type the logits and the softmax are computed in (default q's)."""
    (_, s, h, d), t = q.shape, k.shape[1]
    scale = default_scale(d) if scale is None else scale
    dtype = q.dtype if dtype is None else dtype
    logits = jnp.einsum(
        "bshd,bthd->bhst", q, _expand_heads(k, h), preferred_element_type=dtype
    ) * jnp.asarray(scale, dtype)
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
    # initial: with no keys at all (T = 0) every row attends nothing, and gets zeros
    m = lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True, initial=-jnp.inf))
    e = jnp.exp(logits - jnp.where(jnp.isfinite(m), m, 0))
    total = jnp.sum(e, axis=-1, keepdims=True)
    return e / jnp.where(total == 0, 1, total)


@defcommand(family="attention", shape=_sdpa_shape, uses=Uses(inputs=None, outputs=(0, 1)))
def scaled_dot_product_attention(
    q, k, v, mask=None, weights=None, bias=None, *, scale=None, is_causal=False
):
    """``softmax(scale * q kᵀ + mask) v`` per head; ``scale=None`` means ``1 / sqrt(D)``.

    ``mask`` broadcasts to ``[B, H, S, T]``: bool keeps the True keys, float is added to
    the logits. With ``weights [E, H * Dv]`` (and ``bias [E]``) the joined heads are
    projected too and the result is ``(y [B, S, E], o [B, S, H, Dv])``. See the module
    docstring for layouts, causal alignment and the projection.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> q = jnp.ones((2, 5, 4, 8))
    >>> ops.scaled_dot_product_attention(is_causal=True)(q, q, q).shape
    (2, 5, 4, 8)
    >>> y, o = ops.scaled_dot_product_attention()(q, q, q, None, jnp.ones((6, 32)))
    >>> y.shape
    (2, 5, 6)
    """
    o = _heads(q, k, v, mask, scale, is_causal)
    if weights is None:
        return o
    b, s, h, dv = o.shape
    # 16-bit: the product and its bias in float32, rounded once (as NNC's loop sums
    # bias + products in float); rounding the product before the bias added a second
    wide = at_least_float32(q.dtype)
    y = jnp.einsum(
        "bsf,ef->bse", jnp.reshape(o, (b, s, h * dv)), weights, preferred_element_type=wide
    )
    y = y if bias is None else y + to_shape(bias.astype(wide), y.shape)
    return y.astype(q.dtype), o


def _heads(q, k, v, mask, scale, is_causal):
    """The attention of every head, ``[B, S, H, Dv]`` (before any head-joining gemm)."""
    wide = at_least_float32(q.dtype)  # 16-bit: the softmax in float32
    p = _probabilities(q, k, mask, scale, is_causal, wide).astype(q.dtype)
    return jnp.einsum("bhst,bthd->bshd", p, _expand_heads(v, q.shape[2]))


def _fold_heads(g, heads):
    """Sums the gradient of repeated heads back onto the ``heads`` key/value heads."""
    b, t, h, d = g.shape
    return g if h == heads else jnp.sum(jnp.reshape(g, (b, t, heads, h // heads, d)), axis=3)


def _sdpa_grads(go, q, k, v, o, m, *, scale, is_causal):
    """Gradients of q, k, v and the mask (``None`` unless a float mask) from ``go``."""
    h, d = q.shape[2], q.shape[3]
    scale = default_scale(d) if scale is None else scale
    # For 16-bit inputs the softmax and dp - delta, which cancels, are taken in float32
    # (in 16 bits float16's dq missed NNC's 1e-3 by 2x), and ds is rounded once.
    wide = at_least_float32(q.dtype)
    p = _probabilities(q, k, m, scale, is_causal, wide)
    gv = jnp.einsum("bhst,bshd->bthd", p.astype(q.dtype), go)
    dp = jnp.einsum("bshd,bthd->bhst", go, _expand_heads(v, h), preferred_element_type=wide)
    # sum_t p * dp == sum_d go * o: the softmax backward without the [S, T] product.
    delta = jnp.sum(go.astype(wide) * o.astype(wide), axis=-1)
    delta = jnp.transpose(delta, (0, 2, 1))[..., None]
    ds = (p * (dp - delta)).astype(q.dtype)
    gq = jnp.einsum("bhst,bthd->bshd", ds, _expand_heads(k, h), preferred_element_type=wide)
    gk = jnp.einsum("bhst,bshd->bthd", ds, q, preferred_element_type=wide)
    gq = (gq * jnp.asarray(scale, wide)).astype(q.dtype)  # scaled before the rounding
    gk = (gk * jnp.asarray(scale, wide)).astype(q.dtype)
    gm = None if m is None or m.dtype == jnp.bool_ else unbroadcast(ds, m.shape)
    return gq, _fold_heads(gk, k.shape[2]), _fold_heads(gv, v.shape[2]), gm


@scaled_dot_product_attention.backward
def _sdpa_backward(grads, inputs, outputs, *, scale, is_causal):
    q, k, v, mask, weights = (*inputs, None, None)[:5]
    o = outputs[-1]
    if o is None or isinstance(o, (Spec, jax.ShapeDtypeStruct)):  # not given: recomputed
        o = _heads(q, k, v, mask, scale, is_causal)
    if weights is None:
        (go,) = grads
        extra: tuple = ()
    else:
        gy, go = grads
        b, s, h, dv = o.shape
        joined = jnp.reshape(o, (b, s, h * dv))
        gw = gb = None
        if gy is not None:  # 16-bit: summed in float32, rounded once
            wide = at_least_float32(q.dtype)
            g_joined = jnp.einsum("bse,ef->bsf", gy, weights, preferred_element_type=wide)
            g_joined = jnp.reshape(g_joined, o.shape)
            go = (g_joined if go is None else go.astype(wide) + g_joined).astype(o.dtype)
            gw = jnp.einsum("bse,bsf->ef", gy, joined, preferred_element_type=wide)
            gw = gw.astype(weights.dtype)
            gb = jnp.sum(gy, axis=(0, 1))
        extra = (gw, gb)
    if go is None:
        go = jnp.zeros(o.shape, o.dtype)
    result = (*_sdpa_grads(go, q, k, v, o, mask, scale=scale, is_causal=is_causal), *extra)
    return result[: len(inputs)]
