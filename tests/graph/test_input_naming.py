"""Graph inputs are named the same three ways everywhere: ``compile(donate=...)`` and
``backward(f, wrt)`` each take symbols, integer positions/ids and names."""

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import GraphError, GraphInputError
from fnnc.graph import GraphBuilder, backward, interpret
from fnnc.graph.memory import donated_positions


def _graph():
    b = GraphBuilder()
    x, w = b.input((3,), name="x"), b.input((3,), name="w")
    y = b.exec(ops.ewprod(), x, w, name="mul")
    return b, x, w, y


def test_donate_takes_symbols_names_and_positions():
    b, x, w, y = _graph()
    g = b.build([y])
    assert donated_positions(g, w) == donated_positions(g, "w") == donated_positions(g, 1) == (1,)
    assert donated_positions(g, [x, "w"]) == (0, 1)
    other = GraphBuilder().input((3,), name="z")
    with pytest.raises(GraphInputError, match=r"not an input of this graph.*\['x', 'w'\]"):
        donated_positions(g, other)


def test_backward_takes_names_as_it_takes_symbols():
    b, _, w, y = _graph()
    g = b.build([y])
    seed = np.ones(3, np.float32)
    by_name = backward(g, "mul", ["w"], df=seed)[0]
    by_symbol = backward(g, y, [w], df=seed)[0]
    xs = (np.array([1.0, 2.0, 3.0], np.float32), np.array([4.0, 5.0, 6.0], np.float32))
    _, vjp = jax.vjp(lambda a, c: a * c, *map(jax.numpy.asarray, xs))
    expected = np.asarray(vjp(np.ones(3, np.float32))[1])
    for graph in (by_name, by_symbol):
        np.testing.assert_allclose(np.asarray(interpret(graph, *xs)[-1]), expected)
    with pytest.raises(GraphError, match=r"names 'nope', which is no symbol of this graph"):
        backward(g, "nope", [w], df=seed)
