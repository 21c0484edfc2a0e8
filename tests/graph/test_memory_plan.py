"""memory_plan: NNC-style liveness against closed forms, and donation (in-place reuse)."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import GraphError, GraphInputError
from fnnc.graph import GraphBuilder, compile, memory_plan, remat
from fnnc.graph.passes.minimize import minimize

N = 64  # elements per tensor below
P = 4 * N  # bytes of one float32 tensor of N elements


def _chain():
    """x -> exp -> relu -> tanh; returns (graph, x)."""
    b = GraphBuilder()
    x = b.input((N,), name="x")
    y = b.exec(ops.tanh(), b.exec(ops.relu(), b.exec(ops.ewexp(), x)))
    return b.build([y]), x


def test_chain_closed_form():
    graph, _ = _chain()
    plan = memory_plan(graph)
    # x is the caller's for the whole call; each result lives from its writer to its
    # last reader; the output to the end.
    assert plan.live_bytes == (2 * P, 3 * P, 3 * P)
    assert plan.peak_bytes == 3 * P and plan.peak_node == 1
    assert [t.name for t in plan.live_at_peak][:1] == ["x"]
    assert "peak 768 bytes at node 1" in plan.table()


def test_views_share_their_root_and_barriers_pass_bytes_through():
    b = GraphBuilder()
    x = b.input((N,), name="x")
    e = b.exec(ops.ewexp(), x)
    fenced, _ = b.exec(ops.optimization_barrier(), e, x)
    r = b.exec(ops.relu(), b.alias(e, (N // 2,), offset=(N // 2,)))
    s = b.exec(ops.relu(), b.alias(fenced, (N // 2,)))
    plan = memory_plan(b.build([b.exec(ops.ewsum(), r, s)]))
    # e, its view and the barrier's copy of it are one buffer, live until s is made
    assert plan.live_bytes == (2 * P, 2 * P, 2 * P + P // 2, 3 * P, 2 * P + P // 2)
    assert plan.peak_node == 3


def test_a_tensor_written_through_its_views_names_its_first_writer():
    b = GraphBuilder()
    x = b.input((N // 2,), name="x")
    t = b.tensor((N,), name="t")
    b.exec(ops.ewexp(), x, outputs=[b.alias(t, (N // 2,))], name="lo")
    b.exec(ops.relu(), x, outputs=[b.alias(t, (N // 2,), offset=(N // 2,))], name="hi")
    plan = memory_plan(b.build([b.exec(ops.tanh(), t)]))
    (tensor,) = [live for live in plan.live_at_peak if live.name == "t"]
    assert tensor.producer == 0
    assert "node 0 (lo)" in str(plan)


def _momentum(mu: float = 0.9, lr: float = 0.1):
    """m' = mu m + g; p' = p - lr m' (inputs p, m, g; outputs p', m')."""
    b = GraphBuilder()
    p, m, g = (b.input((N,), name=n) for n in ("p", "m", "g"))
    m1 = b.exec(ops.add(p=mu, q=1.0), m, g, name="m'")
    p1 = b.exec(ops.add(p=1.0, q=-lr), p, m1, name="p'")
    return b.build([p1, m1])


def test_donation_drops_the_peak_by_the_donated_bytes():
    graph = _momentum()
    plain = memory_plan(graph)
    donated = memory_plan(graph, donate=["p", "m"])
    # plain: p, m, g held by the caller + m' + p' at the second node
    assert plain.peak_bytes == 5 * P
    # donated: p' is written into p, m' into m (each after its input's last read)
    assert donated.peak_bytes == 3 * P == plain.peak_bytes - 2 * P
    ids = {graph.symbols[s].name: s for s in (*graph.inputs, *graph.outputs)}
    assert donated.donated == ((ids["p"], ids["p'"]), (ids["m"], ids["m'"]))
    assert "written in place (donated)" in donated.table()
    assert memory_plan(graph, donate=[0, 1]).live_bytes == donated.live_bytes  # positions
    assert memory_plan(graph, donate=["g"]).peak_bytes == 4 * P  # g's buffer holds p'


def test_an_output_written_before_the_donated_input_dies_gets_its_own_bytes():
    b = GraphBuilder()
    x = b.input((N,), name="x")
    y = b.exec(ops.relu(), x)
    z = b.exec(ops.ewsum(), y, x)  # x is still read after y exists: no in-place y
    graph = b.build([y, z])
    assert memory_plan(graph, donate=["x"]).live_bytes == memory_plan(graph).live_bytes
    assert memory_plan(graph, donate=["x"]).donated == ()


def test_training_step_update_node_and_xla_agree_on_the_donated_bytes():
    b = GraphBuilder()
    w, x = b.input((32, 16), name="w"), b.input((2, 16), name="x")
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.gemm(transpose_b=True), x, w))
    step, layout = minimize(b.build([loss]), loss, [w], optax.sgd(0.1, momentum=0.9))
    donate = list(range(layout.n_params + layout.n_state))
    owned = sum(4 * int(np.prod(step.symbols[step.inputs[i]].shape)) for i in donate)
    plain, donated = memory_plan(step), memory_plan(step, donate=donate)
    update = next(i for i, n in enumerate(step.nodes) if n.cmd.name == "optax_update")
    assert plain.live_bytes[update] - donated.live_bytes[update] == owned == 2 * 32 * 16 * 4
    assert plain.peak_node == update  # every input, gradient and result live together
    program = compile(step, donate=donate)
    assert program.memory().alias_bytes == owned  # XLA aliases the same buffers
    assert program.memory_plan().live_bytes == donated.live_bytes


def test_remat_budgets_count_the_donated_buffers_once():
    b = GraphBuilder()
    h = b.input((64, 32), name="x")
    ws = [b.input((32, 32), name=f"w{i}") for i in range(4)]
    for w in ws:
        h = b.exec(ops.tanh(), b.exec(ops.gemm(transpose_b=True), h, w))
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), h)
    step, layout = minimize(b.build([loss]), loss, ws, optax.sgd(0.1, momentum=0.9))
    donate = list(range(layout.n_params + layout.n_state))
    budget = memory_plan(step, donate=donate).peak_bytes - 64 * 32 * 4  # one activation less
    fitted = remat(step, budget_bytes=budget, donate=donate)
    assert memory_plan(fitted, donate=donate).peak_bytes <= budget
    # without donation the update node holds parameters and state twice: out of reach
    with pytest.raises(GraphError, match="below the smallest peak found"):
        remat(step, budget_bytes=budget)


def test_bad_donations_name_the_inputs():
    graph = _momentum()
    with pytest.raises(GraphInputError, match=r"donate names input 'q'.*\['p', 'm', 'g'\]"):
        memory_plan(graph, donate=["q"])
    with pytest.raises(GraphInputError, match="not a graph input position"):
        memory_plan(graph, donate=[3])
