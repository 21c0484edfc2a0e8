"""Audit 10 (memory): donation misuse is a clear error naming the input; remat refuses
policies and budgets it cannot use instead of failing inside or silently misreading them."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError, GraphError, GraphInputError
from fnnc.graph import (
    GraphBuilder,
    backward,
    compile,
    interpret,
    memory_compression,
    memory_plan,
    remat,
    scan,
    trace,
    while_loop,
)


@pytest.fixture(scope="module")
def add_graph():
    b = GraphBuilder()
    x, w = b.input((4,), name="x"), b.input((4,), name="w")
    return b.build([b.exec(ops.ewsum(), x, w, name="y")])


@pytest.fixture(scope="module")
def donating(add_graph):
    with warnings.catch_warnings():  # w finds no output to take ("not usable"): still donated
        warnings.simplefilter("ignore")
        return compile(add_graph, donate=["x"]), compile(add_graph, donate=["x", "w"])


def test_an_input_a_donating_call_took_is_named_when_passed_again(add_graph, donating):
    program, _ = donating
    a, w = jnp.arange(4.0), jnp.ones(4)
    y = program(a, w)
    np.testing.assert_array_equal(np.asarray(y), np.arange(4.0) + 1)  # NumPy
    assert a.is_deleted()
    for call in (
        lambda: program(a, w),
        lambda: program([a, w]),
        lambda: interpret(add_graph, a, w),
    ):
        with pytest.raises(GraphInputError, match=r"input %0 \(x\) is an array that was deleted"):
            call()
    np.testing.assert_array_equal(np.asarray(program(y, w)), np.arange(4.0) + 2)  # its output


@pytest.mark.parametrize("both", [False, True])
def test_one_array_in_a_donated_and_another_position_is_named(donating, both):
    program = donating[int(both)]
    a = jnp.full(4, 3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(GraphInputError, match=r"input %0 \(x\).*donat.*input %1 \(w\)"):
            program(a, a)
    assert not a.is_deleted()
    np.testing.assert_array_equal(np.asarray(program(jnp.array(a, copy=True), a)), np.full(4, 6.0))


def test_a_taped_loops_overflow_is_reported_though_the_call_took_its_donated_inputs():
    """The tape check fails after the call ran, when its donated inputs are gone: that is
    the tape's error, not a deleted input's (oracle: the loop ran 3 trips, tape=2)."""
    bb = GraphBuilder()
    z0, x0 = bb.input((4,), name="z0"), bb.input((4,), name="x")
    body = bb.build([bb.exec(ops.tanh(), bb.exec(ops.ewprod(), z0, x0), name="z1")])
    cb = GraphBuilder()
    count = cb.input((), np.int32, name="count")
    cond = cb.build([cb.exec(ops.compare(op="lt"), count, cb.constant(np.int32(3)))])
    b = GraphBuilder()
    x, y = b.input((4,), name="x"), b.input((4,), name="y")
    carry = {body.symbols[body.outputs[0]]: body.symbols[body.inputs[0]]}
    (z,) = while_loop(b, body, cond, [x, y], carry_overs=carry, name="loop", tape=2)
    loss = b.exec(ops.reduce_sum(axes=(0,)), z)
    g = backward(b.build([loss]), loss, [x, y])[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = compile(g, donate=["x", "y"])
        with pytest.raises(CommandError, match=r"ran 3 iterations, but its tape holds 2"):
            program(jnp.ones(4), jnp.ones(4))


@pytest.fixture(scope="module")
def tanh_chain():
    b = GraphBuilder()
    x = b.input((8,), name="x")
    h = b.exec(ops.tanh(), b.exec(ops.tanh(), x, name="t0"), name="t1")
    loss = b.exec(ops.reduce_sum(axes=(0,)), h, name="loss")
    return backward(b.build([loss]), loss, [x])[0]


@pytest.mark.parametrize(
    "policy",
    [True, 1, ["nothing_saveable"], jax.checkpoint_policies.save_only_these_names("t0")],
    ids=["bool", "int", "list", "jax-names"],
)
def test_a_policy_that_is_no_function_of_graph_and_index_is_refused(tanh_chain, policy):
    with pytest.raises(GraphError, match=r"remat: policy is .*policy\(graph, node_index\)"):
        remat(tanh_chain, policy=policy)


@pytest.mark.parametrize("name", ["nothing_saveable", "everything_saveable", "dots_saveable"])
def test_jax_policies_of_fnnc_names_are_those_policies(tanh_chain, name):
    ours = remat(tanh_chain, policy=name)
    theirs = remat(tanh_chain, policy=getattr(jax.checkpoint_policies, name))
    assert [n.name for n in theirs.nodes] == [n.name for n in ours.nodes]
    xs = np.linspace(-1, 1, 8, dtype=np.float32)
    t = np.tanh(np.tanh(xs.astype(np.float64)))  # NumPy: d sum(tanh(tanh x)) / dx
    want = (1 - t * t) * (1 - np.tanh(xs.astype(np.float64)) ** 2)
    np.testing.assert_allclose(np.asarray(interpret(theirs, xs)[1]), want, rtol=1e-6)


@pytest.mark.parametrize("budget", ["4096", True, float("nan"), None])
def test_a_budget_that_is_no_number_is_refused(tanh_chain, budget):
    if budget is None:  # both missing: the existing message
        with pytest.raises(GraphError, match="exactly one"):
            remat(tanh_chain, budget_bytes=None)
        return
    with pytest.raises(GraphError, match=r"remat: budget_bytes is (str|bool|float)"):
        remat(tanh_chain, budget_bytes=budget)


def test_a_float_budget_is_bytes_and_a_wrong_donate_name_is_refused_with_a_policy(tanh_chain):
    full = memory_plan(tanh_chain).peak_bytes
    assert remat(tanh_chain, budget_bytes=float(full)) is tanh_chain
    with pytest.raises(GraphInputError, match=r"remat: donate names input 'w'"):
        remat(tanh_chain, policy="nothing_saveable", donate=["w"])


def _two_convolutions(shape, kernel):
    """x -> c1 = conv(x, w1) -> c2 = conv(c1, w2) -> sum, with w2's gradient."""
    b = GraphBuilder()
    x = b.input(shape, name="x")
    w1, w2 = b.input(kernel, name="w1"), b.input(kernel, name="w2")
    c1 = b.exec(ops.convolution(padding="SAME"), x, w1, name="c1")
    c2 = b.exec(ops.convolution(padding="SAME"), c1, w2, name="c2")
    loss = b.exec(ops.reduce_sum(axes=tuple(range(len(shape)))), c2, name="loss")
    return backward(b.build([loss]), loss, [w2])[0]


def test_compression_keeps_each_sample_in_its_own_blocks():
    """LSSC's 4x4 blocks lie in one sample's H x W plane, so a sample's gradient does not
    depend on the other samples (oracle: the same sample's compressed gradient alone).
    A 1-D convolution's [N, L, C] would make blocks of four samples (sample 0's gradient
    became 0 with the others scaled 100x): it is not compressed, and its gradient is the
    plain one."""
    rng = np.random.default_rng(0)
    one = np.eye(2, dtype=np.float32)
    for shape, kernel, compressed in [
        ((4, 8, 2), (2, 1, 2), False),
        ((4, 4, 8, 2), (2, 1, 1, 2), True),
    ]:
        g = _two_convolutions(shape, kernel)
        c = memory_compression(g)
        assert (c is not g) == compressed
        w = one.reshape(kernel)
        xs = rng.normal(size=shape).astype(np.float32)
        alone = xs.copy()
        alone[1:] = 0
        others = xs.copy()
        others[1:] *= 100
        rest = others.copy()
        rest[0] = 0
        sample0 = np.asarray(interpret(c, others, w, w)[1]) - np.asarray(
            interpret(c, rest, w, w)[1]
        )
        want = np.asarray(interpret(c, alone, w, w)[1])
        np.testing.assert_allclose(sample0, want, rtol=1e-3, atol=1e-3)
        if not compressed:  # NumPy: d sum(conv(x, 1), w2) / dw2[o, 0, i] = sum_l x[0, l, i]
            np.testing.assert_allclose(want.reshape(2, 2), np.tile(xs[0].sum(0), (2, 1)), rtol=1e-5)
    # one [H, W, C] image of a 2-D convolution is one sample's plane: compressed, as NNC does
    g = _two_convolutions((8, 8, 2), (2, 1, 1, 2))
    assert any(n.cmd.name == "lssc_compress" for n in memory_compression(g).nodes)


def test_a_loop_whose_body_has_an_effect_is_not_recomputed():
    """remat recomputed a scan whose body runs a debug callback, so the callback ran twice
    per trip; a node holding an effectful command in a sub-graph is kept, as DCE and CSE
    treat it. Oracle: the plain graph's callback count and values."""
    calls = []

    def body_fn(h, w):
        jax.debug.callback(lambda v: calls.append(1), h)
        return jnp.tanh(h @ w)

    body = trace(body_fn, jnp.ones((2, 4)), jnp.ones((4, 4)))
    b = GraphBuilder()
    x, ws = b.input((2, 4), name="x"), b.input((3, 4, 4), name="ws")
    (out,) = scan(b, body, [b.exec(ops.tanh(), x, name="pre")], [ws], name="blocks")
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.tanh(), out, name="post"))
    g = backward(b.build([loss]), loss, [x, ws])[0]
    r = remat(g, policy="nothing_saveable")
    assert sorted(n.name for n in r.nodes if n.name.endswith("@remat")) == [
        "post@remat",
        "pre@remat",
    ]
    args = [np.full((2, 4), 0.1, np.float32), np.full((3, 4, 4), 0.1, np.float32)]
    counts, values = [], []
    for graph in (g, r):
        calls.clear()
        values.append(interpret(graph, *args))
        jax.effects_barrier()
        counts.append(len(calls))
    assert counts == [3, 3]
    for got, want in zip(values[1], values[0]):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("flag", [np.True_, np.False_])
def test_scan_takes_numpys_bools_as_checkpoint_flags(flag):
    """scan(checkpoint=np.True_) was passed to remat as a policy (now an error there); it
    is True, as a NumPy bool from a config is (oracle: the graph scan builds for the bool)."""

    def loop(checkpoint):
        body = GraphBuilder()
        h, w = body.input((2, 3), name="h"), body.input((3, 3), name="w")
        block = body.build([body.exec(ops.tanh(), body.exec(ops.gemm(), h, w))])
        b = GraphBuilder()
        x, ws = b.input((2, 3), name="x"), b.input((4, 3, 3), name="ws")
        (out,) = scan(b, block, [x], [ws], checkpoint=checkpoint, name="blocks")
        return b.build([out]).nodes[0].cmd

    assert loop(flag) == loop(bool(flag))
