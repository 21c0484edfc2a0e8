"""evaluate: a whole graph (a program, a traced function) as one node gradients flow through."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fnnc import ops
from fnnc.graph import DynamicGraph, GraphBuilder, compile, interpret, trace
from tests.helpers import assert_close, rand

F32 = np.float32


def _layer():
    b = GraphBuilder()
    x, w = b.input((4, 3), name="x"), b.input((2, 3), name="w")
    return b.build([b.exec(ops.tanh(), b.exec(ops.gemm(transpose_b=True), x, w))])


def test_graph_and_program_run_as_one_node() -> None:
    graph = _layer()
    xs = rand((4, 3), seed=1), rand((2, 3), seed=2)
    for model in (graph, compile(graph)):
        dg = DynamicGraph()
        x, w = dg.variable(xs[0]), dg.variable(xs[1])
        y = dg.evaluate(model, [x, w])
        assert_close(y.numpy(), interpret(graph, *xs))
        assert dg.num_nodes == 1 and "call[2 inputs, 2 nodes, 1 outputs]" in str(dg)


def test_gradients_flow_through_a_traced_function() -> None:
    def fn(x, w):
        return jnp.sum(jnp.sin(x @ w.T) ** 2, axis=1)

    xs = rand((4, 3), seed=3), rand((2, 3), seed=4)
    graph = trace(fn, *xs)
    dg = DynamicGraph()
    x, w = dg.variable(xs[0]), dg.variable(xs[1])
    y = dg.evaluate(graph, [x, w])
    f = (y * y).sum()
    dx, dw = dg.backward(f, [x, w])
    want = jax.grad(lambda x, w: jnp.sum(fn(x, w) ** 2), argnums=(0, 1))(*xs)
    assert_close([dx.numpy(), dw.numpy()], list(want), rtol=1e-4, atol=1e-5)


def test_linear_model_trains_through_evaluate() -> None:
    """NNC's "dynamic graph to evaluate cnnp model": fit y = a * log(x) + b to 5."""
    b = GraphBuilder()
    x, w, bias = b.input((1, 1)), b.input((1, 1)), b.input((1,))
    linear = b.build([b.exec(ops.gemm(transpose_b=True), x, w, bias)])
    dg = DynamicGraph()
    w = dg.variable(F32([[0.3]]), name="w")
    bias = dg.variable(F32([0.0]), name="b")
    z = dg.constant(F32([[5.0]]))
    opt = optax.sgd(0.05)
    for _ in range(200):
        x = dg.constant(F32([[10.0]]))
        y = dg.evaluate(linear, [dg.exec(ops.ewlog(), x), w, bias])
        d = y - z
        dg.backward((d * d).sum(), [w, bias])
        dg.apply_gradients(opt, [w, bias])
    y = dg.evaluate(linear, [dg.constant(F32([[np.log(10.0)]])), w, bias])
    assert abs(float(y.numpy()[0, 0]) - 5.0) < 1e-2
    assert dg.num_compiled <= 3


def test_multiple_outputs_and_unused_gradients() -> None:
    b = GraphBuilder()
    x = b.input((3,), name="x")
    graph = b.build([b.exec(ops.ewexp(), x), b.exec(ops.scalar_mul(a=2.0), x)])
    dg = DynamicGraph()
    x = dg.variable(F32([0.0, 1.0, 2.0]))
    e, t = dg.evaluate(graph, [x])
    (dx,) = dg.backward(t.sum(), [x])
    np.testing.assert_allclose(dx.numpy(), [2.0, 2.0, 2.0])
    (dx,) = dg.backward(e.sum(), [x])
    np.testing.assert_allclose(dx.numpy(), 2.0 + np.exp([0.0, 1.0, 2.0]), rtol=1e-6)
