"""Recurrent mixing: gated_delta (Gated DeltaNet) and hyper_connection (manifold-
constrained hyper-connections), NNC's GATED_DELTA and HYPER_CONNECTION (liuliu/ccv
``lib/nnc/cmd/gated_delta``, ``lib/nnc/cmd/hyper_connection``).

* ``gated_delta(q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], log_decay, beta [B, T, Hv],
  state [B, Hv, Dv, Dk])`` returns ``(y [B, T, Hv, Dv], state_out)``. Value head
  ``hv`` reads key head ``hv // (Hv / Hk)``; per step ``S = decay * S``,
  ``S = S + beta (v - S k) kᵀ``, ``y = S q``, with ``decay = exp(log_decay)`` (or
  ``log_decay`` itself when ``log_decay=False``). One ``lax.scan`` over time.
  ``q``, ``k``, ``v`` share one float type; ``log_decay``, ``beta`` and ``state`` are
  that type or float32 (NNC's 16-bit form: 16-bit ``q``/``k``/``v``, float32 decay and
  state). The recurrence runs in float32 at least (a 16-bit state rounded every step
  drifts ~5x further from the exact one); ``y`` comes back in ``v``'s type and the
  state in ``state``'s.
* ``hyper_connection`` has NNC's two forms, picked by ``mode``:
  ``"split"``: ``(mix [..., 2n + n²], scale [3], base [2n + n²])`` gives
  ``pre = σ(mix scale₀ + base) + ε``, ``post = 2σ(·)`` ``[..., n]`` and ``comb``
  ``[..., n²]``: a row softmax plus ε made doubly stochastic by
  ``sinkhorn_iterations`` column/row normalisations; with a fourth input
  ``residual [..., n, D]`` the outputs are ``(post, comb, Σᵢ preᵢ residualᵢ)``.
  ``"expand"``: ``(block [..., D], residual [..., n, D], post [..., n],
  comb [..., n²] or [..., n, n])`` gives ``out[i] = block post[i] + Σⱼ comb[j, i] residual[j]``.

Both compute 16-bit inputs in float32 and round the outputs once (NNC runs them in
float32 only); a bfloat16 Sinkhorn left comb's sums 1.5-2.5x further from exact.
NNC runs both forward only; fnnc differentiates them from ``jax.vjp`` of the
reference (both are smooth), so a Gated DeltaNet or mHC block trains.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import Spec, defcommand
from fnnc.core.dtypes import at_least_float32
from fnnc.errors import CommandError, DTypeError
from fnnc.ops._rules import fail, require_float, require_same_dtype, show


def _gated_delta_shape(q, k, v, log_decay, beta, state, *, log_decay_input, state_checkpoint_count):
    name = "gated_delta"
    require_float(name, q, k, v, log_decay, beta, state)
    require_same_dtype(name, q, k, v)
    for label, s in (("log_decay", log_decay), ("beta", beta), ("state", state)):
        if np.dtype(s.dtype) not in (np.dtype(q.dtype), np.dtype(np.float32)):
            raise DTypeError(
                f"{name}: {label} {show(s)} should be {np.dtype(q.dtype).name} (q's type) or "
                f"float32 (NNC's 16-bit form: float32 log_decay, beta and state); q {show(q)}"
            )
    ok = q.ndim == 4 and tuple(k.shape) == tuple(q.shape) and v.ndim == 4
    if ok:
        b, t, hk, dk = q.shape
        hv, dv = v.shape[2], v.shape[3]
        ok = (
            v.shape[:2] == (b, t)
            and hk > 0  # NNC: Hk > 0 (no key head to share)
            and hv % hk == 0
            and tuple(log_decay.shape) == (b, t, hv)
            and tuple(beta.shape) == (b, t, hv)
            and tuple(state.shape) == (b, hv, dv, dk)
        )
    if not ok:
        fail(
            f"{name}: expected q, k [B, T, Hk, Dk], v [B, T, Hv, Dv] (Hk >= 1 divides Hv), "
            f"log_decay and beta [B, T, Hv], state [B, Hv, Dv, Dk]; got q {show(q)}, k {show(k)}, "
            f"v {show(v)}, log_decay {show(log_decay)}, beta {show(beta)}, state {show(state)}"
        )
    if not 0 <= state_checkpoint_count <= q.shape[1]:
        fail(
            f"{name}: state_checkpoint_count={state_checkpoint_count} must be in 0..T = "
            f"{q.shape[1]} (the states kept besides the final one)"
        )
    b, hv, dv, dk = state.shape
    history = Spec((b, hv * (state_checkpoint_count + 1), dv, dk), state.dtype)
    return Spec(tuple(v.shape), v.dtype), history


@defcommand(family="gated_delta", shape=_gated_delta_shape)
def gated_delta(q, k, v, log_decay, beta, state, *, log_decay_input=True, state_checkpoint_count=0):
    """The Gated DeltaNet recurrence (see the module docstring): ``(y, state_out)``.

    With ``state_checkpoint_count = c`` the second output holds the last ``c + 1``
    states, final first (NNC's reverse checkpoints for a backward pass), flattened into
    the head axis: ``[B, (c + 1) * Hv, Dv, Dk]``.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> x = jnp.ones((1, 3, 1, 2)); g = jnp.zeros((1, 3, 1))
    >>> y, s = ops.gated_delta()(x, x, x, g, g + 0.5, jnp.zeros((1, 1, 2, 2)))
    >>> y.shape, s.shape
    ((1, 3, 1, 2), (1, 1, 2, 2))
    """
    out_dtype, state_dtype = v.dtype, state.dtype
    wide = jnp.result_type(jnp.float32, q, k, v, log_decay, beta, state)
    q, k, v, log_decay, beta, state = (a.astype(wide) for a in (q, k, v, log_decay, beta, state))
    r = v.shape[2] // q.shape[2]
    qe, ke = jnp.repeat(q, r, axis=2), jnp.repeat(k, r, axis=2)  # [B, T, Hv, Dk]
    decay = jnp.exp(log_decay) if log_decay_input else log_decay

    keep = state_checkpoint_count

    def step(s, xs):
        q_t, k_t, v_t, a_t, b_t = xs  # [B, Hv, ...]
        s = s * a_t[..., None, None]
        memory = jnp.einsum("bhvk,bhk->bhv", s, k_t)
        delta = (v_t - memory) * b_t[..., None]
        s = s + delta[..., None] * k_t[..., None, :]
        return s, (jnp.einsum("bhvk,bhk->bhv", s, q_t), s if keep else None)

    xs = tuple(jnp.swapaxes(x, 0, 1) for x in (qe, ke, v, decay, beta))
    final, (ys, states) = lax.scan(step, state, xs)
    y = jnp.swapaxes(ys, 0, 1).astype(out_dtype)
    if not keep:
        return y, final.astype(state_dtype)
    every = jnp.concatenate([state[None], states], axis=0)  # [T + 1, B, Hv, Dv, Dk]
    history = jnp.flip(every, axis=0)[: keep + 1]
    b, hv, dv, dk = state.shape
    history = jnp.reshape(jnp.swapaxes(history, 0, 1), (b, (keep + 1) * hv, dv, dk))
    return y, history.astype(state_dtype)


def _hc_shape(*xs, mode, count, sinkhorn_iterations, epsilon):
    name = "hyper_connection"
    n = count
    if not 1 <= n <= 16:
        raise CommandError(f"{name}: count must be in 1..16, got {n}")
    require_float(name, *xs)
    require_same_dtype(name, *xs)
    if mode == "expand":
        if len(xs) != 4:
            fail(f"{name}: mode 'expand' takes (block, residual, post, comb), got {len(xs)} inputs")
        block, residual, post, comb = xs
        lead = tuple(block.shape[:-1])
        want = {
            "residual": (residual, (*lead, n, block.shape[-1])),
            "post": (post, (*lead, n)),
        }
        for label, (s, shape) in want.items():
            if tuple(s.shape) != shape:
                fail(f"{name}: {label} {show(s)} should be {list(shape)} for block {show(block)}")
        if tuple(comb.shape) not in ((*lead, n * n), (*lead, n, n)):  # NNC takes either
            fail(
                f"{name}: comb {show(comb)} should be {list((*lead, n * n))} or "
                f"{list((*lead, n, n))} for block {show(block)}"
            )
        return Spec(tuple(residual.shape), residual.dtype)
    if mode != "split":
        raise CommandError(f"{name}: mode must be 'split' or 'expand', got {mode!r}")
    if len(xs) not in (3, 4):
        fail(f"{name}: mode 'split' takes (mix, scale, base[, residual]), got {len(xs)} inputs")
    if sinkhorn_iterations < 1:  # NNC's split: EXEC_INVALID, as for epsilon below
        raise CommandError(
            f"{name}: sinkhorn_iterations={sinkhorn_iterations}; expected at least 1 (the "
            "split normalises comb's columns once, then rows and columns per extra iteration)"
        )
    if not epsilon >= 0:
        raise CommandError(f"{name}: epsilon={epsilon}; expected a number >= 0, e.g. 1e-6")
    mix, scale, base = xs[:3]
    width = 2 * n + n * n
    if mix.ndim < 1 or mix.shape[-1] != width or tuple(base.shape) != (width,):
        fail(f"{name}: mix {show(mix)} and base {show(base)} must end in 2n + n² = {width}")
    if math.prod(scale.shape) != 3:
        fail(f"{name}: scale {show(scale)} must hold 3 values (pre, post, comb)")
    lead = tuple(mix.shape[:-1])
    pre, post = Spec((*lead, n), mix.dtype), Spec((*lead, n), mix.dtype)
    comb = Spec((*lead, n * n), mix.dtype)
    if len(xs) == 3:
        return pre, post, comb
    residual = xs[3]
    if tuple(residual.shape[:-1]) != (*lead, n):
        fail(f"{name}: residual {show(residual)} must be [{', '.join(map(str, lead))}, {n}, D]")
    return post, comb, Spec((*lead, residual.shape[-1]), mix.dtype)


def _sinkhorn(mix, scale, base, n, iterations, eps):
    lead = (1,) * (mix.ndim - 1)
    per_column = jnp.reshape(scale, (3,))[jnp.array([0] * n + [1] * n + [2] * (n * n))]
    z = mix * jnp.reshape(per_column, (*lead, -1)) + jnp.reshape(base, (*lead, -1))
    pre = jax.nn.sigmoid(z[..., :n]) + eps
    post = 2 * jax.nn.sigmoid(z[..., n : 2 * n])
    logits = jnp.reshape(z[..., 2 * n :], (*z.shape[:-1], n, n))
    comb = jax.nn.softmax(logits, axis=-1) + eps
    comb = comb / (jnp.sum(comb, axis=-2, keepdims=True) + eps)
    for _ in range(iterations - 1):
        comb = comb / (jnp.sum(comb, axis=-1, keepdims=True) + eps)
        comb = comb / (jnp.sum(comb, axis=-2, keepdims=True) + eps)
    return pre, post, jnp.reshape(comb, (*z.shape[:-1], n * n))


@defcommand(family="hyper_connection", shape=_hc_shape, min_inputs=3)
def hyper_connection(*xs, mode="split", count=4, sinkhorn_iterations=20, epsilon=1e-6):
    """mHC's split (pre/post/comb from the mixing logits) or expand (see module docstring).

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> hc = ops.hyper_connection(count=2)
    >>> pre, post, comb = hc(jnp.zeros((3, 8)), jnp.ones(3), jnp.zeros(8))
    >>> comb[0].round(4)  # doubly stochastic
    Array([0.5, 0.5, 0.5, 0.5], dtype=float32)
    """
    n, dtype = count, xs[0].dtype
    xs = tuple(x.astype(at_least_float32(dtype)) for x in xs)  # 16-bit: rounded once
    if mode == "expand":
        block, residual, post, comb = xs
        c = jnp.reshape(comb, (*block.shape[:-1], n, n))  # [..., n*n] or [..., n, n]
        mixed = jnp.einsum("...ji,...jd->...id", c, residual)
        return (block[..., None, :] * post[..., :, None] + mixed).astype(dtype)
    pre, post, comb = _sinkhorn(*xs[:3], n, sinkhorn_iterations, epsilon)
    if len(xs) == 3:
        return pre.astype(dtype), post.astype(dtype), comb.astype(dtype)
    weighted = jnp.einsum("...id,...i->...d", xs[3], pre)
    return post.astype(dtype), comb.astype(dtype), weighted.astype(dtype)
