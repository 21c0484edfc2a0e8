"""Audit 12 (losses and metrics): regressions found by the loss12 audit."""

import dataclasses
import re

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import DTypeError, ModelError, ShapeError
from fnnc.models import Dense, Input, Model
from fnnc.models.metrics import BinaryAccuracy


def _model(units, loss, x, **kw):
    i = Input(name="x")
    model = Model(i, Dense(units, name="fc")(i))
    model.compile(x, loss=loss, minimizer=optax.sgd(0.0), **kw)
    return model


def _scaled_mse(outputs, targets):
    """A JAX loss using .at[] (NumPy arrays have none): column 0 counts twice."""
    d = outputs[0].at[:, 0].multiply(2.0) - targets[0]
    return jnp.mean(d * d)


def test_function_loss_with_jax_methods_scores_as_fit_trains():
    # score / validation called the loss with NumPy arrays: AttributeError ('no .at')
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 3)).astype(np.float32)
    t = rng.normal(size=(6, 2)).astype(np.float32)
    model = _model(2, _scaled_mse, x)
    out = np.asarray(model.predict(x), np.float64)
    d = out * np.array([2.0, 1.0]) - t
    oracle = np.mean(d * d)
    assert float(model.fit(x, t)) == pytest.approx(oracle, rel=1e-5)
    assert model.score(x, t, batch_size=4)["loss"] == pytest.approx(oracle, rel=1e-5)


@pytest.mark.parametrize("loss", ["mse", "sigmoid_binary_crossentropy"])
def test_target_missing_a_size_1_axis_says_how_to_reshape(loss):
    # the error named both shapes but not what to do about Keras's y [N] for Dense(1)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 3)).astype(np.float32)
    y = rng.integers(0, 2, 6).astype(np.float32)
    model = _model(1, loss, x)
    with pytest.raises(ShapeError, match=r"reshape it to \[6, 1\].*y\.reshape\(-1, 1\)"):
        model.fit(x, y)
    with pytest.raises(ShapeError, match=r"y\.reshape\(-1, 1\)"):
        model.score(x, y)
    out = np.asarray(model.predict(x), np.float64)[:, 0]
    if loss == "mse":
        oracle = np.mean((out - y) ** 2)
    else:
        oracle = np.mean((1 - y) * out + np.log1p(np.exp(-out)))
    assert float(model.fit(x, y.reshape(-1, 1))) == pytest.approx(oracle, rel=1e-5)


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("sparse_categorical_crossentropy", "softmax_crossentropy for logits"),
        ("MSELoss", "is mse"),
        ("mae", "jnp.mean(jnp.abs(outputs[0] - targets[0]))"),
    ],
)
def test_keras_and_torch_loss_names_say_what_they_are_here(name, hint):
    # 'unknown loss' listed fnnc's names but not which one a Keras/PyTorch name is
    x = np.zeros((2, 3), np.float32)
    i = Input(name="x")
    model = Model(i, Dense(2, name="fc")(i))
    with pytest.raises(ModelError, match=re.escape(hint)):
        model.compile(x, loss=name, minimizer=optax.sgd(0.0))


def test_validation_batches_of_different_lengths_are_a_named_error():
    # sequences padded per batch: np.concatenate's bare ValueError (after train's epoch)
    import grain

    rng = np.random.default_rng(3)
    xs = [rng.normal(size=(2, t, 4)).astype(np.float32) for t in (3, 5)]
    ys = [rng.integers(0, 5, (2, t)) for t in (3, 5)]
    model = _model(5, "softmax_crossentropy", xs[0])
    ragged = grain.MapDataset.source([([x], [y]) for x, y in zip(xs, ys)])
    with pytest.raises(ModelError, match=r"output 0 is float32\[2, 3, 5\] in batch 0 but "):
        model.score(ragged)
    even = grain.MapDataset.source([([x[:, :3]], [y[:, :3]]) for x, y in zip(xs, ys)])
    z = np.concatenate([np.asarray(model.predict(x[:, :3]), np.float64) for x in xs])
    y = np.concatenate([y[:, :3] for y in ys])
    lse = np.log(np.exp(z).sum(-1))
    oracle = np.mean(lse - np.take_along_axis(z, y[..., None], -1)[..., 0])
    assert model.score(even)["loss"] == pytest.approx(oracle, rel=1e-5)


@dataclasses.dataclass
class _Smoothed:
    """A loss object as one writes it with parameters: a dataclass, so unhashable."""

    eps: float = 0.1

    def __call__(self, outputs, targets):
        c = outputs[0].shape[-1]
        cmd = ops.softmax_crossentropy(trim0=self.eps / c, trim1=1 - self.eps + self.eps / c)
        return jnp.mean(cmd(outputs[0], targets[0])[0])


def test_an_unhashable_loss_object_is_measured_by_accuracy():
    # Accuracy looked the loss up in a dict of binary losses: TypeError unhashable type
    rng = np.random.default_rng(6)
    x = rng.normal(size=(6, 3)).astype(np.float32)
    y = rng.integers(0, 4, 6)
    model = _model(4, _Smoothed(), x)
    z = np.asarray(model.predict(x), np.float64)
    got = model.score(x, y, metrics=["accuracy", "top_2_accuracy"])
    assert got["accuracy"] == np.mean(z.argmax(1) == y)
    top2 = np.argsort(-z, axis=1)[:, :2]
    assert got["top_2_accuracy"] == np.mean((top2 == y[:, None]).any(1))
    t = np.full((6, 4), 0.1 / 4)
    t[np.arange(6), y] += 0.9
    oracle = np.mean(np.log(np.exp(z).sum(1)) - (t * z).sum(1))
    assert got["loss"] == pytest.approx(oracle, rel=1e-5)
    with pytest.raises(ModelError, match=r"_Smoothed.*does not say whether it is a logit"):
        BinaryAccuracy()(model, [z[:, :1]], [y[:, None] % 2])


def test_integer_binary_targets_say_to_cast_them():
    # Keras takes 0/1 int labels for a binary loss; the error spoke of datatype_conversion
    rng = np.random.default_rng(7)
    x = rng.normal(size=(6, 3)).astype(np.float32)
    y = rng.integers(0, 2, (6, 2))
    model = _model(2, "sigmoid_binary_crossentropy", x)
    before = {k: np.asarray(v) for k, v in model.parameters().items()}
    for call in (lambda: model.fit(x, y), lambda: model.score(x, y)):
        with pytest.raises(DTypeError, match=r"int64\[6, 2\].*y\.astype\(np\.float32\)"):
            call()
    assert all(np.array_equal(np.asarray(v), before[k]) for k, v in model.parameters().items())
    z = np.asarray(model.predict(x), np.float64)
    oracle = np.mean(((1 - y) * z + np.log1p(np.exp(-z))).sum(1))
    assert model.score(x, y.astype(np.float32))["loss"] == pytest.approx(oracle, rel=1e-5)


def test_a_loss_function_ignoring_non_numeric_targets_still_scores():
    # score gives a loss function JAX arrays of numbers, other targets as they are
    x = np.random.default_rng(8).normal(size=(4, 3)).astype(np.float32)
    model = _model(2, lambda outputs, targets: jnp.mean(outputs[0]), x)
    want = np.mean(np.asarray(model.predict(x), np.float64))
    assert model.score(x, np.array(["a", "b", "c", "d"]))["loss"] == pytest.approx(want, abs=1e-6)
