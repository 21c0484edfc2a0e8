"""Model.fit runs a dense layer feeding the softmax cross-entropy loss as one fused node
(past MIN_LOGITS): linear_softmax_crossentropy_mean, which makes the gradient in the
forward, or with that pass off the blockwise linear_softmax_crossentropy; and trains
exactly as before either way."""

import numpy as np
import pytest

from fnnc.graph.passes import linear_crossentropy, linear_crossentropy_mean
from fnnc.models import Dense, Embedding, Input, LayerNorm, Model, minimizers

VOCAB, WIDTH, LENGTH = 40, 16, 6


def _model():
    tokens = Input(name="tokens")
    h = LayerNorm(name="ln")(Embedding(VOCAB, WIDTH, name="embed")(tokens))
    return Model([tokens], [Dense(VOCAB, name="logits")(h)], name="head")


def _losses(monkeypatch, min_logits, precision, mean=True):
    monkeypatch.setattr(linear_crossentropy, "MIN_LOGITS", min_logits)
    monkeypatch.setattr(linear_crossentropy_mean, "IN_FIT", mean)
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, (4, LENGTH)).astype(np.int32)
    y = rng.integers(0, VOCAB, (4, LENGTH)).astype(np.int32)
    model = _model()
    model.compile(
        [x], loss="softmax_crossentropy", minimizer=minimizers.adam(1e-2), precision=precision
    )
    losses = [float(model.fit([x], [y])) for _ in range(3)]
    names = [n.cmd.name for n in model.engine._last_fit.program.graph.nodes]
    return losses, names


@pytest.mark.parametrize("mean", [True, False], ids=["mean", "blockwise"])
@pytest.mark.parametrize("precision", [None, "bfloat16"])
def test_fit_fuses_the_head_and_trains_the_same(monkeypatch, precision, mean):
    fused, names = _losses(monkeypatch, 0, precision, mean)
    name = "linear_softmax_crossentropy" + ("_mean" if mean else "")
    assert name in names and "softmax_crossentropy" not in names and "gemm" not in names
    if mean:
        assert "linear_softmax_crossentropy" not in names  # its backward recomputes
    plain, names = _losses(monkeypatch, 10**9, precision)  # below the threshold: unfused
    assert not any(n.startswith("linear_softmax") for n in names)
    tol = 1e-5 if precision is None else 2e-2
    np.testing.assert_allclose(fused, plain, rtol=tol, atol=tol)
    assert fused[-1] < fused[0]
