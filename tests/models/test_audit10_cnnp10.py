"""Audit (round 10) of fnnc.models against NNC's cnnp core (test/unit/nnc/cnnp.core.tests.c,
lib/nnc/ccv_cnnp_model.c): behaviours a porter of NNC code relies on."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.models import Activation, Dense, Input, Model, minimizers
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


def test_a_none_output_gradient_is_ones_as_nnc_null_ingrad():
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
