"""NNC's ``custom.tests.c`` (liuliu/ccv ``test/unit/nnc/``), translated, and what it
needs: a compiled program called under a JAX transformation.

NNC's custom command runs a dynamic graph inside its forward (``log(log(x))``) and
inside its backward (the dynamic graph's own backward). In fnnc the custom command is
``ops.defcommand``; its forward and backward run traced inside the compiled graph, so
the dynamic graph they use sees tracers, and the program its backward compiles must be
callable under a trace. The same path lets ``jax.jit``, ``jax.grad`` and ``jax.vmap``
take a :class:`~fnnc.graph.compile.Program`.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.core import command as command_module
from fnnc.core.command import Spec
from fnnc.graph import DynamicGraph, GraphBuilder, compile, interpret
from fnnc.graph.passes.backward import backward


def _loglog_in_a_dynamic_graph(x):
    dg = DynamicGraph()
    z = dg.exec(ops.ewlog(), dg.variable(x))
    return dg.exec(ops.ewlog(), z)


@pytest.fixture(scope="module")
def loglog():
    """NNC's custom command, registered for this module only (the registry is global)."""

    @ops.defcommand(family="custom", shape=lambda x: Spec(x.shape, x.dtype), name="test_nnc_loglog")
    def _loglog(x):
        """log(log(x)), computed by a dynamic graph (custom.tests.c's forward)."""
        return _loglog_in_a_dynamic_graph(x).value

    @_loglog.backward
    def _loglog_backward(grads, inputs, outputs):
        (g,), (x,) = grads, inputs
        dg = DynamicGraph()
        xv = dg.variable(x)
        z = dg.exec(ops.ewlog(), xv)
        y = dg.exec(ops.ewlog(), z)
        (dx,) = dg.backward(y, [xv], df=[dg.constant(g)])
        return (dx.value,)

    yield _loglog
    command_module._REGISTRY.pop("test_nnc_loglog")


def _custom_graph(loglog):
    b = GraphBuilder()
    x = b.input((1,), np.float32, "x")
    y = b.exec(loglog(), x, name="custom")
    return b.build(outputs=[y])


X = np.float32([10.0])


def test_custom_forward_operation_with_dynamic_graph(loglog) -> None:
    """NNC TEST_CASE covered here:
    "custom forward operation with dynamic graph".
    """
    graph = _custom_graph(loglog)
    want = np.log(np.log(10.0))
    for run in (compile(graph), lambda a: interpret(graph, a)):
        np.testing.assert_allclose(np.asarray(run(X)), [want], atol=1e-5)


def test_custom_backward_operation_with_dynamic_graph(loglog) -> None:
    """NNC TEST_CASE covered here:
    "custom backward operation with dynamic graph".
    """
    graph = _custom_graph(loglog)
    grad_graph, (dx,) = backward(graph, graph.outputs[0], [graph.inputs[0]])
    assert dx.id in grad_graph.outputs
    want = 1.0 / (np.log(10.0) * 10.0)
    for run in (compile(grad_graph), lambda a: interpret(grad_graph, a)):
        _, got = run(X)
        np.testing.assert_allclose(np.asarray(got), [want], atol=1e-5)


@pytest.fixture(scope="module")
def exp_sum():
    b = GraphBuilder()
    x = b.input((3,), np.float32, "x")
    y = b.exec(ops.reduce_sum(axes=(0,)), b.exec(ops.ewexp(), x))
    return compile(b.build(outputs=[y]))


V = np.float32([0.1, 0.2, 0.3])


def test_a_program_runs_inside_jax_jit(exp_sum) -> None:
    got = jax.jit(lambda a: exp_sum(a) * 2)(V)
    np.testing.assert_allclose(got, [2 * np.exp(V).sum()], rtol=1e-6)


def test_jax_grad_differentiates_through_a_program(exp_sum) -> None:
    got = jax.grad(lambda a: exp_sum(a)[0])(V)
    np.testing.assert_allclose(got, np.exp(V), rtol=1e-6)


def test_jax_vmap_maps_a_program_over_a_batch(exp_sum) -> None:
    batch = np.stack([V, 2 * V])
    got = jax.vmap(exp_sum)(batch)
    np.testing.assert_allclose(got[:, 0], np.exp(batch).sum(axis=1), rtol=1e-6)
