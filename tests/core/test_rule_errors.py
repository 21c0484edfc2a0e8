"""A shape rule that chokes on a right-kind parameter with wrong contents
(``reduce_sum(axes=("a",))``) gives a named :class:`RuleError` on every path: the
eager call, the builder, the dynamic graph, and a loaded file (there a
:class:`GraphFormatError`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fnnc import errors, ops
from fnnc.graph import DynamicGraph, GraphBuilder, load, save


def _bad():
    return ops.reduce_sum(axes=("a",))


def test_eager_call_names_command_and_parameters():
    """The eager call raises RuleError (a CommandError and a TypeError) naming the command."""
    with pytest.raises(errors.RuleError, match=r"reduce_sum.*axes.*float32\[2, 3\]") as info:
        _bad()(np.ones((2, 3), np.float32))
    assert isinstance(info.value, errors.CommandError)
    assert isinstance(info.value, TypeError)


def test_builder_names_the_node():
    """GraphBuilder.exec adds the node's name and its inputs to the rule's error."""
    b = GraphBuilder()
    x = b.input((2, 3), "float32", "x")
    with pytest.raises(errors.RuleError, match=r"node 'r'(.|\n)*inputs: %0 \(x\)"):
        b.exec(_bad(), x, name="r")


def test_dynamic_graph_raises_rule_error():
    """The dynamic graph's exec raises the same named error."""
    dg = DynamicGraph()
    x = dg.variable(np.ones((2, 3), np.float32))
    with pytest.raises(errors.RuleError, match="reduce_sum"):
        dg.exec(_bad(), x)


def test_real_shape_mismatch_is_not_a_rule_error():
    """A genuine shape mismatch stays a ShapeError (the rule's own named error)."""
    with pytest.raises(errors.ShapeError):
        ops.gemm()(np.ones((2, 3), np.float32), np.ones((4, 5), np.float32))
    with pytest.raises(errors.ShapeError):
        ops.reduce_sum(axes=(5,))(np.ones((2, 3), np.float32))


def test_loaded_file_with_wrong_contents_is_a_format_error(tmp_path):
    """A graph file whose axes hold strings loads as GraphFormatError naming node and fix."""
    b = GraphBuilder()
    x = b.input((2, 3), "float32", "x")
    y = b.exec(ops.reduce_sum(axes=(1,)), x, name="r")
    path = tmp_path / "g.json"
    save(b.build([y]), path)
    data = json.loads(path.read_text())
    (node,) = data["nodes"]
    assert node["cmd"]["params"] == [["axes", {"$tuple": [1]}]]
    node["cmd"]["params"] = [["axes", {"$tuple": ["a"]}]]
    path.write_text(json.dumps(data))
    with pytest.raises(errors.GraphFormatError, match=r"node 0 \(r\).*reduce_sum"):
        load(path)


def test_backward_reading_a_tensor_it_does_not_keep_names_the_fix(restore_registries):
    """A command whose backward computes with an input outside its ``uses`` (given only
    as a spec) fails with a CommandError naming the command and what it keeps, not
    JAX's ShapeDtypeStruct TypeError."""
    from fnnc.core.command import Uses, defcommand
    from fnnc.graph import GraphBuilder, backward, compile

    def shape(x, y):
        return x

    @defcommand(family="test", shape=shape, uses=Uses(inputs=(1,)), name="audit_keeps_y")
    def keeps_y(x, y):
        return x * y

    @keeps_y.backward
    def _(grads, ins, outs):
        (g,) = grads
        x, y = ins
        return g * y, g * x  # x is not kept: it is a spec here

    b = GraphBuilder()
    x, y = b.input((3,), name="x"), b.input((3,), name="y")
    out = b.exec(keeps_y(), x, y)
    loss = b.exec(ops.reduce_sum(axes=(0,)), out)
    graph, _ = backward(b.build([loss]), loss, [x, y])
    ones = np.ones(3, np.float32)
    with pytest.raises(errors.CommandError, match=r"audit_keeps_y.*keeps \['input 1'\]"):
        compile(graph)(ones, ones)
