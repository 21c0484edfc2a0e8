"""Mixed-precision models: float32 parameters, low-precision compute, digits accuracy."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import optax
import pytest

from fnnc.errors import ModelError
from fnnc.models import Dense, Input, Model, ReLU


def _model():
    x = Input()
    return Model(x, Dense(3, name="out")(ReLU()(Dense(16, name="h")(x))))


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_parameters_and_loss_stay_float32(precision):
    rng = np.random.default_rng(0)
    xs, ys = rng.normal(size=(32, 4)).astype(np.float32), rng.integers(0, 3, 32)
    m = _model()
    m.compile(xs, loss="softmax_crossentropy", minimizer=optax.adam(1e-2), precision=precision)
    first = float(m.fit(xs, ys))
    for _ in range(30):
        loss = m.fit(xs, ys)
    assert loss.dtype == np.float32 and float(loss) < first
    assert all(v.dtype == np.float32 for v in m.parameters().values())
    assert m.evaluate(xs).dtype == np.float32
    state = m.engine.optimizer_state("t-model-0-h-0-0") or {}
    assert all(a.dtype in (np.float32, np.int32) for a in __import__("jax").tree.leaves(state))


def test_unknown_precision_names_the_choices():
    with pytest.raises(ModelError, match="'bfloat16' or 'float16'"):
        _model().compile(np.zeros((2, 4), np.float32), loss="mse", precision="int8")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_digits_accuracy_within_half_a_point(precision):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from digits import load, make_model

    from fnnc.models import minimizers
    from fnnc.models.training import accuracy

    train, test = load()
    result = {}
    for p in ("float32", precision):
        model = make_model()
        opt = minimizers.adam(3e-3)
        model.compile([train[0][:32]], loss="softmax_crossentropy", minimizer=opt, precision=p)
        model.train(train, epochs=6, batch_size=32, verbose=False)
        result[p] = accuracy(model.predict(test[0]), test[1])
    assert abs(result[precision] - result["float32"]) <= 0.005 + 1e-9, result
