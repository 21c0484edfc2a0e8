"""Audit 9 (the training loop): score's loss checks, row checks of train/score/predict."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc.errors import DTypeError, ShapeError
from fnnc.models import Dense, Input, Model

RNG = np.random.default_rng(9)
X = RNG.standard_normal((6, 3)).astype(np.float32)
Y = (3.0 * RNG.standard_normal((6, 1))).astype(np.float32)


@pytest.fixture(scope="module")
def regression() -> Model:
    x = Input()
    m = Model(x, Dense(1, name="out")(x), name="reg")
    m.compile(X, loss="mse", minimizer=optax.sgd(0.0))
    return m


def test_score_of_a_regression_loss_is_not_checked_as_class_labels(regression):
    # mse's targets are any numbers: score and train's validation checked them as class
    # indices of a 1-class output and refused 1.23 as 'needs class indices in [0, 1)'
    out = np.asarray(regression.evaluate(X), np.float64)
    got = regression.score(X, Y)
    np.testing.assert_allclose(got["loss"], np.mean((out - Y) ** 2), rtol=1e-6)
    with pytest.raises(ShapeError, match=r"score: loss 'mse' of output 0 float32\[6, 1\] "
                       r"against target 0 float32\[6\]") as e:  # fmt: skip
        regression.score(X, Y[:, 0])
    assert "class" not in str(e.value)
    with pytest.raises(DTypeError, match=r"score: loss 'mse' .* int32\[6, 1\]"):
        regression.score(X, np.round(Y).astype(np.int32))
    with pytest.raises(ShapeError, match="train validation: loss 'mse'"):
        regression.train((X, Y), batch_size=3, validation=(X, Y[:, 0]), verbose=False)
