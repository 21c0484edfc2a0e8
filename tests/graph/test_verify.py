"""verify: every structural rule is caught with a GraphError that names the node or
symbol and prints the listing, marking the offending node with ``>>``.

Broken graphs are made from valid ones with ``dataclasses.replace`` (the builder
refuses most of them up front), or built with checks off.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from hypothesis import given, settings

from fnnc import config, ops
from fnnc.errors import GraphError
from fnnc.graph import Graph, GraphBuilder, verify
from tests.graph.strategies import graphs


def _expect(graph: Graph, *fragments: str, marked: str | None) -> str:
    """verify(graph) raises GraphError containing ``fragments`` and the listing; the
    ``>>`` line (if ``marked``) is the node line containing ``marked``."""
    with pytest.raises(GraphError) as info:
        verify(graph)
    msg = str(info.value)
    assert msg.startswith("verify: ")
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in:\n{msg}"
    assert "\ngraph(" in msg and msg.rstrip().endswith("}"), f"no listing in:\n{msg}"
    arrows = [line for line in msg.splitlines() if line.startswith(">>")]
    if marked is None:
        assert arrows == []
    else:
        assert len(arrows) == 1 and marked in arrows[0], f"marker not on {marked!r}:\n{msg}"
    return msg


def _chain() -> Graph:
    """x -> e = exp(x) -> a = abs(e) -> s = a + x, plus an unused input y."""
    b = GraphBuilder()
    x = b.input((4,), name="x")
    b.input((4,), name="y")
    e = b.exec(ops.ewexp(), x, name="e")
    a = b.exec(ops.ewabs(), e, name="a")
    s = b.exec(ops.ewsum(), a, x, name="s")
    return b.build([s])


def _replace_node(graph: Graph, index: int, **changes) -> Graph:
    nodes = list(graph.nodes)
    nodes[index] = dataclasses.replace(nodes[index], **changes)
    return dataclasses.replace(graph, nodes=tuple(nodes))


def _replace_symbol(graph: Graph, sid: int, **changes) -> Graph:
    symbols = list(graph.symbols)
    symbols[sid] = dataclasses.replace(symbols[sid], **changes)
    return dataclasses.replace(graph, symbols=tuple(symbols))


def test_valid_graph_is_returned_as_is() -> None:
    graph = _chain()
    assert verify(graph) is graph


@settings(max_examples=40)
@given(graphs())
def test_random_graphs_verify(case) -> None:
    graph, _ = case
    assert verify(graph) is graph


def test_read_before_written() -> None:
    graph = _chain()
    swapped = dataclasses.replace(graph, nodes=(graph.nodes[1], graph.nodes[0], graph.nodes[2]))
    _expect(swapped, "node 0 (ewabs) reads %2 (e) before it is written", marked="ewabs(%2)  # a")


def test_symbol_written_twice() -> None:
    graph = _chain()
    twice = _replace_node(graph, 2, outputs=(3,))  # s overwrites a
    twice = dataclasses.replace(twice, outputs=(3,))
    _expect(
        twice,
        "node 2 writes %3 (a), which was written by node 1",
        "SSA",
        marked="ewsum(%3, %0)  # s",
    )


def test_graph_input_written_by_a_node() -> None:
    graph = _chain()
    bad = _replace_node(graph, 1, outputs=(1,))  # a overwrites the (unread) input y
    _expect(bad, "node 1 writes %1 (y), which is a graph input", marked="ewabs(%2)  # a")


def test_write_after_read() -> None:
    graph = _chain()
    bad = _replace_node(graph, 2, outputs=(0,))  # s overwrites x, which node 0 read
    _expect(bad, "node 2 writes %0 (x) after node 0 already read it", marked="# s")


def test_declared_output_spec_disagrees_with_the_shape_rule() -> None:
    graph = _chain()
    bad = _replace_symbol(graph, 3, shape=(5,))
    _expect(
        bad,
        "node 1 (ewabs) declares %3 (a) as float32[5], its shape rule gives float32[4]",
        marked="%3:f32[5] = ewabs(%2)",
    )
    bad = _replace_symbol(graph, 3, dtype=np.dtype(np.int32))
    _expect(
        bad,
        "declares %3 (a) as int32[4], its shape rule gives float32[4]",
        marked="%3:i32[4] = ewabs",
    )


def test_node_whose_inputs_break_the_shape_rule() -> None:
    graph = _chain()
    bad = _replace_node(graph, 0, cmd=ops.ewdiv())  # ewdiv needs two inputs
    _expect(bad, "node 0 (e)", "ewdiv: expected 2 input(s), got 1", marked="ewdiv(%0)  # e")


def test_unknown_command_in_a_node() -> None:
    graph = _chain()
    bad = _replace_node(graph, 1, cmd=ops.Command("no_such_command"))
    _expect(bad, "node 1 (a)", "unknown command 'no_such_command'", marked="# a")


def test_output_never_written() -> None:
    b = GraphBuilder()
    x = b.input((4,), name="x")
    t = b.tensor((4,), name="t")
    y = b.exec(ops.ewexp(), x, name="y")
    with pytest.raises(GraphError, match=r"graph output %1 \(t\) is never written"):
        b.build([y, t])
    with config.override(checks=False):
        graph = b.build([y, t])  # no node to mark: the whole listing is printed
    msg = _expect(graph, "graph output %1 (t) is never written", marked=None)
    assert "  tensor %1:f32[4]  # t" in msg and "  return %2, %1" in msg


def test_overlapping_alias_writes() -> None:
    b = GraphBuilder()
    x = b.input((4,), name="x")
    t = b.tensor((6,), name="t")
    lo = b.alias(t, (4,), name="lo")
    hi = b.alias(t, (4,), offset=(2,), name="hi")
    b.exec(ops.ewexp(), x, outputs=[lo], name="w_lo")
    b.exec(ops.ewabs(), x, outputs=[hi], name="w_hi")
    with config.override(checks=False):
        graph = b.build([t])
    _expect(graph, "alias writes into %1 (t) overlap at alias %3 (hi)", marked="# w_hi")
    with pytest.raises(GraphError, match="overlap"):
        b.build([t])


def test_alias_written_twice() -> None:
    b = GraphBuilder()
    x = b.input((2,), name="x")
    t = b.tensor((4,), name="t")
    half = b.alias(t, (2,), name="half")
    b.exec(ops.ewexp(), x, outputs=[half], name="first")
    b.exec(ops.ewabs(), x, outputs=[half], name="second")
    with config.override(checks=False):
        graph = b.build([t])
    _expect(graph, "node 1 writes alias %2 (half) a second time", marked="# second")


def test_alias_write_into_a_tensor_written_whole() -> None:
    b = GraphBuilder()
    x = b.input((4,), name="x")
    e = b.exec(ops.ewexp(), x, name="e")
    part = b.alias(e, (2,), name="part")
    b.exec(ops.ewabs(), b.alias(x, (2,)), outputs=[part], name="patch")
    with config.override(checks=False):
        graph = b.build([e])
    _expect(
        graph, "writes alias %2 (part) of %1 (e), which is already written whole", marked="# patch"
    )


def test_alias_read_before_its_root_is_complete() -> None:
    b = GraphBuilder()
    x = b.input((2,), name="x")
    t = b.tensor((4,), name="t")
    lo, hi = b.alias(t, (2,), name="lo"), b.alias(t, (2,), offset=(2,), name="hi")
    b.exec(ops.ewexp(), x, outputs=[lo], name="w_lo")
    y = b.exec(ops.ewabs(), lo, name="early_read")
    b.exec(ops.ewexp(), x, outputs=[hi], name="w_hi")
    with config.override(checks=False):
        graph = b.build([y, t])
    _expect(
        graph, "node 2 writes %3 (hi) after node 1 already read it through %2 (lo)", marked="# w_hi"
    )


def test_alias_outside_its_root() -> None:
    b = GraphBuilder()
    x = b.input((4,), name="x")
    tail = b.alias(x, (2,), offset=(2,), name="tail")
    graph = b.build([b.exec(ops.ewexp(), tail, name="y")])
    bad = _replace_symbol(graph, tail.id, base=3)  # reaches element 4 of 4
    _expect(
        bad,
        "alias %1 (tail) reaches outside its root %0 (x)",
        "elements 3 to 4 of 4",
        marked="ewexp(%1)  # y",
    )
    bad = _replace_symbol(graph, tail.id, base=-1)
    _expect(bad, "alias %1 (tail) reaches outside its root", marked="# y")


def test_graph_input_listed_twice() -> None:
    graph = _chain()
    _expect(
        dataclasses.replace(graph, inputs=(0, 1, 0)),
        "graph input %0 (x) is listed twice",
        marked=None,
    )


def test_ids_out_of_range_are_graph_errors() -> None:
    graph = _chain()
    _expect(
        _replace_node(graph, 1, outputs=(99,)),
        "node 1 writes %99, which is not in the graph",
        marked="%99:? = ewabs",
    )
    _expect(
        _replace_node(graph, 1, inputs=(42,)),
        "node 1 reads %42, which is not in the graph",
        marked="ewabs(%42)",
    )
    _expect(
        dataclasses.replace(graph, outputs=(7,)), "graph output %7 is never written", marked=None
    )
    symbols = list(graph.symbols)
    symbols[2], symbols[3] = symbols[3], symbols[2]
    _expect(
        dataclasses.replace(graph, symbols=tuple(symbols)),
        "symbol at position 2 has id 3",
        marked=None,
    )


def test_long_graphs_show_a_window_around_the_node() -> None:
    b = GraphBuilder()
    h = b.input((3,), name="x")
    for i in range(16):
        h = b.exec(ops.scalar_mul(a=float(i + 1)), h, name=f"step{i}")
    graph = b.build([h])
    bad = _replace_node(graph, 8, cmd=ops.ewdiv())
    msg = _expect(bad, "node 8 (step8)", marked="# step8")
    lines = msg.splitlines()
    assert lines.count("  ...") == 2
    for i in (5, 6, 7, 9, 10, 11):
        assert f"# step{i}" in msg
    assert not re.search(r"# step([0-4]|1[2-5])$", msg, re.MULTILINE)


def test_verify_checks_sub_graphs_held_by_commands() -> None:
    import dataclasses

    from fnnc.graph.passes import fuse

    b = GraphBuilder()
    x = b.input((4,), name="x")
    y = b.exec(ops.tanh(), b.exec(ops.ewexp(), b.exec(ops.scalar_mul(a=0.5), x)))
    fused = fuse(b.build([y]))
    node = next(n for n in fused.nodes if n.cmd.name == "fused_elementwise")
    body = node.cmd.param("body")
    # SSA broken inside the body only: the fused command's shape rule cannot see it.
    broken_body = dataclasses.replace(body, nodes=(*body.nodes, body.nodes[0]))
    params = tuple((k, broken_body if k == "body" else v) for k, v in node.cmd.params)
    bad_node = dataclasses.replace(node, cmd=dataclasses.replace(node.cmd, params=params))
    bad = dataclasses.replace(fused, nodes=tuple(bad_node if n is node else n for n in fused.nodes))
    with pytest.raises(GraphError, match=r"in a sub-graph held by node \d+ \(fused_elementwise\)"):
        verify(bad)
    assert verify(fused) is fused


def test_a_symbol_id_past_the_end_is_reported_without_a_listing() -> None:
    """The listing reads symbols by id; when an id points past the end the message still
    comes, without the listing, instead of an IndexError from the printer."""
    graph = _replace_symbol(_chain(), 3, id=7)
    with pytest.raises(GraphError, match=r"symbol at position 3 has id 7; ids equal") as info:
        verify(graph)
    assert "no listing" in str(info.value)


def test_hand_built_records_of_the_wrong_types() -> None:
    graph = _chain()
    msg = _expect(
        _replace_symbol(graph, 2, shape=(4.0,)),
        "symbol %2 (e) has shape (4.0,) (tuple); expected a tuple of non-negative ints",
        marked="ewexp",
    )
    assert "declares" not in msg  # not "declares float32[4], its shape rule gives float32[4]"
    _expect(
        _replace_symbol(graph, 2, shape="4"),
        "symbol %2 (e) has shape '4' (str); expected a tuple of non-negative ints",
        marked="ewexp",
    )
    listed = _replace_symbol(graph, 2, shape=[4])  # a list is held as the tuple it lists
    assert listed.symbols[2].shape == (4,) and verify(listed) is listed
    with pytest.raises(GraphError, match=r"node 1 \(a\) has cmd 'ewabs' of type str; expected a"):
        verify(_replace_node(graph, 1, cmd="ewabs"))
