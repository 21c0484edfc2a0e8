"""Rewriter: insert before/after, replace all uses, replace and remove nodes, one graph."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import config, ops
from fnnc.errors import GraphError, ShapeError
from fnnc.graph import GraphBuilder, Rewriter, interpret
from fnnc.graph import compile as fcompile
from tests.helpers import rand


def _mlp():
    b = GraphBuilder()
    x, w = b.input((2, 3), name="x"), b.input((4, 3), name="w")
    h = b.exec(ops.gemm(transpose_b=True), x, w, name="fc")
    return b.build([b.exec(ops.relu(), h, name="act"), h]), x, w, h


def test_nothing_edited_is_the_same_graph() -> None:
    graph, *_ = _mlp()
    assert Rewriter(graph).finish() is graph


def test_insert_after_and_replace_all_uses() -> None:
    graph, _, _, h = _mlp()
    r = Rewriter(graph)
    (gemm,) = r.find("gemm")
    with r.inserting_after(gemm):
        clipped = r.exec(ops.clamp(min=-1.0, max=1.0), h)
    r.replace_all_uses(h, clipped)  # the clamp itself keeps reading h
    new = r.finish()
    assert [n.cmd.name for n in new.nodes] == ["gemm", "clamp", "relu"]
    assert new.nodes[1].inputs == (new.nodes[0].outputs[0],)
    assert new.outputs[1] == new.nodes[1].outputs[0]  # graph outputs follow
    xv, wv = rand((2, 3)), rand((4, 3), seed=1) * 3
    hv = np.clip(xv @ wv.T, -1, 1)  # by hand
    relu, out = interpret(new, xv, wv)
    np.testing.assert_allclose(out, hv, rtol=1e-6)
    np.testing.assert_allclose(relu, np.maximum(hv, 0), rtol=1e-6)


def test_replace_all_uses_with_is_torch_fx_s_name_for_replace_all_uses() -> None:
    graph, _, _, h = _mlp()
    graphs = []
    for method in ("replace_all_uses", "replace_all_uses_with"):
        r = Rewriter(graph)
        (gemm,) = r.find("gemm")
        with r.inserting_after(gemm):
            clipped = r.exec(ops.clamp(min=-1.0, max=1.0), h)
        getattr(r, method)(h, clipped)
        graphs.append(r.finish())
    assert str(graphs[0]) == str(graphs[1])
    xv, wv = rand((2, 3)), rand((4, 3), seed=1) * 3
    _, out = interpret(graphs[1], xv, wv)
    np.testing.assert_allclose(out, np.clip(xv @ wv.T, -1, 1), rtol=1e-6)  # by hand


def test_insert_before_replace_node_and_call() -> None:
    graph, x, w, _ = _mlp()
    r = Rewriter(graph)
    (gemm,) = r.find("gemm")
    with r.inserting_before(gemm):
        half = r.call(lambda a: a * 0.5, x)
    r.replace_node(gemm, gemm.cmd, half, w)
    new = r.finish()
    assert [n.cmd.name for n in new.nodes] == ["constant", "mul", "gemm", "relu"]
    xv, wv = rand((2, 3)), rand((4, 3), seed=1)
    np.testing.assert_allclose(interpret(new, xv, wv)[1], 0.5 * xv @ wv.T, rtol=1e-6)
    with pytest.raises(GraphError, match=r"replace_node 0 \(gemm\) by relu: it would write"):
        Rewriter(graph).replace_node(0, ops.relu(), x)


def test_remove_and_its_errors() -> None:
    b = GraphBuilder()
    x = b.input((3,), name="x")
    e = b.exec(ops.ewexp(), x, name="e")
    graph = b.build([b.exec(ops.ewlog(), e, name="log")])
    r = Rewriter(graph, name="drop_exp_log")
    r.replace_all_uses(graph.outputs[0], x)
    r.remove(1)
    r.remove(0)
    new = r.finish()
    assert new.nodes == () and new.outputs == new.inputs
    still_read = Rewriter(graph, name="drop_exp")
    still_read.remove(0)
    with config.override(checks=True), pytest.raises(GraphError, match="drop_exp: the edits break"):
        still_read.finish()
    b2 = GraphBuilder()
    u, v = b2.input((3,), name="u"), b2.input((2,), name="v")
    g2 = b2.build([b2.exec(ops.relu(), u)])
    with pytest.raises(GraphError, match=r"replace_all_uses\(%2, %1 \(v\)\): float32\[3\]"):
        Rewriter(g2).replace_all_uses(g2.outputs[0], v)
    with pytest.raises(ShapeError, match="exec gemm"):
        Rewriter(graph).exec(ops.gemm(), x, x)


def test_replacing_a_viewed_result_re_roots_the_views() -> None:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    same = b.exec(ops.scalar_mul(a=1.0), x)
    row = b.alias(same, (1, 3), offset=(1, 0))
    graph = b.build([b.exec(ops.ewexp(), row)])
    r = Rewriter(graph)
    r.replace_all_uses(same, x)
    new = r.finish()
    assert [n.cmd.name for n in new.nodes] == ["ewexp"]
    xv = rand((2, 3))
    np.testing.assert_allclose(interpret(new, xv), np.exp(xv[1:2]), rtol=1e-6)


def test_a_view_read_before_the_replacement_keeps_the_old_root() -> None:
    """``v`` (a view of ``a``) is read before ``new = 2 * a`` is written and after it:
    the early read keeps ``a``, the later reads and the graph output read ``2 * a``."""
    b = GraphBuilder()
    x = b.input((4,), name="x")
    a = b.exec(ops.relu(), x, name="a")
    v = b.alias(a, (2,), name="v")
    early = b.exec(ops.tanh(), v, name="early")
    late = b.exec(ops.scalar_mul(a=3.0), a, name="late")
    after = b.exec(ops.ewexp(), v, name="after")
    graph = b.build([early, late, after, v])
    r = Rewriter(graph)
    relu, tanh = r.find("relu")[0], r.find("tanh")[0]
    with r.inserting_after(tanh):
        new = r.exec(ops.scalar_mul(a=2.0), r.symbol(relu.outputs[0]))
    r.replace_all_uses(relu.outputs[0], new)
    edited = r.finish(check=True)
    xv = np.array([-1.0, 2.0, 3.0, -4.0], np.float32)
    relu_x = np.maximum(xv, 0)  # by hand
    want = [np.tanh(relu_x[:2]), 6 * relu_x, np.exp(2 * relu_x[:2]), 2 * relu_x[:2]]
    for got, w in zip(interpret(edited, xv), want):
        np.testing.assert_allclose(got, w, rtol=1e-6)
    for got, w in zip(fcompile(edited)(xv), want):
        np.testing.assert_allclose(got, w, rtol=1e-6)
