"""run_passes and simplify: order, fixpoints, verification and dumps between passes."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings

from fnnc import config, ops
from fnnc.errors import GraphError
from fnnc.graph import Graph, GraphBuilder, compile, interpret, simplify
from fnnc.graph.passes import cse, dce, fold, fuse, run_passes
from tests.graph.strategies import graphs
from tests.helpers import assert_close, assert_pass_keeps_semantics, rand

SETTINGS = settings(max_examples=60)
EVERYTHING = graphs(
    max_nodes=8, activations=True, duplicates=True, constant_exprs=True, identities=True
)


def _nnc_square() -> Graph:
    b = GraphBuilder()
    x, y = b.input((), name="x"), b.input((), name="y")
    z = b.exec(ops.mul(), b.exec(ops.add(), x, y), b.exec(ops.add(), x, y))
    return b.build([z])


def test_nnc_cse_example() -> None:
    graph = _nnc_square()
    xs = [np.float32(10), np.float32(8)]
    simple = assert_pass_keeps_semantics(lambda g: simplify(g, passes=("cse", "dce")), graph, xs)
    assert [str(n.cmd) for n in simple.nodes] == ["add", "mul"]
    assert float(interpret(simple, *xs)) == 324.0
    # The default pipeline goes on to fuse the pair into one node.
    fused = simplify(graph)
    assert [str(n.cmd) for n in fused.nodes] == ["fused_elementwise[add, mul]"]
    assert float(compile(fused)(*xs)) == 324.0


def test_golden_simplify() -> None:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    w = b.input((4, 3), name="w")
    bias = b.input((4,), name="b")
    h1 = b.exec(ops.gemm(transpose_b=True), x, w, name="fc")
    h2 = b.exec(ops.gemm(transpose_b=True), x, w, name="fc_again")
    one = b.exec(ops.ewsum(), b.constant(np.float32(0.5)), b.constant(np.float32(0.5)))
    scaled = b.exec(ops.mul(), h1, one)
    biased = b.exec(ops.add(), scaled, bias)
    b.exec(ops.ewexp(), h2, name="unused")
    graph = b.build([b.exec(ops.gelu(), biased, name="act")])
    arrays = [rand((2, 3)), rand((4, 3), seed=1), rand((4,), seed=2)]
    new = assert_pass_keeps_semantics(simplify, graph, arrays)
    assert str(new) == (
        "graph(%0:f32[2,3] x, %1:f32[4,3] w, %2:f32[4] b) {\n"
        "  %3:f32[2,4] = gemm[transpose_b=True](%0, %1)  # fc\n"
        "  %4:f32[2,4] = fused_elementwise[add, gelu](%3, %2)  # act\n"
        "  return %4\n"
        "}"
    )


def test_names_and_functions_mix() -> None:
    graph = _nnc_square()
    assert simplify(graph, passes=("cse", dce)) == simplify(graph, passes=(cse, "dce"))
    with pytest.raises(GraphError, match=r"unknown pass 'csee'.*did you mean 'cse'"):
        simplify(graph, passes=("csee",))


def test_unchanged_graph_is_returned_as_is() -> None:
    b = GraphBuilder()
    x = b.input((2, 3))
    graph = b.build([b.exec(ops.reduce_sum(axes=(1,)), b.exec(ops.relu(), x))])
    assert simplify(graph) is graph
    assert run_passes(graph, (cse, fold, fuse, dce), max_rounds=3) is graph


def test_rounds_reach_what_one_round_misses() -> None:
    # dce before fold: one round leaves the folded constants' inputs behind.
    b = GraphBuilder()
    x = b.input((3,), name="x")
    two = b.exec(ops.ewsum(), b.constant(np.float32(1)), b.constant(np.float32(1)))
    graph = b.build([b.exec(ops.mul(), x, two)])
    once = run_passes(graph, (dce, fold))
    twice = run_passes(graph, (dce, fold), max_rounds=3)
    assert [n.cmd.name for n in once.nodes] == ["constant"] * 3 + ["mul"]
    assert [n.cmd.name for n in twice.nodes] == ["constant", "mul"]
    assert_close(interpret(twice, rand((3,))), interpret(graph, rand((3,))))


def test_a_broken_pass_is_named() -> None:
    graph = _nnc_square()

    def breaks(g: Graph) -> Graph:
        return dataclasses.replace(g, nodes=g.nodes[1:])

    with pytest.raises(GraphError, match=r"pass breaks .* produced an invalid graph"):
        run_passes(graph, (breaks,))
    assert run_passes(graph, (breaks,), verify_each=False).nodes == graph.nodes[1:]
    with config.override(checks=False):
        run_passes(graph, (breaks,))


def test_debug_prints_each_stage(capsys) -> None:
    graph = _nnc_square()
    with config.override(debug=1):
        run_passes(graph, (dce, cse))
    out = capsys.readouterr().out
    assert out.startswith("-- dce (round 1): unchanged, ")
    assert "-- cse (round 1): 3 -> 2 nodes, " in out and "+++ after cse\n" in out
    run_passes(graph, (dce, cse))
    assert capsys.readouterr().out == ""


def test_strategies_give_every_pass_work() -> None:
    changed: collections.Counter[str] = collections.Counter()

    @settings(SETTINGS, max_examples=40)
    @given(EVERYTHING)
    def collect(case) -> None:
        graph, _ = case
        for p in (cse, fold, fuse, dce):
            changed[p.__name__] += p(graph) is not graph

    collect()
    assert all(changed[name] >= 10 for name in ("cse", "fold", "fuse", "dce")), changed


@SETTINGS
@given(EVERYTHING)
def test_random_graphs(case) -> None:
    graph, arrays = case
    new = assert_pass_keeps_semantics(simplify, graph, arrays)
    assert len(new.nodes) <= len(graph.nodes)


def test_passes_by_name_wherever_passes_are_taken() -> None:
    """compile(passes=["cse"]) raised "'str' object is not callable"; names now resolve as
    in simplify, in compile, run_passes and the lazy dynamic graph, to the same graph the
    function gives. What is neither a name nor a function is a GraphError saying so."""
    from fnnc.graph import DynamicGraph

    graph = _nnc_square()
    by_function = run_passes(graph, (cse, dce))
    assert [str(n.cmd) for n in by_function.nodes] == ["add", "mul"]
    assert run_passes(graph, ("cse", "dce")) == by_function
    assert compile(graph, passes=["cse", "dce"]).graph == by_function
    xs = [np.float32(10), np.float32(8)]
    assert float(compile(graph, passes=["cse", "dce"])(*xs)) == (10 + 8) ** 2
    assert DynamicGraph(lazy=True, passes=["cse"]).passes == (cse,)
    for where, run in {
        "compile": lambda p: compile(graph, passes=p),
        "run_passes": lambda p: run_passes(graph, p),
        "simplify": lambda p: simplify(graph, passes=p),
    }.items():
        with pytest.raises(GraphError, match=rf"{where}: unknown pass 'csee'.*did you mean"):
            run(["csee"])
        with pytest.raises(GraphError, match=rf"{where}: passes are functions .* got int 3"):
            run([3])


def test_a_lone_pass_name_is_one_pass() -> None:
    """simplify(g, passes="cse") read the string as the passes 'c', 's', 'e'."""
    graph = _nnc_square()
    assert simplify(graph, passes="cse") == simplify(graph, passes=("cse",))
    assert run_passes(graph, "dce") == run_passes(graph, (dce,))
    assert compile(graph, passes="cse").graph == run_passes(graph, (cse,))
    assert [str(n.cmd) for n in simplify(graph, passes="cse").nodes] == ["add", "mul"]
