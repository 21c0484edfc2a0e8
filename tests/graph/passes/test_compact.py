"""compact: unreferenced symbols go, ids stay dense and in order, aliases follow roots."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings

from fnnc import ops
from fnnc.graph import GraphBuilder, verify
from fnnc.graph.passes import compact
from tests.graph.strategies import graphs
from tests.helpers import assert_pass_keeps_semantics, rand

SETTINGS = settings(max_examples=50)


def _with_holes():
    """A graph with two unreferenced symbols before a view and its root."""
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    b.tensor((5,), name="unused")
    y = b.exec(ops.relu(), x, name="y")
    b.alias(y, (3,), name="unused_view")
    row = b.alias(y, (1, 3), offset=(1, 0), name="row")
    return b.build([b.exec(ops.ewexp(), row, name="e")])


def test_drops_unreferenced_symbols_and_renumbers() -> None:
    graph = _with_holes()
    assert str(graph) == (
        "graph(%0:f32[2,3] x) {\n"
        "  tensor %1:f32[5]  # unused\n"
        "  %3:f32[3] = alias %2[base=0, stride=(1,)]  # unused_view\n"
        "  %4:f32[1,3] = alias %2[base=3, stride=(3,1)]  # row\n"
        "  %2:f32[2,3] = relu(%0)  # y\n"
        "  %5:f32[1,3] = ewexp(%4)  # e\n"
        "  return %5\n"
        "}"
    )
    new = assert_pass_keeps_semantics(compact, graph, [rand((2, 3))])
    assert str(new) == (
        "graph(%0:f32[2,3] x) {\n"
        "  %2:f32[1,3] = alias %1[base=3, stride=(3,1)]  # row\n"
        "  %1:f32[2,3] = relu(%0)  # y\n"
        "  %3:f32[1,3] = ewexp(%2)  # e\n"
        "  return %3\n"
        "}"
    )
    assert [s.id for s in new.symbols] == list(range(len(new.symbols)))


def test_compact_graph_is_returned_as_is() -> None:
    b = GraphBuilder()
    x = b.input((2,))
    graph = b.build([b.exec(ops.relu(), x)])
    assert compact(graph) is graph


def test_unused_inputs_stay() -> None:
    b = GraphBuilder()
    b.input((2,), name="unused")
    x = b.input((2,), name="x")
    graph = b.build([x])
    assert compact(graph) is graph


def test_dropped_node_leaves_its_output_to_compact() -> None:
    b = GraphBuilder()
    x = b.input((2,), name="x")
    b.exec(ops.ewexp(), x)
    r = b.exec(ops.relu(), x)
    graph = b.build([r])
    cut = dataclasses.replace(graph, nodes=graph.nodes[1:])
    new = verify(compact(cut))
    assert len(new.symbols) == 2
    np.testing.assert_array_equal(new.nodes[0].inputs, (0,))


@SETTINGS
@given(graphs(max_nodes=6))
def test_random_graphs(case) -> None:
    graph, arrays = case
    # Nodes whose results nothing reads go, leaving their symbols unreferenced.
    syms = graph.symbols
    read = {syms[s].root for n in graph.nodes for s in n.inputs}
    read |= {syms[s].root for s in graph.outputs}
    kept = tuple(n for n in graph.nodes if any(syms[o].root in read for o in n.outputs))
    holed = dataclasses.replace(graph, nodes=kept)
    new = assert_pass_keeps_semantics(compact, holed, arrays)
    old = iter((s.name, s.shape) for s in syms)
    assert all(any(o == (s.name, s.shape) for o in old) for s in new.symbols), "order changed"
