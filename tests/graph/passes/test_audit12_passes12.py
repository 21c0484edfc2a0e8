"""Audit 12 (passes): graph passes checked against interpret, jax.grad and Optax."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import DTypeError, ShapeError
from fnnc.graph import GraphBuilder, interpret
from fnnc.graph.passes import minimize, minimize_scaled


def _loss_graph():
    b = GraphBuilder()
    w, x = b.input((3,), name="w"), b.input((3,), name="x")
    h = b.exec(ops.ewprod(), w, x, name="h")
    index = b.exec(ops.argmax(axis=0), h, name="am")
    loss = b.exec(ops.reduce_sum(axes=(0,)), h, name="loss")
    return b.build([loss, index]), w, h, index


@pytest.mark.parametrize("step", [minimize, minimize_scaled])
def test_minimize_refuses_a_loss_without_gradient_or_of_several_elements(step):
    # an int loss (argmax) had given a step that never changed the parameters (zero
    # gradients); a vector loss was told to pass backward's df=, which no step takes
    graph, w, h, index = _loss_graph()
    with pytest.raises(DTypeError, match=rf"{step.__name__}: loss %\d+ \(am\) is int32\[1\]"):
        step(graph, index, [w], optax.sgd(0.1))
    with pytest.raises(ShapeError, match=rf"{step.__name__}: loss %\d+ \(h\) is float32\[3\]"):
        step(graph, h, [w], optax.sgd(0.1))
    with pytest.raises(ShapeError, match="reduce it to one"):
        step(graph, "w", [w], optax.sgd(0.1))


def test_minimize_of_a_scalar_loss_steps_as_optax():
    graph, w, _, _ = _loss_graph()
    step, layout = minimize(graph, "loss", [w], optax.sgd(0.1))
    x = np.arange(3, dtype=np.float32)
    w1, _, loss = layout.split(interpret(step, np.ones(3, np.float32), x))
    # oracle: d(sum(w * x))/dw = x, SGD: w - 0.1 x
    np.testing.assert_allclose(np.asarray(w1[0]), 1.0 - 0.1 * x, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(loss), [3.0])
