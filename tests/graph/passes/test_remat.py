"""remat: values and gradients unchanged on many graphs; budgets met; the barrier keeps
XLA from undoing the recomputation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fnnc import ops
from fnnc.errors import GraphError
from fnnc.graph import (
    GraphBuilder,
    compile,
    interpret,
    memory_plan,
    remat,
    run_passes,
    simplify,
    verify,
)
from fnnc.graph.passes.backward import backward
from fnnc.graph.passes.remat import candidates
from fnnc.graph.passes.remat_cost import recomputed_flops
from tests.graph.passes.test_backward import _scalar_of_outputs
from tests.graph.strategies import graphs
from tests.helpers import assert_close


def _with_backward(graph):
    rng = np.random.default_rng(0)
    weights = [rng.uniform(-1, 1, graph.spec(o).shape).astype(np.float32) for o in graph.outputs]
    fgraph, f = _scalar_of_outputs(graph, weights)
    wrt = [fgraph.symbols[i] for i in fgraph.inputs]
    return backward(fgraph, f, wrt)[0]


@settings(max_examples=30)
@given(graphs(max_nodes=6), st.integers(0, 2**16))
def test_random_graphs_keep_values_and_gradients(case, seed):
    graph, arrays = case
    g = _with_backward(graph)
    rng = np.random.default_rng(seed)
    save = {i for i in range(len(g.nodes)) if rng.uniform() < 0.4}
    r = remat(g, policy=lambda graph, i: i in save)
    verify(r)
    want = interpret(g, *arrays)
    got = interpret(r, *arrays)
    assert_close(got, want, rtol=0, atol=0)  # the same commands on the same values


def _mlp_chain(blocks: int, width: int = 16, batch: int = 256):
    """A residual MLP (fc up 4x, tanh, fc down, add) whose activations dominate."""
    b = GraphBuilder()
    x = b.input((batch, width), name="x")
    ws = []
    h = x
    for i in range(blocks):
        up = b.input((4 * width, width), name=f"up{i}")
        down = b.input((width, 4 * width), name=f"down{i}")
        ws += [up, down]
        a = b.exec(ops.tanh(), b.exec(ops.gemm(transpose_b=True), h, up, name=f"fc{i}"))
        d = b.exec(ops.gemm(transpose_b=True), a, down, name=f"proj{i}")
        h = b.exec(ops.ewsum(), h, d, name=f"res{i}")
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), h, name="loss")
    g, _ = backward(b.build([loss]), loss, ws)
    rng = np.random.default_rng(1)
    args = [rng.normal(size=(batch, width)).astype(np.float32)]
    args += [rng.normal(scale=0.2, size=tuple(w.shape)).astype(np.float32) for w in ws]
    return g, args


def _block_policy(graph, index):
    """Gradient checkpointing per block: keep only each block's output (``res``)."""
    return graph.nodes[index].name.startswith("res")


def test_checkpointing_every_block_halves_the_peak_and_keeps_gradients():
    g, args = _mlp_chain(8)
    r = remat(g, policy=_block_policy)
    assert memory_plan(r).peak_bytes <= 0.5 * memory_plan(g).peak_bytes
    assert_close(compile(r)(*args), compile(g)(*args), rtol=1e-6, atol=1e-6)
    names = [n.name for n in r.nodes if n.name.endswith("@remat")]
    assert "fc3@remat" in names and "proj3@remat" not in names  # proj's output isn't kept
    assert any(n.cmd.name == "optimization_barrier" for n in r.nodes)


def test_budgets_between_the_floor_and_the_full_peak_are_met():
    g, _ = _mlp_chain(8)
    full = memory_plan(g).peak_bytes
    block = remat(g, policy=_block_policy)
    floor = memory_plan(block).peak_bytes
    for budget in np.linspace(floor, full, 4)[:-1].astype(int):
        r = remat(g, budget_bytes=int(budget))
        assert memory_plan(r).peak_bytes <= budget
    # at checkpointing's own peak, the budget search recomputes no more than it does
    same_peak = remat(g, budget_bytes=floor)
    assert recomputed_flops(same_peak) <= recomputed_flops(block)
    assert memory_plan(same_peak).peak_bytes <= floor


def test_a_budget_below_reach_says_what_is_reachable():
    g, _ = _mlp_chain(2)
    with pytest.raises(GraphError, match=r"below the smallest peak found"):
        remat(g, budget_bytes=16)


def test_nothing_to_do_returns_the_graph():
    b = GraphBuilder()
    x = b.input((4,), name="x")
    g = b.build([b.exec(ops.tanh(), x)])
    assert remat(g, policy="nothing_saveable") is g  # no backward
    gb, _ = _mlp_chain(2)
    assert remat(gb, policy="everything_saveable") is gb
    assert remat(gb, budget_bytes=memory_plan(gb).peak_bytes) is gb


def test_bad_arguments():
    g, _ = _mlp_chain(1)
    with pytest.raises(GraphError, match="exactly one"):
        remat(g)
    with pytest.raises(GraphError, match="unknown policy"):
        remat(g, policy="sometimes")


def test_barrier_keeps_xla_from_merging_the_recomputation():
    g, _ = _mlp_chain(4)
    r = remat(g, policy=_block_policy)
    text = compile(r).compiled_text()
    assert "opt-barrier" in text or "optimization_barrier" in text
    assert candidates(g)


@pytest.mark.parametrize(("blocks", "batch"), [(2, 8), (5, 8), (4, 1)])
def test_the_peak_of_recomputing_everything_is_a_budget_the_search_meets(blocks, batch):
    """What ``policy="nothing_saveable"`` reaches is reachable by ``budget_bytes=``,
    also where the parameters, not the activations, make most of the peak (batch 1)."""
    g, _ = _mlp_chain(blocks, batch=batch)
    everything = memory_plan(remat(g, policy="nothing_saveable")).peak_bytes
    assert memory_plan(remat(g, budget_bytes=everything)).peak_bytes <= everything


@settings(max_examples=20, deadline=None)
@given(graphs(max_nodes=6), st.sampled_from(["nothing_saveable", "dots_saveable"]))
def test_remat_is_idempotent_also_after_simplify(case, policy):
    graph, arrays = case
    g = _with_backward(graph)
    r = remat(g, policy=policy)
    assert remat(r, policy=policy) is r
    s = simplify(r)  # fold may make the seed gradient a constant, ahead of the segment
    again = remat(s, policy=policy)
    assert again is s, (str(s), str(again))
    assert_close(interpret(again, *arrays), interpret(g, *arrays), rtol=1e-5, atol=1e-5)


def test_the_seed_constant_and_a_recomputed_segment_are_not_recomputed_again():
    b = GraphBuilder()
    x, w = b.input((4, 3), name="x"), b.input((5, 3), name="w")
    h = b.exec(ops.tanh(), b.exec(ops.gemm(transpose_b=True), x, w))
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.ewprod(), h, h))
    g, _ = backward(b.build([loss]), loss, [w])
    r = remat(g, policy="nothing_saveable")
    names = [n.name for n in r.nodes if n.name.endswith("@remat")]
    assert names == ["gemm@remat", "tanh@remat"]  # not the seed's set[value=1]
    s = run_passes(r, [lambda G: remat(G, policy="nothing_saveable"), simplify], max_rounds=4)
    assert [n.name for n in s.nodes if "@remat" in n.name] == names
    rng = np.random.default_rng(0)
    xv, wv = rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(5, 3))
    t = np.tanh(xv @ wv.T.astype(np.float32))  # NumPy: d sum(t^2) / dw = (2t(1-t^2))^T x
    want = [np.sum(t * t), (2 * t * (1 - t * t)).T @ xv]
    for got in (interpret(s, xv, wv.astype(np.float32)), compile(s)(xv, wv.astype(np.float32))):
        for a, v in zip(got, want):
            np.testing.assert_allclose(np.asarray(a).reshape(v.shape), v, rtol=1e-5, atol=1e-5)
