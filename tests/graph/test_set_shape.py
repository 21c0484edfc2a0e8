"""A graph input's shape set after the computation is written (NNC's
``ccv_nnc_tensor_symbol_set``; issue 25, item 8): the shapes depending on it are inferred
at build. Oracles: NumPy values and ``jax.grad``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import GraphError, ShapeError
from fnnc.graph import GraphBuilder, backward, compile, interpret
from tests.helpers import assert_close, rand


def test_set_tensor_symbol_shape_after_computation_specified() -> None:
    """NNC's test of that name (test/unit/nnc/symbolic.graph.tests.c), translated.

    NNC TEST_CASE covered here:
    "set tensor symbol shape after computation specified".
    """
    b = GraphBuilder()
    a = b.input(None, name="a")
    out = b.tensor(None, name="b")
    b.exec(ops.ewlog(), a, outputs=[out], name="log")
    b.set_tensor_symbol_shape(a, (1,))
    graph = b.build([out])
    got = compile(graph)(np.float32([1.25]))
    assert got.shape == (1,)
    assert abs(float(got[0]) - np.log(np.float32(1.25))) < 1e-5


def _mlp(b: GraphBuilder):
    x = b.input(None, name="x")
    w = b.input((4, 3), name="w")
    h = b.exec(ops.gemm(transpose_b=True), x, w, name="fc")
    y = b.exec(ops.relu(), h, name="act")
    s = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.ewprod(), y, y))
    return x, w, h, s


def _want(xs, ws):
    return jnp.sum(jax.nn.relu(xs @ ws.T) ** 2)


def test_dependent_shapes_are_inferred_at_build_and_again_after_another_set() -> None:
    b = GraphBuilder()
    x, w, h, s = _mlp(b)
    assert h.shape is None and s.shape is None  # as in NNC until compile
    ws = rand((4, 3), seed=1)
    for batch in (2, 5):  # set, build, set again, build again
        b.set_shape(x, (batch, 3))
        graph = b.build([s, h])
        assert graph.symbols[h.id].shape == (batch, 4)
        assert graph.output_specs[0].shape == (1, 1)
        xs = rand((batch, 3), seed=batch)
        got_s, got_h = interpret(graph, xs, ws)
        np.testing.assert_allclose(got_h, xs @ ws.T, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_s.reshape(()), _want(xs, ws), rtol=1e-5)
        grad_graph, _ = backward(graph, s.id, [x.id, w.id])  # the built graph's symbols
        dx, dw = compile(grad_graph)(xs, ws)[2:]
        want = jax.grad(_want, argnums=(0, 1))(xs, ws)
        assert_close([dx, dw], list(want), rtol=1e-5, atol=1e-5)


def test_symbols_handed_out_before_the_shape_stay_usable() -> None:
    b = GraphBuilder()
    x = b.input(None, np.int32, name="x")
    first = b.set_shape(x, (3,))
    assert first.shape == (3,) and first.dtype == np.int32  # input()'s dtype is kept
    b.set_shape(first, (2, 2))  # the earlier result names the same input
    y = b.exec(ops.ewsum(), x, first)
    graph = b.build([y])
    assert graph.output_specs[0].shape == (2, 2) and graph.output_specs[0].dtype == np.int32
    xs = np.arange(4, dtype=np.int32).reshape(2, 2)
    np.testing.assert_array_equal(interpret(graph, xs), 2 * xs)


def test_a_shape_rule_that_rejects_the_set_shape_names_the_node_at_build() -> None:
    b = GraphBuilder()
    x, _, _, s = _mlp(b)
    b.set_shape(x, (2, 5))
    with pytest.raises(ShapeError, match=r"build: node 'fc' \(gemm\).*\n  inputs: %0 \(x\)"):
        b.build([s])
    b.set_shape(x, (2, 3))  # set it right, build again
    assert b.build([s]).output_specs[0].shape == (1, 1)


def test_unset_inputs_and_misused_set_shape_are_graph_errors() -> None:
    b = GraphBuilder()
    x, w, h, s = _mlp(b)
    with pytest.raises(GraphError, match=r"build: node 'fc' \(gemm\) reads graph input %0 \(x\)"):
        b.build([s])
    with pytest.raises(GraphError, match=r"set_shape %1 \(w\): .*made with shape \[4, 3\]"):
        b.set_shape(w, (4, 3))
    with pytest.raises(GraphError, match=r"set_shape %2 \(fc\): .*not a graph input"):
        b.set_shape(h, (2, 4))
    with pytest.raises(GraphError, match=r"alias of %0 \(x\): its shape is known only at build"):
        b.alias(x, (6,))
    with pytest.raises(GraphError, match=r"set_shape %0 \(x\): shape 'ab' is not a sequence"):
        b.set_shape(x, "ab")


def test_a_pending_node_with_several_outputs_asks_for_them() -> None:
    b = GraphBuilder()
    x = b.input(None, name="x")
    y = b.exec(ops.layer_norm(), x, name="ln")  # 3 outputs; x has no shape to count them
    b.set_shape(x, (2, 3))
    with pytest.raises(GraphError, match=r"node 'ln' \(layer_norm\) makes 3 outputs.*outputs="):
        b.build([y])
    b = GraphBuilder()
    x = b.input(None, name="x")
    outs = [b.tensor(None) for _ in range(3)]
    normed = b.exec(ops.layer_norm(), x, outputs=outs)[0]
    b.set_shape(x, (2, 3))
    graph = b.build([normed])
    xs = rand((2, 3), seed=4)
    mean, var = xs.mean(-1, keepdims=True), xs.var(-1, keepdims=True)
    np.testing.assert_allclose(
        interpret(graph, xs), (xs - mean) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5
    )
