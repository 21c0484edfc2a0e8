"""The LSTM layer takes NNC's ccv_cnnp_lstm options (num_layers, bidirectional, proj_size,
dropout, bias) and passes them to one ``ops.lstm``: its outputs against a NumPy LSTM and
against ``ops.lstm`` fed its parameters, its parameter count worked out by hand; and an
unknown keyword of any layer is a ModelError naming the layer and what it takes."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import ModelError
from fnnc.models import LSTM, Dense, Flatten, Input, Model, Sequential
from tests.helpers import assert_close, rand


def _sig(a):
    return 1 / (1 + np.exp(-a))


def _numpy_lstm(x, weights, layers, dirs, proj, bias):
    """PyTorch's (cuDNN's) LSTM in NumPy, from zero states, batch-first."""
    per = 2 + bias + bool(proj)
    inp = x.astype(np.float64)
    for layer in range(layers):
        outs = []
        for r in range(dirs):
            w = [np.asarray(a, np.float64) for a in weights[(layer * dirs + r) * per :][:per]]
            hidden = w[1].shape[0] // 4
            h = np.zeros((x.shape[0], w[1].shape[1]))
            c = np.zeros((x.shape[0], hidden))
            ys = [None] * x.shape[1]
            for t in reversed(range(x.shape[1])) if r else range(x.shape[1]):
                z = inp[:, t] @ w[0].T + h @ w[1].T + (w[2] if bias else 0.0)
                i, f, g, o = np.split(z, 4, axis=-1)
                c = _sig(f) * c + _sig(i) * np.tanh(g)
                h = _sig(o) * np.tanh(c)
                h = h @ w[-1].T if proj else h
                ys[t] = h
            outs.append(np.stack(ys, 1))
        inp = np.concatenate(outs, -1)
    return inp


def _built(layer, x, **evaluate):
    model = Sequential([layer])
    model.compile([x])
    params = model.parameters()
    ordered = [np.asarray(params[f"t-rnn-0-{k}"]) for k in range(len(params))]
    return np.asarray(model.evaluate([x], **evaluate)), ordered


@pytest.mark.parametrize(
    ("layers", "bidirectional", "proj", "bias", "count"),
    [
        # by hand, I=3, H=4 (gates 4H=16), D=2: layer 0 units read 3 features, layer 1 units
        # D*P: 2 * (16*3 + 16*4 + 16) + 2 * (16*8 + 16*4 + 16) = 256 + 416
        (2, True, 0, True, 672),
        # P=2: 2 * (16*3 + 16*2 + 16 + 2*4) + 2 * (16*4 + 16*2 + 16 + 2*4) = 208 + 240
        (2, True, 2, True, 448),
        # one layer, forward only, no bias: 16*3 + 16*4
        (1, False, 0, False, 112),
    ],
)
def test_lstm_layer_options_match_numpy_and_ops_lstm(layers, bidirectional, proj, bias, count):
    x = rand([2, 5, 3])
    layer = LSTM(4, num_layers=layers, bidirectional=bidirectional, proj_size=proj, bias=bias,
                 name="rnn")  # fmt: skip
    y, w = _built(layer, x)
    dirs = 2 if bidirectional else 1
    assert len(w) == layers * dirs * (2 + bias + bool(proj))
    assert sum(a.size for a in w) == count
    assert y.shape == (2, 5, dirs * (proj or 4))
    assert_close(y, _numpy_lstm(x, w, layers, dirs, proj, bias), rtol=1e-4, atol=1e-5)
    cmd = ops.lstm(num_layers=layers, bidirectional=bidirectional, proj_size=proj)
    direct, _, _ = cmd(x, None, None, *w)
    assert_close(y, direct, rtol=1e-5, atol=1e-6)


def test_one_layer_keeps_its_parameter_ids():
    _, w = _built(LSTM(5, name="rnn"), rand([2, 3, 4]))
    assert [a.shape for a in w] == [(20, 4), (20, 5), (20,)]  # w_ih, w_hh, bias


def test_lstm_dropout_only_while_training():
    x = rand([2, 4, 3])
    plain, w = _built(LSTM(4, num_layers=2, name="rnn"), x)
    model = Sequential([LSTM(4, num_layers=2, dropout=0.5, name="rnn")])
    model.compile([x])
    model.set_parameters({f"t-rnn-0-{k}": v for k, v in enumerate(w)})
    assert_close(model.evaluate([x]), plain, rtol=1e-6)  # testing: no dropout
    trained = np.asarray(model.evaluate([x], is_test=False))
    assert trained.shape == plain.shape and not np.allclose(trained, plain)
    with pytest.raises(ModelError, match=r"LSTM\('r'\): dropout=1.0 is outside \[0, 1\)"):
        LSTM(4, dropout=1.0, name="r")
    with pytest.raises(ModelError, match=r"LSTM\('r'\): proj_size is -1"):
        LSTM(4, proj_size=-1, name="r")
    with pytest.raises(ModelError, match=r"LSTM\('r'\): bidirectional is 'yes'"):
        LSTM(4, bidirectional="yes", name="r")


@pytest.mark.parametrize(
    ("make", "kind", "takes"),
    [
        (lambda: Dense(3, activation="relu"), "Dense", r"count, no_bias, name, is_trainable"),
        (lambda: LSTM(8, layers=2), "LSTM", r"hidden, num_layers, bidirectional, proj_size"),
        (lambda: Flatten(start_dim=1), "Flatten", r"name, is_trainable"),
        (lambda: Model(Input(), Input(), nmae="m"), "Model", r"inputs, outputs, name"),
    ],
)
def test_an_unknown_keyword_names_the_layer_and_what_it_takes(make, kind, takes):
    with pytest.raises(ModelError, match=rf"layer {kind}: unknown keyword .*{kind} takes {takes}"):
        make()


def _nnc_weight_dim(bidirectional, num_layers, input_size, hidden_size, proj_size, bias):
    """NNC's ``weight_dim`` (test/int/nnc/lstm.tests.c): rows of ``hidden_size`` in its
    packed cuDNN weights; ``proj_size == hidden_size`` counts no projection."""
    d, layers, n_in, p = 2 if bidirectional else 1, num_layers, input_size, proj_size
    b = 8 if bias else 0
    if hidden_size == proj_size:
        h = hidden_size
        return (layers * b + (layers - 1) * (h * 4 * d + h * 4) + n_in * 4 + h * 4) * d
    return (layers * b + (layers - 1) * (p * 4 * d + p * 4) + (p * 4 + n_in * 4) + layers * p) * d


@pytest.mark.parametrize("proj", [2, 4])
def test_proj_size_equal_to_hidden_is_no_projection_as_in_nnc(proj):
    """NNC (cuDNN) reads proj_size == hidden as no projection: its weight count has no
    w_hr then. fnnc's count equals NNC's less one of cuDNN's two biases per unit."""
    x, hidden, layers = rand([2, 5, 3]), 4, 2
    y, w = _built(LSTM(hidden, num_layers=layers, bidirectional=True, proj_size=proj,
                       name="rnn"), x)  # fmt: skip
    nnc = _nnc_weight_dim(True, layers, 3, hidden, proj, True) * hidden
    assert sum(a.size for a in w) == nnc - layers * 2 * 4 * hidden
    assert y.shape == (2, 5, 2 * proj)
    assert_close(y, _numpy_lstm(x, w, layers, 2, 0 if proj == hidden else proj, True),
                 rtol=1e-4, atol=1e-5)  # fmt: skip


def test_proj_size_above_hidden_is_an_error():
    with pytest.raises(ModelError, match=r"LSTM\('r'\): proj_size=8 is larger than hidden=4"):
        LSTM(4, proj_size=8, name="r")


def test_masked_lstm_layer_takes_lengths_and_ignores_padding():
    """LSTM(masked=True) feeds its second input to ops.lstm's lengths: its output is the
    op's given the layer's parameters, and one SGD step is the same whatever the padded
    steps hold (they reach neither the loss nor the gradients)."""
    x, lengths = rand([3, 5, 3]), np.array([5, 2, 0], np.int32)
    x_in, n_in = Input(), Input()
    model = Model([x_in, n_in], LSTM(4, bidirectional=True, masked=True, name="rnn")(x_in, n_in))
    model.compile([x, lengths], loss="mse", minimizer=optax.sgd(0.5))
    params = model.parameters()
    w = [np.asarray(params[f"t-rnn-0-{k}"]) for k in range(len(params))]
    cmd = ops.lstm(bidirectional=True, masked=True)
    want, _, _ = cmd(x, np.zeros((2, 3, 4), np.float32), np.zeros((2, 3, 4), np.float32), *w,
                     lengths)  # fmt: skip
    assert_close(model.evaluate([x, lengths]), want, rtol=1e-6, atol=1e-6)
    target = rand([3, 5, 8], seed=5)
    model.fit([x, lengths], [target])
    stepped = {k: np.asarray(v) for k, v in model.parameters().items()}
    padded = x.copy()
    padded[1, 2:], padded[2] = 9.0, -9.0
    model.set_parameters({f"t-rnn-0-{k}": v for k, v in enumerate(w)})
    model.fit([padded, lengths], [target])
    assert_close(model.parameters(), stepped, rtol=1e-6, atol=1e-7)


def test_masked_lstm_layer_errors():
    x, x_in, n_in = rand([2, 5, 3]), Input(), Input()
    with pytest.raises(ModelError, match=r"LSTM\('r'\): 1 input\(s\) with masked=True"):
        Model([x_in], LSTM(4, masked=True, name="r")(x_in)).compile([x])
    with pytest.raises(ModelError, match=r"lengths of shape \[2\] and dtype float32"):
        model = Model([x_in, n_in], LSTM(4, masked=True, name="r")(x_in, n_in))
        model.compile([x, np.zeros(2, np.float32)])
