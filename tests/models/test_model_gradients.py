"""Model.gradients / clip_grad_norm / gradients_isnan: NNC's
ccv_cnnp_model_parameter_gradients_map, _parameters_clip_grad_norm and
_parameter_gradients_isnan between backward and apply_gradients. Oracles: jax.grad of
the model's function, PyTorch's clip_grad_norm_ formula in NumPy, NNC's closed form."""

from __future__ import annotations

import math

import jax
import numpy as np
import optax
import pytest

from fnnc.models import Dense, Input, Model, ModelError, minimizers
from tests.helpers import assert_close
from tests.models.test_nnc_cnnp_cases_2 import DATA, X, _f, _math

X_IN = np.linspace(-2, 3, 12, dtype=np.float32).reshape(4, 3)


@pytest.fixture(scope="module")
def mlp():
    x = Input()
    first = Dense(5, name="a")
    model = Model(x, Dense(2, name="b")(first(x)), name="m")
    model.compile(np.zeros((4, 3), np.float32), minimizer=optax.sgd(0.1))
    return model, first


IDS = ["t-m-0-a-0-0", "t-m-0-a-0-1", "t-m-0-b-0-0", "t-m-0-b-0-1"]


def _oracle(model):
    """jax.grad of sum(model(x)) (backward's default output gradients are ones); NNC's
    Dense weights are [out, in]."""
    params = model.parameters()

    def f(p):
        w1, b1, w2, b2 = p
        return ((X_IN @ w1.T + b1[None]) @ w2.T + b2[None]).sum()

    return dict(zip(IDS, jax.grad(f)([np.asarray(params[k]) for k in IDS])))


def test_gradients_are_what_backward_accumulated_and_apply_clears(mlp):
    model, first = mlp
    model.apply_gradients()  # nothing pending
    assert model.gradients() == {}
    assert model.clip_grad_norm(1.0) == 0.0 and not model.gradients_isnan()
    model.evaluate(X_IN, requires_grad=True)
    model.backward(outgrads=False)
    model.backward(outgrads=False)  # accumulates: twice jax.grad
    want = _oracle(model)
    got = model.gradients()
    assert list(got) == list(model.parameters())
    for pid, g in want.items():
        assert_close(got[pid], 2 * np.asarray(g), rtol=1e-5, atol=1e-5)
    assert list(model.gradients(first)) == model.parameter_ids(first)
    assert list(model.gradients("t-m-0-b-0-1")) == ["t-m-0-b-0-1"]
    model.apply_gradients()
    assert model.gradients() == {}


@pytest.mark.parametrize("p", [2, 1, math.inf])
def test_clip_scales_every_gradient_by_the_global_norm_as_pytorch(mlp, p):
    model, _ = mlp
    model.evaluate(X_IN, requires_grad=True)
    model.backward(outgrads=False)
    grads = {k: np.asarray(v, np.float64) for k, v in model.gradients().items()}
    flat = np.concatenate([g.ravel() for g in grads.values()])
    norm = np.abs(flat).max() if math.isinf(p) else (np.abs(flat) ** p).sum() ** (1 / p)
    max_norm = float(norm) / 3
    assert model.clip_grad_norm(max_norm, norm_type=p) == pytest.approx(norm, rel=1e-5)
    for pid, g in model.gradients().items():
        assert_close(g, grads[pid] * (max_norm / norm), rtol=1e-5, atol=1e-6)
    # under the limit: unchanged (scale min(max_norm / norm, 1) = 1)
    before = {k: np.asarray(v) for k, v in model.gradients().items()}
    model.clip_grad_norm(10 * max_norm, norm_type=p)
    for pid, g in model.gradients().items():
        np.testing.assert_array_equal(np.asarray(g), before[pid])
    model.apply_gradients()


def test_clip_of_one_layer_leaves_the_others(mlp):
    model, first = mlp
    model.evaluate(X_IN, requires_grad=True)
    model.backward(outgrads=False)
    before = {k: np.asarray(v) for k, v in model.gradients().items()}
    model.parameters_clip_grad_norm(first, 2, np.float32(1e-3))  # NNC's name and order
    after = model.gradients()
    sub = np.concatenate([np.asarray(after[p]).ravel() for p in model.parameter_ids(first)])
    assert np.linalg.norm(sub) == pytest.approx(1e-3, rel=1e-4)
    for pid in ("t-m-0-b-0-0", "t-m-0-b-0-1"):
        np.testing.assert_array_equal(np.asarray(after[pid]), before[pid])
    model.apply_gradients()


def test_nnc_clip_grad_to_max_norm_half():
    """NNC's "learn simple math of 2 * x + 1 + 1 = 10, x = 4 and clip grad to max_norm =
    0.5" written as NNC writes it: backward, clip_grad_norm(ALL, 2, 0.5), apply; then two
    backward calls accumulated and clipped once. |d/dx| = |8x - 32| > 24 on [-1, 1], so
    the clipped gradient is -0.5 and SGD (rate 0.1, decay 0.1) moves x by
    0.1 * (0.5 - 0.1 x)."""
    model = _math()
    model.compile(DATA, minimizer=minimizers.sgd(0.1, decay=0.1))
    for times in (1, 2):
        x = float(model.parameters()[X][0])
        model.evaluate(DATA, requires_grad=True)
        for _ in range(times):
            model.backward(outgrad=False)
        norm = model.clip_grad_norm(0.5)  # NNC: norm_type 2, max_norm 0.5
        assert norm == pytest.approx(times * abs(8 * x - 32), rel=1e-5)
        assert float(np.abs(model.gradients()[X]).max()) < 0.5 + 1e-5
        model.apply_gradients()
        assert_close(model.parameters()[X], _f(x - 0.1 * (-0.5 + 0.1 * x)), rtol=1e-6)


def test_isnan_sees_nan_and_not_inf(mlp):
    model, first = mlp
    bad = X_IN.copy()
    bad[0, 0] = np.nan
    model.evaluate(bad, requires_grad=True)
    model.backward(outgrads=False)
    assert model.gradients_isnan() and model.parameter_gradients_isnan()
    assert model.gradients_isnan(first)  # the first layer's weight sees the NaN input
    assert not model.gradients_isnan("t-m-0-b-0-1")  # the last bias's gradient is ones
    model.zero_grad()  # drop them (apply would write NaN into the weights)
    assert model.gradients() == {}
    big = np.full_like(X_IN, 1e38)
    model.evaluate(big, requires_grad=True)
    model.backward(outgrads=False)
    grads = np.concatenate([np.asarray(g).ravel() for g in model.gradients().values()])
    assert np.isinf(grads).any() and not model.gradients_isnan()
    model.zero_grad()


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda m: m.clip_grad_norm(0),
            r"max_norm is 0 \(int\); expected a number in \(0.0, inf\]",
        ),
        (
            lambda m: m.clip_grad_norm(-1.0),
            r"max_norm is -1.0 \(float\); expected a number in \(0.0, inf\]",
        ),
        (
            lambda m: m.clip_grad_norm("1"),
            r"max_norm is '1' \(str\); expected a number in \(0.0, inf\]",
        ),
        (
            lambda m: m.clip_grad_norm(1.0, norm_type=0.5),
            r"norm_type is 0.5 \(float\); expected a number in \[1.0, inf\]",
        ),
        (lambda m: m.clip_grad_norm(1.0, params="t-nope"), "'t-nope' is not a parameter"),
        (lambda m: m.gradients(params=3), "params=3 \\(int\\); expected None"),
        (
            lambda m: m.clip_grad_norm(True),
            r"max_norm is True \(bool\); expected a number in \(0.0, inf\]",
        ),
        (
            lambda m: m.clip_grad_norm(np.nan),
            r"max_norm is nan \(float\); expected a number in \(0.0, inf\]",
        ),
        (
            lambda m: m.clip_grad_norm(1.0, norm_type=np.int64(0)),
            r"norm_type is 0.0 \(float\); expected a number in \[1.0, inf\]",
        ),
    ],
)
def test_bad_arguments_are_named(mlp, call, message):
    with pytest.raises(ModelError, match=message):
        call(mlp[0])
