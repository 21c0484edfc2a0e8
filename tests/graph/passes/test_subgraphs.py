"""map_subgraphs: every pass also runs inside the sub-graphs commands hold."""

from __future__ import annotations

import dataclasses

import numpy as np

from fnnc import ops
from fnnc.graph import Graph, GraphBuilder, interpret
from fnnc.graph.passes import cse, dce, fold, fuse, map_subgraphs, simplify
from fnnc.ops import Command
from tests.helpers import assert_pass_keeps_semantics, rand


def _messy_body() -> Graph:
    """(x + x) * (x + x) * 1, with a dead exp: work for cse, fold and dce."""
    b = GraphBuilder()
    x = b.input((3,), name="x")
    b.exec(ops.ewexp(), x, name="dead")
    s1, s2 = b.exec(ops.ewsum(), x, x), b.exec(ops.ewsum(), x, x)
    sq = b.exec(ops.ewprod(), s1, s2)
    return b.build([b.exec(ops.mul(), sq, b.constant(np.float32(1)))])


def _outer(body: Graph) -> Graph:
    b = GraphBuilder()
    x = b.input((3,), name="x")
    y = b.exec(ops.fused_elementwise(body=body), x, name="f")
    return b.build([b.exec(ops.reduce_sum(axes=(0,)), y)])  # not elementwise: no fusion


def test_cse_fold_and_dce_rewrite_a_fused_body() -> None:
    graph = _outer(_messy_body())
    xs = [rand((3,))]
    after_cse = assert_pass_keeps_semantics(cse, graph, xs)
    body = after_cse.nodes[0].cmd.param("body")
    assert [n.cmd.name for n in body.nodes] == ["ewexp", "ewsum", "ewprod", "constant", "mul"]
    after_fold = assert_pass_keeps_semantics(fold, after_cse, xs)
    assert "mul" not in [n.cmd.name for n in after_fold.nodes[0].cmd.param("body").nodes]
    after_dce = assert_pass_keeps_semantics(dce, after_fold, xs)
    body = after_dce.nodes[0].cmd.param("body")
    assert str(body) == (
        "graph(%0:f32[3] x) {\n"
        "  %1:f32[3] = ewsum(%0, %0)\n"
        "  %2:f32[3] = ewprod(%1, %1)\n"
        "  return %2\n"
        "}"
    )
    assert len(after_dce.nodes) == len(graph.nodes)
    assert str(simplify(graph).nodes[0].cmd.param("body")) == str(body)


def test_fuse_leaves_fused_bodies_alone() -> None:
    body = _messy_body()
    graph = _outer(body)
    assert fuse(graph) is graph


def test_nested_sub_graphs_are_reached() -> None:
    inner = _outer(_messy_body())  # a graph holding a fused node ...
    graph = _outer(inner)  # ... held by another fused node
    new = assert_pass_keeps_semantics(dce, graph, [rand((3,))])
    deepest = new.nodes[0].cmd.param("body").nodes[0].cmd.param("body")
    assert "ewexp" not in [n.cmd.name for n in deepest.nodes]


def test_graphs_in_tuples_and_in_command_values() -> None:
    body = _messy_body()
    b = GraphBuilder()
    x = b.input((3,))
    graph = b.build([b.exec(ops.relu(), x)])
    # A test-only command value: map_subgraphs never looks a command up.
    held = Command("fused_elementwise", (("body", body),))
    cmd = Command("relu", (("branches", (body, (1, body))), ("of", held), ("n", 3)))
    node = dataclasses.replace(graph.nodes[0], cmd=cmd)
    weird = dataclasses.replace(graph, nodes=(node,))
    seen = []

    def count(sub: Graph) -> Graph:
        seen.append(sub)
        return dce(sub)

    new = map_subgraphs(weird, count)
    assert seen == [body, body, body]
    params = new.nodes[0].cmd.kwargs
    cleaned = dce(body)
    assert params["branches"] == (cleaned, (1, cleaned))
    assert params["of"].param("body") == cleaned and params["n"] == 3
    assert map_subgraphs(weird, lambda sub: sub) is weird


def test_fused_value_matches_the_body_interpreted() -> None:
    body = _messy_body()
    x = rand((3,))
    np.testing.assert_allclose(ops.fused_elementwise(body=body)(x), interpret(body, x))
