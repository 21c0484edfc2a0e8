"""LSTM against a NumPy loop (gate order i, f, g, o)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

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
