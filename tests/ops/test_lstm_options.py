"""NNC's LSTM options: num_layers, bidirectional, proj_size and dropout, against a NumPy
loop with PyTorch's (and cuDNN's) semantics, and dropout against layers run one by one."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError, ShapeError
from tests.helpers import assert_close, rand


def _sig(a):
    return 1 / (1 + np.exp(-a))


def _direction(x, h, c, w_ih, w_hh, b, w_hr, reverse):
    ys = [None] * x.shape[1]
    steps = range(x.shape[1] - 1, -1, -1) if reverse else range(x.shape[1])
    for t in steps:
        i, f, g, o = np.split(x[:, t] @ w_ih.T + h @ w_hh.T + b, 4, axis=-1)
        c = _sig(f) * c + _sig(i) * np.tanh(g)
        h = _sig(o) * np.tanh(c)
        if w_hr is not None:
            h = h @ w_hr.T
        ys[t] = h
    return np.stack(ys, 1), h, c


def _weights(layers, dirs, i, hidden, proj, bias, seed=10):
    p = proj or hidden
    out = []
    for layer in range(layers):
        for _ in range(dirs):
            n_in = i if layer == 0 else dirs * p
            shapes = [(4 * hidden, n_in), (4 * hidden, p)] + [(4 * hidden,)] * bias
            shapes += [(p, hidden)] if proj else []
            for s in shapes:
                seed += 1
                out.append(rand(s, seed=seed, lo=-0.5, hi=0.5))
    return out


@pytest.mark.parametrize(
    "layers,bidirectional,proj,bias", [(2, False, 0, True), (1, True, 0, False), (2, True, 3, True)]
)
def test_lstm_options_match_numpy(layers, bidirectional, proj, bias):
    d, hidden, b, t, i = 2 if bidirectional else 1, 5, 2, 4, 3
    p = proj or hidden
    x = rand([b, t, i])
    h0 = rand([layers * d, b, p], seed=1)
    c0 = rand([layers * d, b, hidden], seed=2)
    w = _weights(layers, d, i, hidden, proj, int(bias))
    cmd = ops.lstm(num_layers=layers, bidirectional=bidirectional, proj_size=proj)
    y, h, c = cmd(x, h0, c0, *w)
    per = 2 + bias + (1 if proj else 0)
    inp, hs, cs = x.astype(np.float64), [], []
    for layer in range(layers):
        outs = []
        for r in range(d):
            u = layer * d + r
            ws = w[u * per : (u + 1) * per]
            ys, hh, cc = _direction(inp, h0[u], c0[u], ws[0], ws[1], ws[2] if bias else 0.0,
                                    ws[-1] if proj else None, r == 1)  # fmt: skip
            outs.append(ys)
            hs.append(hh)
            cs.append(cc)
        inp = np.concatenate(outs, axis=-1)
    assert y.shape == (b, t, d * p)
    assert_close((y, h, c), (inp, np.stack(hs), np.stack(cs)), atol=1e-5)


def test_lstm_dropout_between_layers():
    x, hidden = rand([2, 3, 3]), 4
    h0, c0 = rand([2, 2, hidden], seed=1), rand([2, 2, hidden], seed=2)
    w = _weights(2, 1, 3, hidden, 0, 1)
    key = np.asarray(jax.random.key_data(jax.random.key(7)))
    train = ops.lstm(num_layers=2, dropout=0.4)
    y1, _, _ = train(x, h0, c0, *w, key)
    y2, _, _ = train(x, h0, c0, *w, key)
    assert_close(y1, y2, rtol=0, atol=0)  # the mask is a function of the key
    other = np.asarray(jax.random.key_data(jax.random.key(8)))
    assert np.abs(np.asarray(train(x, h0, c0, *w, other)[0]) - np.asarray(y1)).max() > 1e-4
    # One layer at a time with the same mask between them
    one = ops.lstm()
    y0, _, _ = one(x, h0[0], c0[0], *w[:3])
    wrapped = jax.random.wrap_key_data(key, impl="threefry2x32")
    keep = jax.random.bernoulli(jax.random.fold_in(wrapped, 0), np.float32(0.6), y0.shape)
    want, _, _ = one(np.asarray(y0) * np.asarray(keep) / 0.6, h0[1], c0[1], *w[3:])
    assert_close(y1, want, atol=1e-6)
    # is_test: no dropout and no key
    test = ops.lstm(num_layers=2, dropout=0.4, is_test=True)(x, h0, c0, *w)
    assert_close(test, ops.lstm(num_layers=2)(x, h0, c0, *w), rtol=0, atol=0)


def test_lstm_option_errors_say_what_fits():
    x, h0, c0 = rand([2, 3, 3]), rand([2, 2, 4]), rand([2, 2, 4])
    with pytest.raises(ShapeError, match="do not fit 2 layer"):
        ops.lstm(num_layers=2)(x, h0, c0, *_weights(1, 1, 3, 4, 0, 1))
    with pytest.raises(ShapeError, match=r"w_ih float32\[16, 3\] should be \[16, 4\] \(layer 1"):
        w = _weights(2, 1, 3, 4, 0, 1)
        w[3] = rand([16, 3])
        ops.lstm(num_layers=2)(x, h0, c0, *w)


def test_lstm_proj_size_equal_to_hidden_is_no_projection():
    """NNC and cuDNN read proj_size == hidden as no projection (no w_hr); above hidden
    is an error naming both sizes (cuDNN's CUDNN_STATUS_BAD_PARAM, PyTorch's ValueError)."""
    x, h0, c0 = rand([2, 3, 3]), rand([2, 4], seed=1), rand([2, 4], seed=2)
    w = _weights(1, 1, 3, 4, 0, 1)
    want = _direction(x.astype(np.float64), h0, c0, *w, None, False)
    assert_close(ops.lstm(proj_size=4)(x, h0, c0, *w), want, atol=1e-5)
    assert [tuple(s.shape) for s in ops.lstm(proj_size=4).shape(x, h0, c0, *w)] == [
        (2, 3, 4), (2, 4), (2, 4)]  # fmt: skip
    with pytest.raises(CommandError, match="proj_size=5 is larger than the hidden size 4"):
        ops.lstm(proj_size=5)(x, rand([2, 5]), c0, *w, rand([5, 4]))
