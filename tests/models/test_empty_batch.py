"""A training step on a batch of 0 rows is a ModelError that changes nothing (its loss
would be NaN, and the update would write NaN into BatchNorm's running statistics)."""

import jax
import numpy as np
import pytest

from fnnc.errors import ModelError
from fnnc.models import BatchNorm, Dense, Sequential, minimizers

RNG = np.random.default_rng(0)
X = RNG.standard_normal((8, 4)).astype(np.float32)
Y = RNG.integers(0, 3, 8).astype(np.int32)


def _bn_model():
    model = Sequential([Dense(5, name="d"), BatchNorm(name="bn"), Dense(3, name="out")], name="net")
    model.compile(X, loss="softmax_crossentropy", minimizer=minimizers.adam(1e-2), seed=3)
    model.fit(X, Y)  # Adam's moments and the running statistics are no longer their init
    return model


def _state(model):
    params = {k: np.array(v) for k, v in model.parameters().items()}
    opt = {
        pid: [np.array(leaf) for leaf in jax.tree.leaves(model.engine.optimizer_state(pid))]
        for pid in model.engine.trainable()
    }
    return params, opt


def _assert_bitwise(a, b):
    (pa, oa), (pb, ob) = a, b
    assert pa.keys() == pb.keys() and oa.keys() == ob.keys()
    for k in pa:
        np.testing.assert_array_equal(pa[k], pb[k], strict=True, err_msg=k)
    for k in oa:
        assert len(oa[k]) == len(ob[k]), k
        for x, y in zip(oa[k], ob[k]):
            np.testing.assert_array_equal(x, y, strict=True, err_msg=k)


def test_fit_on_zero_rows_raises_and_changes_nothing():
    model, twin = _bn_model(), _bn_model()
    before = _state(model)
    assert any(k.startswith("r-net-0-bn") for k in before[0])  # running stats are checked too
    with pytest.raises(ModelError, match=r"model Model\('net'\) fit: the batch is empty.*0 rows"):
        model.fit(X[:0], Y[:0])
    _assert_bitwise(_state(model), before)
    # the random key did not move either: the next step matches a twin that never
    # saw the empty batch, bit for bit
    assert np.array_equal(np.asarray(model.fit(X, Y)), np.asarray(twin.fit(X, Y)))
    _assert_bitwise(_state(model), _state(twin))


def test_fit_names_the_empty_target_and_a_regression_loss_refuses_too():
    model = _bn_model()
    before = _state(model)
    with pytest.raises(ModelError, match=r"target 0 is int32\[0\], 0 rows"):
        model.fit(X, Y[:0])
    _assert_bitwise(_state(model), before)
    mse = Sequential([Dense(3, name="d")], name="reg")
    mse.compile(X, loss="mse", minimizer=minimizers.sgd(1e-2))
    with pytest.raises(ModelError, match=r"input 0 is float32\[0, 4\], 0 rows"):
        mse.fit(X[:0], np.zeros((0, 3), np.float32))


def test_evaluate_on_zero_rows_works_in_test_mode_and_refuses_in_training_mode():
    model = _bn_model()
    before = _state(model)
    out = np.asarray(model.evaluate(X[:0]))
    assert out.shape == (0, 3) and out.dtype == np.float32
    with pytest.raises(ModelError, match=r"evaluate\(\.\.\., is_test=False\): the batch is empty"):
        model.evaluate(X[:0], is_test=False)
    _assert_bitwise(_state(model), before)
    # oracle for the running statistics kept: test mode still normalises with finite ones
    assert np.isfinite(np.asarray(model.evaluate(X))).all()
