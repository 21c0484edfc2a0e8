"""GraphBuilder's auto shapes (NNC's ``ccv_nnc_tensor_symbol_new`` with auto
parameters): the node that writes a shape-less symbol fills its spec; a graph input gets
its shape from ``set_shape`` before build (tests/graph/test_set_shape.py); a symbol that
still has none at build is a GraphError naming it, as are malformed shapes."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import DTypeError, GraphError
from fnnc.graph import GraphBuilder, interpret
from tests.helpers import assert_close, rand


def test_the_writer_fills_an_auto_output() -> None:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    w = b.input((4, 3), name="w")
    h = b.tensor(None, name="h")
    filled = b.exec(ops.gemm(transpose_b=True), x, w, outputs=[h], name="fc")
    assert h.shape is None  # the handed-out symbol stays a value...
    assert filled.shape == (2, 4) and filled.dtype == np.float32 and filled.id == h.id
    y = b.exec(ops.relu(), h)  # ...and keeps working as the filled symbol
    graph = b.build([y, h])
    assert graph.output_specs[1].shape == (2, 4)
    xs, ws = rand((2, 3)), rand((4, 3), seed=1)
    got_y, got_h = interpret(graph, xs, ws)
    assert_close(got_h, xs @ ws.T)
    assert_close(got_y, np.maximum(xs @ ws.T, 0))


def test_auto_dtype_comes_from_the_writer_unless_given() -> None:
    b = GraphBuilder()
    x = b.input((3,), np.int32, name="x")
    t = b.exec(ops.argmax(axis=0), x, outputs=[b.tensor(None)])
    assert t.dtype == np.int32 and t.shape == (1,)
    wrong = b.tensor(None, np.float32, name="wrong")
    with pytest.raises(DTypeError, match="wrong"):
        b.exec(ops.argmax(axis=0), x, outputs=[wrong])


def test_auto_symbol_read_before_it_is_written() -> None:
    b = GraphBuilder()
    t = b.tensor(None, name="t")
    with pytest.raises(GraphError, match=r"%0 \(t\) has no shape yet.*outputs=\[it\]"):
        b.exec(ops.relu(), t)
    with pytest.raises(GraphError, match=r"%0 \(t\) has no shape yet"):
        b.alias(t, (2,))


def test_unwritten_auto_tensor_fails_at_build() -> None:
    b = GraphBuilder()
    x = b.input((2,), name="x")
    b.tensor(None, name="loose")
    with pytest.raises(GraphError, match=r"build: tensor %1 \(loose\).*no shape"):
        b.build([b.exec(ops.relu(), x)])


def test_input_without_a_shape_must_get_one_before_build() -> None:
    b = GraphBuilder()
    x = b.input(None, name="x")
    with pytest.raises(
        GraphError, match=r"build: graph input %0 \(x\), which has no shape.*set_shape"
    ):
        b.build([x])
    y = b.exec(ops.relu(), x)  # NNC: nodes may read it before its shape is set
    with pytest.raises(GraphError, match=r"build: node relu reads graph input %0 \(x\).*set_shape"):
        b.build([y])
    z = b.input((2,), name="z")
    with pytest.raises(GraphError, match="no node writes a graph input"):
        b.exec(ops.relu(), z, outputs=[x])


@pytest.mark.parametrize("shape", [3, (2, "a"), (2, -1), (1.5,), "23"])
def test_malformed_shapes_are_graph_errors(shape) -> None:
    with pytest.raises(GraphError, match=r"input 'x': shape .* is not a sequence"):
        GraphBuilder().input(shape, name="x")
    with pytest.raises(GraphError, match=r"tensor: shape .*auto shape"):
        GraphBuilder().tensor(shape)


def test_malformed_dtype_is_a_dtype_error() -> None:
    with pytest.raises(DTypeError, match=r"input 'x': dtype 'nope' is not a dtype"):
        GraphBuilder().input((2,), "nope", name="x")


def test_other_slips_are_graph_errors_not_type_errors() -> None:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    with pytest.raises(GraphError, match=r"build: outputs takes a list.*\[x\]"):
        b.build(x)
    with pytest.raises(GraphError, match=r"outputs= takes a list.*\[t\]"):
        b.exec(ops.relu(), x, outputs=b.tensor((2, 3), name="t"))
    with pytest.raises(GraphError, match=r"alias of %0 \(x\): shape 6 is not a sequence"):
        b.alias(x, 6)
    with pytest.raises(GraphError, match=r"stride 1 is not a sequence of ints"):
        b.alias(x, (6,), stride=1)
    with pytest.raises(GraphError, match=r"offset \('a',\) is not a sequence of ints"):
        b.alias(x, (3,), offset=("a",))
    assert b.build(s for s in [x]).outputs == (0,)  # any iterable of symbols is fine
