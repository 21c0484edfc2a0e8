"""Audit 11 of the simplifying passes and the rewrite toolkit (fuse, Rewriter, ...)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

from fnnc import ops
from fnnc.errors import FnncError, GraphError
from fnnc.graph import (
    GraphBuilder,
    Pat,
    Rewriter,
    Rule,
    compact,
    cse,
    dce,
    fold,
    fuse,
    graph_rewrite,
    inline,
    interpret,
    simplify,
    trace,
)

X = np.array([[0.1, -1.0, 2.0], [0.3, 0.5, -0.2]], np.float32)


def _entropy(x):
    """The binary entropy of sigmoid(x), summed over the last axis (float64)."""
    p = 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))
    return -(p * np.log(p) + (1 - p) * np.log1p(-p)).sum(-1, keepdims=True)


def _sigmoid_entropy():
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    p = b.exec(ops.sigmoid(), x, name="p")
    return b, b.exec(ops.binary_crossentropy(), p, p, name="entropy")


def test_fuse_keeps_binary_crossentropy_of_a_sigmoid_with_itself() -> None:
    # binary_crossentropy(sigmoid(x), sigmoid(x)) (an entropy term) was fused into
    # sigmoid_binary_crossentropy(x, p) writing p: a node reading its own output.
    b, h = _sigmoid_entropy()
    graph = b.build([h])
    assert fuse(graph) is graph
    np.testing.assert_allclose(interpret(simplify(graph), X), _entropy(X), rtol=1e-5)


def test_rewriter_tells_equal_effect_nodes_apart() -> None:
    # Two io_callbacks of one value are equal nodes (no outputs); Rewriter.index looked
    # nodes up by equality, so removing the first one removed the last: the callbacks
    # then ran y, z instead of z, y.
    seen = []

    def record(v):
        seen.append(float(np.asarray(v)[0]))

    def f(x):
        y, z = jnp.sin(x), jnp.cos(x)
        for v in (y, z, y):
            io_callback(record, None, v, ordered=True)
        return y

    graph = trace(f, jnp.zeros(2))
    rw = Rewriter(graph)
    first, _, last = rw.find("effectful_primitive")
    assert (rw.index(first), rw.index(last)) == (graph.nodes.index(first), len(graph.nodes) - 1)
    rw.remove(first)
    interpret(rw.finish(), np.zeros(2, np.float32))
    assert seen == [np.cos(0.0), np.sin(0.0)]


def test_a_constant_pattern_of_another_shape_does_not_match() -> None:
    # Pat.const(array) compared with ==, which raised NumPy's "operands could not be
    # broadcast" from inside the match for a constant of another shape.
    b = GraphBuilder()
    x = b.input((3,), name="x")
    graph = b.build([b.exec(ops.ewsum(), x, b.constant(np.float32([1, 2, 3])))])

    def dropped(value):
        rule = Rule(Pat.op("ewsum", Pat.var("x"), Pat.const(np.float32(value))), lambda m: m["x"])
        return graph_rewrite(graph, [rule])

    assert dropped([1, 2]) is graph and dropped([1, 2, 4]) is graph
    xv = np.float32([0.5, -1.0, 2.0])
    np.testing.assert_array_equal(interpret(graph, xv), xv + np.float32([1, 2, 3]))
    np.testing.assert_array_equal(interpret(dropped([1, 2, 3]), xv), xv)


@pytest.mark.parametrize(
    "call, says",
    [
        (lambda g: cse(None), "cse: expected a fnnc.graph.Graph, got NoneType"),
        (lambda g: dce("g"), "dce: expected a fnnc.graph.Graph, got str"),
        (lambda g: compact(None), "compact: expected a fnnc.graph.Graph"),
        (lambda g: fuse(None), "fuse: expected a fnnc.graph.Graph"),
        (lambda g: graph_rewrite(None, []), "graph_rewrite: expected a fnnc.graph.Graph"),
        (lambda g: fuse(g, min_length="2"), "min_length is the fewest nodes .* got '2'"),
        (lambda g: fold(g, max_elements=-1), "max_elements is .* an int >= 0; got -1"),
        (lambda g: simplify(g, max_rounds="2"), "max_rounds is an int >= 1 .* got '2'"),
        (lambda g: simplify(g, max_rounds=0), "max_rounds is an int >= 1 .* got 0"),
    ],
)
def test_passes_say_what_they_expect(call, says) -> None:
    # the passes died with AttributeError ('NoneType' object has no attribute 'nodes')
    # or TypeError ('>' not supported between 'int' and 'str'); simplify(max_rounds=0)
    # silently returned the graph unsimplified.
    b = GraphBuilder()
    graph = b.build([b.exec(ops.relu(), b.input((2,)))])
    with pytest.raises(GraphError, match=says):
        call(graph)


@pytest.mark.parametrize(
    "graph_or, args, says",
    [
        ("g", None, "inline: expected a fnnc.graph.Graph, got str"),
        (None, "sym", "args is one symbol per graph input, a list; got TensorSymbol"),
        (None, [None], r"input %0 \(x\) is fed NoneType None; feed symbols"),
        (None, [np.zeros(2, np.float32)], "is fed ndarray"),
    ],
)
def test_inline_says_what_it_expects(graph_or, args, says) -> None:
    # inline died with AttributeError ('NoneType' object has no attribute 'shape',
    # 'str' object has no attribute 'inputs') or a TypeError (len() of a symbol)
    inner = GraphBuilder()
    graph = inner.build([inner.exec(ops.relu(), inner.input((2,), name="x"))])
    b = GraphBuilder()
    y = b.input((2,), name="y")
    with pytest.raises(FnncError, match=says):
        inline(b, graph_or or graph, [y] if args is None else y if args == "sym" else args)
    (out,) = inline(b, graph, [y])  # the builder still works
    xv = np.float32([-1.0, 2.0])
    np.testing.assert_array_equal(interpret(b.build([out]), xv), np.maximum(xv, 0))
