"""Audit (round 10) of fnnc.models against NNC's cnnp core (test/unit/nnc/cnnp.core.tests.c,
lib/nnc/ccv_cnnp_model.c): behaviours a porter of NNC code relies on."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import ModelError, ShapeError
from fnnc.models import (
    Activation,
    Add,
    CommandLayer,
    Dense,
    Input,
    Model,
    Mul,
    Parameter,
    Sequential,
    minimizers,
)
from tests.helpers import assert_close

W, B = "t-m-0-fc-0-0", "t-m-0-fc-0-1"
XS = np.array([[1.0, -2.0, 0.5], [0.25, 1.0, -1.0]], np.float32)
YS = np.array([[1.0], [-1.0]], np.float32)


def _loss(outputs, targets):
    return jnp.mean((outputs[0] - targets[0]) ** 2)


def _dense() -> Model:
    x = Input()
    model = Model([x], [Dense(1, name="fc")(x)], name="m")
    model.compile([XS], loss=_loss, minimizer=minimizers.sgd(0.1))
    return model


def _mse_grads(params: dict) -> dict:
    def loss(w, b):
        return _loss([XS @ w.T + b[None, :]], [YS])

    dw, db = jax.grad(loss, argnums=(0, 1))(params[W], params[B])
    return {W: np.asarray(dw), B: np.asarray(db)}


def test_a_new_default_minimizer_keeps_the_per_parameter_ones_unless_reset():
    """NNC's ccv_cnnp_model_set_minimizer with no parameters sets every parameter's
    minimizer, then re-applies those set per parameter (_ccv_cnnp_apply_parameters_with_
    minimizer), unless reset: a weight frozen with a no-op stays frozen across a new
    learning rate (it was trained: fnnc dropped the per-parameter ones), and reset=True
    trains it again. Oracle: one SGD step from jax.grad of the MSE."""
    model = _dense()
    model.set_minimizer(minimizers.noop(), params=[W])
    model.set_minimizer(minimizers.sgd(0.05))  # a new rate, as NNC code sets each epoch
    p0 = model.parameters()
    g = _mse_grads(p0)
    model.fit([XS], [YS])
    p1 = model.parameters()
    np.testing.assert_array_equal(p1[W], p0[W])
    assert_close(p1[B], p0[B] - 0.05 * g[B], rtol=1e-6, atol=1e-7)
    model.set_minimizer(minimizers.sgd(0.05), reset=True)  # NNC: drops the per-parameter ones
    g = _mse_grads(p1)
    model.fit([XS], [YS])
    p2 = model.parameters()
    assert_close(p2[W], p1[W] - 0.05 * g[W], rtol=1e-6, atol=1e-7)
    assert_close(p2[B], p1[B] - 0.05 * g[B], rtol=1e-6, atol=1e-7)


def test_output_gradients_none_or_apart_by_unit_axes_are_taken_as_nnc_takes_them():
    """NNC's ccv_cnnp_model_backward sets an output's gradient to 1 where ``ingrads[i]`` is
    0; fnnc took ``None`` for an array of shape [] ("ingrads 0 is [], but output 0 ... is
    [1, 2]"). Oracle: d/dx of sum(tanh x) + g . sigmoid x in closed form."""
    x = Input()
    model = Model([x], [Activation("tanh")(x), Activation("sigmoid")(x)], name="m")
    xs = np.array([[1.0, -2.0]], np.float32)
    model.compile([xs])
    model.evaluate([xs], requires_grad=True)
    g = np.array([[2.0, 3.0]], np.float32)
    s = 1.0 / (1.0 + np.exp(-xs.astype(np.float64)))
    (dx,) = model.backward([None, g])
    assert_close(dx, 1.0 - np.tanh(xs.astype(np.float64)) ** 2 + g * s * (1.0 - s), rtol=1e-6)
    (dx,) = model.backward([g, None])
    assert_close(dx, g * (1.0 - np.tanh(xs.astype(np.float64)) ** 2) + s * (1.0 - s), rtol=1e-6)
    # NNC's "... and check out gradients" passes a [1] gradient for its [1, 1] output: a
    # gradient apart from its output only by size-1 axes is taken; another shape is not
    (dx,) = model.backward([g[0], g[None]])
    assert_close(dx, g * (1.0 - np.tanh(xs.astype(np.float64)) ** 2) + g * s * (1.0 - s), rtol=1e-6)
    with pytest.raises(ShapeError, match=r"ingrads 1 is \[1, 3\], but output 1 .* is \[1, 2\]"):
        model.backward([g, np.ones((1, 3), np.float32)])


def test_parameter_ids_select_a_sub_models_parameters_as_nnc_does():
    """NNC's ccv_cnnp_model_parameters(mul, ALL_PARAMETERS, ALL_PARAMETERS) as "learn 2 * x
    + y = 12" passes it to set_minimizer: ``parameter_ids(mul)`` gives the ids of mul's
    parameters (NNC's ids), select 0 / 1 the weights / biases, index one of them.
    Freezing mul that way, one SGD(0.1) step on (2 x + y - 12) ** 2 from x = 1, y = 2
    moves y by -0.1 * 2 * (2 + 2 - 12) = 1.6 and leaves x (jax.grad agrees)."""
    xi, yi = Input(), Input()
    mul = Model([xi], [Mul()(xi, Parameter((1,), init=1.0)())], name="mul")
    add = Model([yi], [Add()(yi, Parameter((1,), init=2.0)())], name="add")
    a, f = Input(), Input()
    diff = CommandLayer(ops.add(q=-1.0))(Sequential([mul, add], name="seq")(a), f)
    model = Model([a, f], [Mul()(diff, diff)])
    data = [np.float32([2.0]), np.float32([12.0])]
    model.compile(data, minimizer=minimizers.sgd(0.1))
    assert model.parameter_ids(mul) == ["t-seq-0-mul-0-0-0"]
    assert model.parameter_ids() == ["t-seq-0-mul-0-0-0", "t-seq-0-add-0-0-0"]
    assert model.parameter_ids(add, select=0, index=0) == ["t-seq-0-add-0-0-0"]
    assert model.parameter_ids(add, select=1) == []
    model.set_minimizer(minimizers.noop(), params=model.parameter_ids(mul))
    model.fit(data)
    dx, dy = jax.grad(lambda x, y: (2.0 * x + y - 12.0) ** 2, argnums=(0, 1))(1.0, 2.0)
    got = model.parameters()
    assert float(got["t-seq-0-mul-0-0-0"][0]) == 1.0 and float(dx) != 0.0
    assert_close(got["t-seq-0-add-0-0-0"], np.float32([2.0 - 0.1 * float(dy)]), rtol=1e-6)
    with pytest.raises(ModelError, match=r"parameter_ids: Dense has no parameters in"):
        model.parameter_ids(Dense(1))
    with pytest.raises(ModelError, match=r"index=1, but Model\('mul'\) has 1 parameter"):
        model.parameter_ids(mul, index=1)
    with pytest.raises(ModelError, match=r"index=True, but"):  # a bool is no index
        model.parameter_ids(add, select=0, index=True)


def test_parameter_ids_of_a_sub_model_include_a_layer_it_shares():
    """NNC's ccv_cnnp_model_parameters(B, ...) walks B's layers: a dense that sub-models A
    and B both call (its ids made in A, where it was built first) is among B's too."""
    d = Dense(2, name="shared")
    a_in, b_in, x = Input(), Input(), Input()
    a = Model([a_in], [d(a_in)], name="A")
    b = Model([b_in], [Dense(2, name="own")(d(b_in))], name="B")
    model = Model([x], [b(a(x))], name="top")
    model.compile([np.ones((1, 2), np.float32)])
    shared = ["t-top-0-A-0-shared-0-0", "t-top-0-A-0-shared-0-1"]
    assert model.parameter_ids(a) == shared == model.parameter_ids(d)
    assert model.parameter_ids(b) == [*shared, "t-top-0-B-0-own-0-0", "t-top-0-B-0-own-0-1"]
