"""dce: dead nodes go; effectful nodes and writers of live views stay."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from jax import lax

from fnnc import ops
from fnnc.graph import GraphBuilder
from fnnc.graph.passes import dce
from fnnc.ops.primitive import primitive_command
from tests.graph.strategies import graphs
from tests.helpers import assert_pass_keeps_semantics, rand

SETTINGS = settings(max_examples=60)


def test_golden_dead_chain_goes() -> None:
    b = GraphBuilder()
    x = b.input((2,), name="x")
    dead = b.exec(ops.ewexp(), x, name="dead")
    b.exec(ops.ewsum(), dead, x, name="dead_too")
    graph = b.build([b.exec(ops.relu(), x, name="y")])
    new = assert_pass_keeps_semantics(dce, graph, [rand((2,))])
    assert str(new) == ("graph(%0:f32[2] x) {\n  %1:f32[2] = relu(%0)  # y\n  return %1\n}")


def test_live_graph_is_returned_as_is() -> None:
    b = GraphBuilder()
    x = b.input((2,))
    graph = b.build([b.exec(ops.relu(), x)])
    assert dce(graph) is graph


def test_effectful_nodes_stay() -> None:
    b = GraphBuilder()
    x = b.input((2,), name="x")
    b.exec(primitive_command(lax.erf_p, {}, [((2,), np.float32)], effects=True), x)
    b.exec(ops.ewexp(), x)
    graph = b.build([b.exec(ops.relu(), x)])
    new = assert_pass_keeps_semantics(dce, graph, [rand((2,))])
    assert [n.cmd.name for n in new.nodes] == ["effectful_primitive", "relu"]


def test_writers_of_live_views_stay() -> None:
    b = GraphBuilder()
    x = b.input((2,), name="x")
    whole = b.tensor((4,), name="whole")
    lo = b.alias(whole, (2,), name="lo")
    hi = b.alias(whole, (2,), offset=(2,), name="hi")
    b.exec(ops.relu(), x, outputs=[lo])
    b.exec(ops.ewexp(), x, outputs=[hi])
    b.exec(ops.tanh(), x, name="dead")
    # Only a view of `whole` is read, but both writes of the root stay.
    out = b.exec(ops.ewsum(), b.alias(whole, (3,), offset=(1,)))
    graph = b.build([out])
    new = assert_pass_keeps_semantics(dce, graph, [rand((2,))])
    assert [n.cmd.name for n in new.nodes] == ["relu", "ewexp", "ewsum"]


def test_unread_view_writes_go() -> None:
    b = GraphBuilder()
    x = b.input((2,), name="x")
    whole = b.tensor((4,))
    b.exec(ops.relu(), x, outputs=[b.alias(whole, (2,))])
    graph = b.build([b.exec(ops.ewexp(), x)])
    new = assert_pass_keeps_semantics(dce, graph, [rand((2,))])
    assert [n.cmd.name for n in new.nodes] == ["ewexp"]
    assert len(new.symbols) == 2


@SETTINGS
@given(graphs(max_nodes=8))
def test_random_graphs(case) -> None:
    graph, arrays = case
    new = assert_pass_keeps_semantics(dce, graph, arrays)
    assert len(new.nodes) <= len(graph.nodes)
