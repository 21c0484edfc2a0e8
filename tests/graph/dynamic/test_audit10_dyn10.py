"""Audit 10 of the dynamic graph against NNC's test/unit/nnc/dynamic.graph.tests.c.

Oracles: the numbers NNC's test cases expect, and jax.grad / Optax.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import GraphError, ShapeError
from fnnc.graph import DynamicGraph
from fnnc.graph.dynamic import cnnp
from fnnc.models import Input, Model, Mul

F32 = np.float32
LAZY = pytest.mark.parametrize("lazy", [False, True])


@LAZY
def test_backward_without_df_seeds_every_element_with_one(lazy: bool) -> None:
    """NNC: "dynamic graph to compute f(x) = x * y', where y[0, 0] = 2, y[0, 1] = 4,
    x = [10], y' = y^T, gradient against y", written as NNC writes it: f is [2, 1] and
    backward gets no df (ccv_nnc_dynamic_graph_backward seeds CMD_SET_FORWARD(1)), so
    dy' = [10, 10]; then every variable freed leaves nothing recorded."""
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(F32([0.0]), name="x")
    y = dg.variable(F32([4.0, 0.0]), name="y")
    dg.exec(ops.set(shape=(1,), value=10.0), outputs=[x])
    y_t = dg.alias(y, (2, 1))
    f = dg.exec(ops.mul(), x, y_t)
    dg.free(x)
    dg.free(y)
    (dy_t,) = dg.backward(f, [y_t])
    np.testing.assert_allclose(dy_t.numpy(), [[10.0], [10.0]], rtol=1e-6)
    for v in (y_t, f, dy_t):
        dg.free(v)
    assert (dg.num_nodes, dg.num_tensors) == (0, 0)


def test_backward_without_df_of_several_f_and_second_order() -> None:
    """Ones seeds beside a one-element f, and through ``create_graph``: jax.grad of the
    sums."""
    dg = DynamicGraph()
    bv, cv = F32([1.0, 2.0]), F32([3.0])
    b, c = dg.variable(bv), dg.variable(cv)
    gb, gc = dg.backward([b * c, (b * b).sum()], [b, c])

    def total(bb, cc):
        return jnp.sum(bb * cc) + jnp.sum(bb * bb)

    want_b, want_c = jax.grad(total, argnums=(0, 1))(bv, cv)
    np.testing.assert_allclose(gb.numpy(), want_b, rtol=1e-6)
    np.testing.assert_allclose(gc.numpy(), want_c, rtol=1e-6)
    av = F32([1.0, 2.0, 3.0])
    a = dg.variable(av)
    (g,) = dg.backward(a * a * a, [a], create_graph=True)
    (h,) = dg.backward(g, [a])
    want = jax.grad(lambda v: jnp.sum(jax.grad(lambda u: jnp.sum(u**3))(v)))(av)
    np.testing.assert_allclose(h.numpy(), want, rtol=1e-6)


@LAZY
def test_minimize_without_df_of_a_non_scalar_f(lazy: bool) -> None:
    """NNC's ccv_nnc_dynamic_graph_minimize seeds ones too: one SGD step on ``w * w``
    equals Optax's step from jax.grad of its sum."""
    wv = F32([1.0, -2.0, 0.5])
    dg = DynamicGraph(lazy=lazy)
    w = dg.variable(wv, name="w")
    dg.minimize(optax.sgd(0.1), w * w, [w])
    grads = jax.grad(lambda v: jnp.sum(v * v))(wv)
    opt = optax.sgd(0.1)
    updates, _ = opt.update(grads, opt.init(wv), wv)
    np.testing.assert_allclose(w.numpy(), optax.apply_updates(wv, updates), rtol=1e-6)


@pytest.fixture(scope="module")
def mul_model():
    a_in, b_in = Input(), Input()
    return Model([a_in, b_in], Mul(name="mul")(a_in, b_in))


@LAZY
def test_evaluate_writes_into_given_outputs(mul_model, lazy: bool) -> None:
    """NNC: "dynamic graph to evaluate cnnp model without any parameters", with NNC's
    output variable c (ccv_nnc_dynamic_graph_evaluate takes its outputs): c = 2.46,
    dc/da = 2; then in place (NNC's evaluate(linear, [y], [y])): a = a * b again."""
    dg = DynamicGraph(lazy=lazy)
    a = dg.variable(F32([1.23]), name="a")
    b = dg.variable(F32([2.0]), name="b")
    c = dg.variable(F32([0.0]), name="c")
    assert dg.evaluate(mul_model, [a, b], outputs=[c]) is c
    (da,) = dg.backward(c, [a])
    np.testing.assert_allclose(c.numpy(), [2.46], rtol=1e-6)
    np.testing.assert_allclose(da.numpy(), [2.0], rtol=1e-6)
    dg.evaluate(mul_model, [a, b], outputs=[a])
    np.testing.assert_allclose(a.numpy(), [2.46], rtol=1e-6)
    (db,) = dg.backward(a, [b])  # d(a0 * b)/db = a0
    np.testing.assert_allclose(db.numpy(), [1.23], rtol=1e-6)


def test_evaluate_outputs_mistakes(mul_model, monkeypatch) -> None:
    dg = DynamicGraph()
    a, b = dg.variable(F32([1.0]), name="a"), dg.variable(F32([2.0]), name="b")
    c = dg.variable(F32([0.0]), name="c")
    with pytest.raises(GraphError, match=r"pass outputs=\[y\]"):
        dg.evaluate(mul_model, [a, b], outputs=c)
    with monkeypatch.context() as m:  # refused before the model runs (no node, no stats)
        m.setattr(cnnp, "evaluate", lambda *a, **k: pytest.fail("the model ran"))
        with pytest.raises(GraphError, match="the model has 1 outputs, 2 were given"):
            dg.evaluate(mul_model, [a, b], outputs=[c, c])
    with pytest.raises(ShapeError, match="into variable 'c3'"):
        dg.evaluate(mul_model, [a, b], outputs=[dg.variable(np.zeros(3, F32), name="c3")])
