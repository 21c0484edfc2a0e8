"""RNN family: lstm (NNC's LSTM, one layer, one direction).

Weights are packed per gate in the order input, forget, cell (g), output (cuDNN's
order, which NNC's LSTM follows): ``w_ih [4H, I]``, ``w_hh [4H, H]``, ``bias [4H]``.
The recurrence runs as one ``lax.scan`` over time; the backward is derived from
``jax.vjp`` of it (a reverse scan).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from fnnc.core.command import Spec, defcommand
from fnnc.ops._rules import fail, require_float, require_same_dtype, show, to_shape


def _lstm_shape(x, h0, c0, w_ih, w_hh, bias=None):
    name = "lstm"
    specs = [s for s in (x, h0, c0, w_ih, w_hh, bias) if s is not None]
    require_float(name, *specs)
    require_same_dtype(name, *specs)
    if x.ndim != 3:
        fail(f"{name}: x {show(x)} must be [batch, time, features]")
    b, t, i = x.shape
    h = h0.shape[-1] if h0.ndim == 2 else -1
    want = {
        "h0": (h0, (b, h)),
        "c0": (c0, (b, h)),
        "w_ih": (w_ih, (4 * h, i)),
        "w_hh": (w_hh, (4 * h, h)),
    }
    if bias is not None:
        want["bias"] = (bias, (4 * h,))
    for label, (spec, shape) in want.items():
        if tuple(spec.shape) != shape:
            fail(
                f"{name}: {label} {show(spec)} should be {list(shape)} for x {show(x)} "
                f"and h0 {show(h0)} (x [B, T, I], h0/c0 [B, H], w_ih [4H, I], "
                "w_hh [4H, H], bias [4H]; gates i, f, g, o)"
            )
    return Spec((b, t, h), x.dtype), Spec((b, h), x.dtype), Spec((b, h), x.dtype)


@defcommand(family="rnn", shape=_lstm_shape)
def lstm(x, h0, c0, w_ih, w_hh, bias=None):
    """One LSTM layer over ``x [B, T, I]`` from ``(h0, c0) [B, H]``: ``(y [B, T, H], h_T, c_T)``.

    Per step, ``i, f, g, o = split(x_t w_ihᵀ + h w_hhᵀ + bias)``;
    ``c = σ(f) c + σ(i) tanh(g)`` and ``h = σ(o) tanh(c)``; ``y`` stacks every ``h``.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> y, h, c = ops.lstm()(jnp.ones((2, 5, 3)), jnp.zeros((2, 4)), jnp.zeros((2, 4)),
    ...                      jnp.ones((16, 3)), jnp.ones((16, 4)))
    >>> y.shape, h.shape
    ((2, 5, 4), (2, 4))
    """
    # The input projection of every step is one matmul outside the loop.
    xw = jnp.einsum("bti,gi->tbg", x, w_ih)
    if bias is not None:
        xw = xw + to_shape(bias, xw.shape)

    def step(carry, xw_t):
        h, c = carry
        gates = xw_t + h @ w_hh.T
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    (h, c), ys = lax.scan(step, (h0, c0), xw)
    return jnp.swapaxes(ys, 0, 1), h, c
