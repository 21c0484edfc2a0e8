"""LSTM against a NumPy loop (gate order i, f, g, o)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from fnnc import ops
from fnnc.errors import ShapeError
from tests.helpers import assert_close, rand


def _lstm_loop(x, h, c, w_ih, w_hh, b):
    sig = lambda a: 1 / (1 + np.exp(-a))
    ys = []
    for t in range(x.shape[1]):
        i, f, g, o = np.split(x[:, t] @ w_ih.T + h @ w_hh.T + b, 4, axis=-1)
        c = sig(f) * c + sig(i) * np.tanh(g)
        h = sig(o) * np.tanh(c)
        ys.append(h)
    return np.stack(ys, 1), h, c


@pytest.mark.parametrize("bias", [True, False])
def test_lstm_matches_numpy_loop(bias) -> None:
    args = [
        rand([2, 4, 3]),
        rand([2, 5], seed=1),
        rand([2, 5], seed=2),
        rand([20, 3], seed=3),
        rand([20, 5], seed=4),
    ]
    b = rand([20], seed=5)
    got = ops.lstm()(*args, *([b] if bias else []))
    want = _lstm_loop(*(a.astype(np.float64) for a in args), b if bias else 0.0)
    assert_close(got, want, atol=1e-5)


def test_lstm_without_bias_backward_matches_vjp() -> None:
    args = tuple(rand(s, seed=i) for i, s in enumerate([[2, 3, 3], [2, 2], [2, 2], [8, 3], [8, 2]]))
    opdef = ops.lstm().definition
    outs, pullback = jax.vjp(opdef.forward, *args)
    cts = tuple(rand(o.shape, seed=9) for o in outs)
    assert_close(opdef.backward(cts, args, outs), pullback(cts), atol=1e-6)


def test_lstm_shape_errors() -> None:
    with pytest.raises(ShapeError, match=r"w_ih float32\[16, 4\] should be \[16, 3\]"):
        ops.lstm()(rand([2, 4, 3]), rand([2, 4]), rand([2, 4]), rand([16, 4]), rand([16, 4]))
    with pytest.raises(ShapeError, match=r"x float32\[4, 3\] must be \[batch, time, features\]"):
        ops.lstm()(rand([4, 3]), rand([2, 4]), rand([2, 4]), rand([16, 3]), rand([16, 4]))


def _lstm_scan(x, h, c, w_ih, w_hh, b):
    """The same recurrence as ``_lstm_loop`` in jnp (a scan), for jax.vjp in float64."""

    def step(carry, x_t):
        h, c = carry
        i, f, g, o = jnp.split(x_t @ w_ih.T + h @ w_hh.T + b[None], 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    (h, c), ys = lax.scan(step, (h, c), jnp.swapaxes(x, 0, 1))
    return jnp.swapaxes(ys, 0, 1), h, c


@pytest.mark.parametrize(("dtype", "tol"), [(jnp.bfloat16, 0.01), (np.float16, 0.002)])
def test_lstm_16bit_keeps_a_float32_carry(dtype, tol) -> None:
    """200 steps with a long memory (forget bias +3) in 16 bits, forward and backward,
    against the float64 recurrence: the cell state and gates computed in float32 stay
    within ``tol`` of it (relative to each tensor's largest entry); rounded to 16 bits
    at every step (the old scan) they were 12-30x further off (bf16 y 0.074, f16 0.019)."""
    rng = np.random.default_rng(3)
    b, t, i, hidden = 4, 200, 8, 16
    exact = lambda a: np.asarray(jnp.asarray(a, jnp.float32).astype(dtype)).astype(np.float64)
    bias = rng.standard_normal(4 * hidden) * 0.3
    bias[hidden : 2 * hidden] += 3.0
    args = [exact(rng.standard_normal(s) * k) for s, k in [
        ((b, t, i), 1.0), ((b, hidden), 0.5), ((b, hidden), 0.5),
        ((4 * hidden, i), 0.3), ((4 * hidden, hidden), 0.3)]] + [exact(bias)]  # fmt: skip
    cts = [exact(rng.standard_normal(s)) for s in [(b, t, hidden), (b, hidden), (b, hidden)]]
    with jax.enable_x64(True):
        want, pullback = jax.vjp(_lstm_scan, *(jnp.asarray(a) for a in args))
        want_grads = pullback(tuple(jnp.asarray(c) for c in cts))
        want, want_grads = [np.asarray(a) for a in want], [np.asarray(a) for a in want_grads]
    opdef = ops.lstm().definition
    low = tuple(jnp.asarray(a, np.float32).astype(dtype) for a in args)
    got = opdef.forward(*low)
    grads = opdef.backward(tuple(jnp.asarray(c, np.float32).astype(dtype) for c in cts), low, got)
    assert [g.dtype for g in (*got, *grads)] == [np.dtype(dtype)] * 9
    for name, g, w in zip(["y", "h_T", "c_T", "dx", "dh0", "dc0", "dw_ih", "dw_hh", "dbias"],
                          (*got, *grads), (*want, *want_grads)):  # fmt: skip
        err = np.abs(np.asarray(g, np.float64) - w).max() / np.abs(w).max()
        assert err < tol, f"{name}: relative error {err:.4f} >= {tol}"
