"""Keras keywords on Model's methods are ModelErrors that say what fnnc takes instead
(issue 27, the habits users bring), where Python's TypeError named only the keyword."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc.models import Dense, Input, Model, ModelError

X = np.ones((4, 3), np.float32)
Y = np.zeros((4, 1), np.float32)


@pytest.fixture(scope="module")
def model():
    x = Input()
    m = Model(x, Dense(1, name="fc")(x), name="k")
    m.compile(X, loss="mse", minimizer=optax.sgd(0.1))
    return m


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda m: m.fit(X, Y, epochs=2, batch_size=2),
            r"fit of model .*k.*: unknown keyword argument\(s\) epochs=2, batch_size=2; fit"
            r"\(inputs, targets\) is NNC's one training step on one batch; Keras's fit\(x, y, "
            r"epochs=..., batch_size=...\) is train\(\(x, y\), epochs=",
        ),
        (
            lambda m: m.evaluate(X, batch_size=2),
            r"Keras's evaluate\(x, y, batch_size=...\) is score",
        ),
        (lambda m: m.predict(X, verbose=0), r"verbose: progress= and verbose= of train"),
        (lambda m: m.score((X, Y), verbose=0), r"score takes data, labels"),
        (lambda m: m.evaluate(X, Y), r"1 positional argument\(s\) more than it takes; eval"),
        (lambda m: m.fit(X, Y, 32, 10), r"2 positional argument\(s\) more .* is train\("),
        (lambda m: m.predict(X, 2), r"predict takes inputs and batch_size="),
        (
            lambda m: m.train((X, Y), verbose=np.int64(3)),
            r"train\(verbose=...\) takes True or False, 0, 1 or Keras's 2",
        ),
        (
            lambda m: m.train((X, Y), validation_data=(X, Y), initial_epoch=1),
            r"validation_data: validation=; initial_epoch: resume=",
        ),
    ],
)
def test_keras_keywords_name_fnncs_way(model, call, message):
    before = {k: np.asarray(v) for k, v in model.parameters().items()}
    with pytest.raises(ModelError, match=message):
        call(model)
    for k, v in model.parameters().items():  # refused before anything ran
        np.testing.assert_array_equal(np.asarray(v), before[k])


def test_the_methods_still_run_with_their_own_keywords(model):
    """The catch-all takes nothing away: one SGD step on mse matches the closed form."""
    w, b = (np.asarray(v) for v in model.parameters().values())
    loss = float(model.fit(X, Y))
    pred = X @ w.T + b
    assert loss == pytest.approx(float((pred**2).mean()), rel=1e-5)
    assert model.predict(X, batch_size=2).shape == (4, 1)
    assert model.evaluate(X, is_test=True).shape == (4, 1)
