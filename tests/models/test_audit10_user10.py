"""Audit 10 (user10): a practitioner's training run from a dataframe, as the guides tell it."""

import numpy as np
import optax
import pytest

from fnnc.data import DataFrame
from fnnc.errors import ModelError
from fnnc.models import Dense, Input, Model


@pytest.fixture(scope="module")
def model():
    x = Input()
    m = Model(x, Dense(3, name="fc")(x))
    m.compile(np.zeros((5, 4), np.float32), loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    return m


def frame():
    # the data guide's steps: a map adds the model's input "x" after "label"
    images = np.arange(40, dtype=np.float32).reshape(10, 2, 2)
    df = DataFrame.from_arrays(image=images, label=np.arange(10) % 3)
    return df.map(lambda im: im.reshape(-1) / 40, "image", "x")


def test_default_columns_that_do_not_fit_the_model_are_named_before_any_step(model):
    # it was "model Model takes 1 inputs, got 2" from inside the first step, with no
    # word of the columns train had picked (image and label as inputs, x the target)
    before = {k: np.asarray(v) for k, v in model.parameters().items()}
    with pytest.raises(ModelError, match=r"columns \['image', 'label', 'x'\]; by default the"):
        model.train(frame(), epochs=1, batch_size=5, verbose=False)
    assert all(np.array_equal(before[k], model.parameters()[k]) for k in before)
    assert model.train_progress.step == 0


def test_named_columns_train_as_the_numpy_step_says(model):
    # oracle: one SGD step of softmax cross-entropy computed in float64 NumPy, per batch
    p = {k: np.asarray(v, np.float64) for k, v in model.parameters().items()}
    w, b = p["t-fc-0-0"], p["t-fc-0-1"]
    df = frame().batch(5)  # its own batch: read in order, no shuffle
    history = model.train(df, inputs="x", targets="label", epochs=1, verbose=False)
    losses = []
    for rows in (slice(0, 5), slice(5, 10)):
        xb = np.arange(40, dtype=np.float64).reshape(10, 4)[rows] / 40
        yb = (np.arange(10) % 3)[rows]
        z = xb @ w.T + b
        z = z - z.max(1, keepdims=True)
        prob = np.exp(z) / np.exp(z).sum(1, keepdims=True)
        losses.append(-np.log(prob[np.arange(5), yb]).mean())
        g = (prob - np.eye(3)[yb]) / 5
        w, b = w - 0.1 * g.T @ xb, b - 0.1 * g.sum(0)
    np.testing.assert_allclose(history["loss"], [np.mean(losses)], rtol=1e-5)
    np.testing.assert_allclose(model.parameters()["t-fc-0-0"], w, rtol=1e-5, atol=1e-6)
