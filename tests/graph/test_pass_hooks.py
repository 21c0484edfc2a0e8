"""Passes where users need them: compile(passes=), the lazy dynamic graph's flush, and
run_passes' report (time, node counts) and FNNC_DEBUG diff."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fnnc import config, ops
from fnnc.errors import GraphError
from fnnc.graph import (
    DynamicGraph,
    GraphBuilder,
    PassReport,
    Pat,
    Rule,
    compile,
    rewrite_pass,
    run_passes,
)

LEAKY = ops.leaky_relu(negative_slope=0.5)
relu_to_leaky = rewrite_pass(
    Rule(Pat.op("relu", Pat.var("x")), lambda m: m.exec(LEAKY, m["x"])), name="relu_to_leaky"
)
XS = np.array([-2.0, -1.0, 3.0], np.float32)


def _graph():
    b = GraphBuilder()
    x = b.input((3,), name="x")
    return b.build([b.exec(ops.relu(), x, name="act")])


def test_compile_runs_passes_and_caches_by_the_result() -> None:
    graph = _graph()
    plain = compile(graph)
    leaky = compile(graph, passes=[relu_to_leaky])
    assert leaky is not plain and leaky.graph.nodes[0].cmd == LEAKY
    np.testing.assert_allclose(leaky(XS), [-1.0, -0.5, 3.0])
    np.testing.assert_allclose(plain(XS), [0.0, 0.0, 3.0])
    assert compile(graph, passes=[relu_to_leaky]) is leaky  # same result graph, same program
    assert compile(graph, passes=[lambda g: g]) is plain

    def drops(g):
        return dataclasses.replace(g, outputs=())

    with pytest.raises(GraphError, match=r"compile: passes \['drops'\] changed the graph's"):
        compile(graph, passes=[drops])


def test_lazy_dynamic_graph_runs_passes_at_flush() -> None:
    dg = DynamicGraph(lazy=True, passes=[relu_to_leaky])
    for step in range(2):
        y = dg.exec(ops.relu(), dg.constant(XS * (step + 1)))
        np.testing.assert_allclose(y.numpy(), np.where(XS > 0, XS, 0.5 * XS) * (step + 1))
    assert dg.num_compiled == 1  # the second flush found the first's program
    plain = DynamicGraph(lazy=True)
    np.testing.assert_allclose(plain.exec(ops.relu(), plain.constant(XS)).numpy(), [0, 0, 3])
    with pytest.raises(GraphError, match=r"passes run on lazy flushes"):
        DynamicGraph(passes=[relu_to_leaky])


def test_reports_and_debug_diffs(capsys) -> None:
    graph = _graph()
    report: list[PassReport] = []
    new = run_passes(graph, (relu_to_leaky, relu_to_leaky), report=report)
    assert [(r.name, r.changed, r.nodes_before, r.nodes_after) for r in report] == [
        ("relu_to_leaky", True, 1, 1),
        ("relu_to_leaky", False, 1, 1),
    ]
    assert all(r.seconds >= 0 for r in report) and new.nodes[0].cmd == LEAKY
    assert str(report[0]).startswith("relu_to_leaky (round 1): 1 -> 1 nodes, ")
    with config.override(debug=1):
        compile(graph, passes=[relu_to_leaky])
    out = capsys.readouterr().out
    assert "-- relu_to_leaky (round 1): 1 -> 1 nodes, " in out
    old, new = "relu(%0)  # act", "leaky_relu[negative_slope=0.5](%0)  # act"
    assert f"-  %1:f32[3] = {old}\n+  %1:f32[3] = {new}" in out
