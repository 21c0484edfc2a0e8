"""Audit 10, LSTM: NNC's ``batch_first=0`` (time-major ``[T, N, I]``), as its own
``lstm.tests.c`` runs it (``CMD_LSTM_FORWARD(24, 0, 6, 1, 0, 0, 0, 0)`` on ``x [5, 1,
24]``: 5 steps of one sample), against a float64 NumPy LSTM."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import ModelError
from fnnc.models import LSTM, Input, Model, Sequential
from fnnc.ops.rnn import lstm_weight_shapes
from tests.helpers import assert_close, rand


def _sig(a):
    return 1 / (1 + np.exp(-a))


def _numpy_lstm(x, h0, c0, units, dirs, lengths=None):
    """PyTorch's (cuDNN's) LSTM, batch-first, float64; ``units`` one dict per layer and
    direction; steps at or past ``lengths[n]`` keep the state and output zeros."""
    inp, hs, cs = np.asarray(x, np.float64), [], []
    b, t = inp.shape[:2]
    lengths = np.full(b, t) if lengths is None else lengths
    for layer in range(len(units) // dirs):
        outs = []
        for r in range(dirs):
            u = layer * dirs + r
            w = {k: np.asarray(v, np.float64) for k, v in units[u].items()}
            h, c = np.asarray(h0[u], np.float64), np.asarray(c0[u], np.float64)
            ys = np.zeros((b, t, h.shape[-1]))
            for step in reversed(range(t)) if r else range(t):
                z = inp[:, step] @ w["w_ih"].T + h @ w["w_hh"].T + w.get("bias", 0.0)
                i, f, g, o = np.split(z, 4, axis=-1)
                c_new = _sig(f) * c + _sig(i) * np.tanh(g)
                h_new = _sig(o) * np.tanh(c_new)
                h_new = h_new @ w["w_hr"].T if "w_hr" in w else h_new
                real = (step < lengths)[:, None]
                h, c = np.where(real, h_new, h), np.where(real, c_new, c)
                ys[:, step] = np.where(real, h_new, 0.0)
            outs.append(ys)
            hs.append(h)
            cs.append(c)
        inp = np.concatenate(outs, -1)
    return inp, np.stack(hs), np.stack(cs)


def _case(features, hidden, layers, dirs, proj, batch, steps, seed=0):
    shapes = lstm_weight_shapes(features, hidden, num_layers=layers,
                                bidirectional=dirs == 2, proj_size=proj)  # fmt: skip
    units = [
        {
            k: rand(s, seed=seed + 10 * u + j, lo=-0.4, hi=0.4)
            for j, (k, s) in enumerate(unit.items())
        }
        for u, unit in enumerate(shapes)
    ]
    p = proj or hidden
    h0 = rand([layers * dirs, batch, p], seed=seed + 1)
    c0 = rand([layers * dirs, batch, hidden], seed=seed + 2)
    x = rand([batch, steps, features], seed=seed + 3)
    return x, h0, c0, units


@pytest.mark.parametrize(("layers", "dirs", "proj", "masked"), [(3, 1, 0, False), (2, 2, 2, True)])
def test_lstm_time_major_matches_numpy(layers, dirs, proj, masked):
    """``x [T, N, I]`` with batch_first=False gives ``y [T, N, D*P]``; the first case is
    NNC's lstm.tests.c layout (one sample, stacked states [L, 1, H]), scaled down. It was
    a ShapeError (x read as [N, T, I]: h0 [3, 1, 4] 'should be [3, 5, 4]')."""
    x, h0, c0, units = _case(3, 4, layers, dirs, proj, 1 + masked, 5)
    lengths = np.array([5, 2], np.int32) if masked else None
    want = _numpy_lstm(x, h0, c0, units, dirs, lengths)
    cmd = ops.lstm(num_layers=layers, bidirectional=dirs == 2, proj_size=proj, masked=masked,
                   batch_first=False)  # fmt: skip
    flat = [w for unit in units for w in unit.values()]
    args = (np.swapaxes(x, 0, 1), h0, c0, *flat, *([lengths] if masked else []))
    got = cmd(*args)
    assert_close(got, (np.swapaxes(want[0], 0, 1), want[1], want[2]), atol=2e-6)
    specs = cmd.shape(*(jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in args))
    assert [tuple(s.shape) for s in specs] == [tuple(g.shape) for g in got]


def test_lstm_layer_time_major():
    """LSTM(batch_first=False): [T, N, I] in, [T, N, D*P] out, lengths [N]; the output
    is the batch-first layer's, given its parameters, with time and batch swapped."""
    x, lengths = rand([3, 5, 2]), np.array([5, 2, 0], np.int32)  # N=3, T=5, I=2
    x_in, n_in = Input(), Input()
    layer = LSTM(4, masked=True, batch_first=False, name="rnn")
    model = Model([x_in, n_in], layer(x_in, n_in))
    model.compile([np.swapaxes(x, 0, 1), lengths])
    params = model.parameters()
    units = lstm_weight_shapes(2, 4)
    w = iter(np.asarray(params[f"t-rnn-0-{k}"]) for k in range(len(params)))
    units = [{k: next(w) for k in unit} for unit in units]
    zeros = np.zeros((1, 3, 4))
    want = _numpy_lstm(x, zeros, zeros, units, 1, lengths)[0]
    got = model.evaluate([np.swapaxes(x, 0, 1), lengths])
    assert got.shape == (5, 3, 4)
    assert_close(got, np.swapaxes(want, 0, 1), atol=2e-6)
    with pytest.raises(ModelError, match=r"expected int32 \[3\]"):
        Model([x_in, n_in], layer(x_in, n_in)).compile([np.swapaxes(x, 0, 1), lengths[:2]])
    with pytest.raises(ModelError, match="batch_first is 'no'"):
        Sequential([LSTM(4, batch_first="no")])


def test_lstm_takes_nnc_int_flags():
    """ccv_cnnp_lstm(masked, hidden, proj, layers, bias, batch_first, bidirectional, ...)
    takes ints; LSTM refused bidirectional=1 ('expected True or False') where Dense and
    the other layers read NNC's 1 / 0. The weights match the bool spelling's and NNC's
    weight_dim with bias=0: 2 directions x (16*3 + 16*4) elements."""
    ints = LSTM(4, bidirectional=1, bias=0, batch_first=0, masked=0)
    bools = LSTM(4, bidirectional=True, bias=False, batch_first=False, masked=False)
    assert ints.weight_shapes(3) == bools.weight_shapes(3)
    assert sum(int(np.prod(s)) for s in ints.weight_shapes(3)) == 2 * (16 * 3 + 16 * 4)
    assert (ints.bidirectional, ints.bias, ints.batch_first, ints.masked) == (
        True, False, False, False)  # fmt: skip
    with pytest.raises(ModelError, match=r"bidirectional is 2 \(int\); expected True or False"):
        LSTM(4, bidirectional=2)
