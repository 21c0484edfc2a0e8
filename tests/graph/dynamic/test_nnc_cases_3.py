"""NNC's dynamic graph cases with cnnp models (test/unit/nnc/dynamic.graph.tests.c),
float32, those test_evaluate_cnnp.py and test_nnc_semantics.py do not cover.

NNC's ``CMD_SGD_FORWARD(nesterov, rate, scale, decay, momentum, dampening)`` is
``fnnc.models.minimizers.sgd(rate, scale=, decay=, momentum=, dampening=)``; NNC trains
a model's parameters from ``apply_gradients`` once the model has a minimizer, where
fnnc names them: ``dg.parameters(model)`` are variables like any other.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import DynamicGraph
from fnnc.models import CommandLayer, Dense, Input, Layer, Model, Sequential
from fnnc.models.minimizers import sgd

F32 = np.float32


class _Reciprocal(Layer):
    """NNC's ``ccv_cnnp_div(1, ...)``: ``1 / x``."""

    def build(self, ctx, x):
        ones = ctx.b.exec(ops.set(shape=x.shape, dtype=x.dtype, value=1.0))
        return ctx.b.exec(ops.ewdiv(), ones, x, name=ctx.layer_id(self))


def test_evaluate_a_division_model_without_parameters() -> None:
    """NNC: "dynamic graph to evaluate cnnp model without any parameters with div"."""
    a_in, b_in = Input(), Input()
    div = Model([a_in, b_in], CommandLayer(ops.ewdiv(), name="div")(a_in, b_in))
    dg = DynamicGraph()
    a = dg.variable(F32([1.23]), name="a")
    b = dg.variable(F32([2.0]), name="b")
    c = dg.evaluate(div, [a, b])
    (da,) = dg.backward(c, [a])
    assert float(c.numpy()[0]) == pytest.approx(1.23 / 2, abs=1e-5)
    assert float(da.numpy()[0]) == pytest.approx(1.0 / 2, abs=1e-5)
    assert dg.parameters(div) == {}


def test_evaluate_a_reciprocal_model_without_parameters() -> None:
    """NNC: "dynamic graph to evaluate cnnp model without any parameters with
    reciprocal"."""
    a_in = Input()
    reciprocal = Model(a_in, _Reciprocal(name="div")(a_in))
    dg = DynamicGraph()
    a = dg.variable(F32([1.23]), name="a")
    c = dg.evaluate(reciprocal, [a])
    (da,) = dg.backward(c, [a])
    assert float(c.numpy()[0]) == pytest.approx(1 / 1.23, abs=1e-5)
    assert float(da.numpy()[0]) == pytest.approx(-1 / (1.23 * 1.23), abs=1e-5)


def test_evaluate_a_model_for_permute_and_reshape() -> None:
    """NNC: "dynamic graph to use cnnp model for permute and reshape": the permute is
    materialised before the reshape reads it."""
    seq = Sequential(
        [
            CommandLayer(ops.reshape(shape=(4, 3, 2))),
            CommandLayer(ops.transpose(perm=(2, 0, 1))),
            CommandLayer(ops.reshape(shape=(2 * 4, 3))),
        ]
    )
    dg = DynamicGraph()
    x = dg.variable(np.arange(24, dtype=F32).reshape(4, 3, 2), name="x")
    y = dg.evaluate(seq, [x])
    want = np.concatenate([np.arange(0, 24, 2), np.arange(1, 24, 2)]).reshape(8, 3)
    np.testing.assert_array_equal(y.numpy(), want)
    (dx,) = dg.backward(y, [x], df=np.arange(24, dtype=F32).reshape(8, 3))
    np.testing.assert_array_equal(
        dx.numpy().transpose(2, 0, 1).reshape(8, 3), np.arange(24).reshape(8, 3)
    )


def test_evaluate_a_model_and_apply_accumulated_gradients_every_other_step() -> None:
    """NNC: "dynamic graph to evaluate cnnp model and simply accumulate gradients":
    batches of 1 and 2 alternate, an SGD step (rate 0.01, decay 0.01) every second
    batch uses both batches' gradients. Checked against NNC's |y - 5| < 1e-2 and the
    same training in plain JAX from the same initial parameters."""
    x_in = Input()
    linear = Model(x_in, Dense(1, name="linear")(x_in))
    dg = DynamicGraph()
    z = dg.constant(F32([[5.0]]), name="z")
    opt = sgd(0.01, decay=0.01)
    for i in range(100):
        x = dg.variable(np.full((2 if i % 2 else 1, 1), 10.0, F32), name="x")
        y = dg.evaluate(linear, [dg.exec(ops.ewlog(), x)])
        params = dg.parameters(linear)
        if i == 0:
            start = {pid: v.numpy() for pid, v in params.items()}
        n = dg.exec(ops.add(q=-1.0), y, z)
        f = dg.exec(ops.ewprod(), n, n)
        dg.backward(f, [x, *params.values()], df=np.ones(f.shape, F32))
        if i % 2 == 1:
            dg.apply_gradients(opt, list(params.values()))
    y = dg.evaluate(linear, [dg.exec(ops.ewlog(), dg.constant(F32([[10.0]])))])
    assert abs(float(y.numpy()[0, 0]) - 5.0) < 1e-2

    w_id, b_id = sorted(start, key=lambda p: -np.ndim(start[p]))

    def loss(p, batch):
        u = jnp.log(jnp.full((batch, 1), 10.0, jnp.float32))
        return jnp.sum((u @ p[w_id].T + p[b_id][None] - 5.0) ** 2)

    p = {k: jnp.asarray(v) for k, v in start.items()}
    for _ in range(50):
        g1, g2 = jax.grad(loss)(p, 1), jax.grad(loss)(p, 2)
        p = {k: p[k] - 0.01 * (g1[k] + g2[k] + 0.01 * p[k]) for k in p}
    for pid, v in dg.parameters(linear).items():
        np.testing.assert_allclose(v.numpy(), p[pid], rtol=1e-4, atol=1e-5)


def _train_across_models(alias: bool) -> float:
    """``f = (linear(x * a) + x)^2`` for x = 0..999: gradients reach ``a`` and the
    model's weight (both start at 0.2485), an SGD step every 5 samples."""
    layers = [Dense(1, no_bias=True, name="linear")]
    if alias:
        layers.append(CommandLayer(ops.reshape(shape=(1,))))
    linear = Sequential(layers)
    linear.compile([np.zeros((1, 1), F32)])
    shape = (1,) if alias else (1, 1)
    dg = DynamicGraph()
    # NNC writes 0.2485 into a with CMD_SET_FORWARD; fnnc makes such a write a
    # constant (test_set_into_a_variable_keeps_it_trainable), so a starts there. a and
    # the weight start equal (a saddle of the loss): float rounding breaks the tie.
    a = dg.variable(np.full(shape, 0.2485, F32), name="a")
    (w,) = dg.parameters(linear).values()
    dg.set(w, np.full((1, 1), 0.2485, F32))

    def model(y):
        return dg.evaluate(linear, [dg.alias(y, (1, 1)) if alias else y])

    for i in range(1000):
        x = dg.variable(np.full(shape, i, F32))
        t = dg.variable(np.full(shape, -i, F32))
        y = dg.exec(ops.mul(), x, a)
        z = model(y)
        n = dg.exec(ops.add(q=-1.0), z, t)
        f = dg.exec(ops.mul(), n, n)
        dg.backward(f, [a, w], df=np.ones(shape, F32))
        for v in (n, z, y, x, t, f):
            dg.free(v)
        if (i + 1) % 5 == 0:
            assert dg.num_nodes == 0  # NNC: "everything should be freed"
            rate = 0.001 if i < 200 else 0.0001  # NNC's schedule (its 600 branch is dead)
            dg.apply_gradients(sgd(rate, scale=0.001), [a, w])
    y = dg.exec(ops.mul(), dg.variable(np.full(shape, 5.0, F32)), a)
    return float(model(y).numpy().reshape(()))


@pytest.mark.parametrize("alias", [False, True], ids=["plain", "aliases"])
def test_accumulate_gradients_across_a_model_and_a_variable(alias: bool) -> None:
    """NNC: "dynamic graph to accumulate gradients cross cnnp models" and "... with
    aliases" (the model reads a reshaping alias of ``x * a`` and ends in a reshape):
    the product of ``a`` and the weight is trained to -1, so the model maps 5 to -5."""
    assert _train_across_models(alias) == pytest.approx(-5.0, abs=1e-2)
