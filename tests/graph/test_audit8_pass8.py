"""Audit 8 of the graph passes and the custom-pass API (Rewriter, rules)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.errors import GraphError
from fnnc.graph import (
    GraphBuilder,
    Pat,
    Rewriter,
    Rule,
    backward,
    cast_precision,
    graph_rewrite,
    interpret,
    run_passes,
    scan,
    simplify,
)
from fnnc.graph.matching import match
from fnnc.graph.pipeline import pipeline


def _relu_exp():
    b = GraphBuilder()
    x = b.input((3,), name="x")
    r = b.exec(ops.relu(), x, name="r")
    return b.build([b.exec(ops.ewexp(), r, name="e")]), x, r


def test_rewriter_refuses_a_cycle_of_replacements() -> None:
    # replace_all_uses(r, x) then (x, r) looped forever in finish (each read resolved
    # r -> x -> r ...); now the second edit is refused, naming the cycle.
    graph, x, r = _relu_exp()
    rw = Rewriter(graph)
    rw.replace_all_uses(r, x)
    with pytest.raises(GraphError, match=r"replace_all_uses\(%0 \(x\), %1 \(r\)\) closes a cycle"):
        rw.replace_all_uses(x, r)
    with pytest.raises(GraphError, match="cycle"):
        rw2 = Rewriter(graph)
        s = rw2.exec(ops.scalar_mul(a=2.0), r)
        rw2.replace_all_uses(r, s)
        t = rw2.exec(ops.scalar_mul(a=3.0), s)
        rw2.replace_all_uses(s, t)
        rw2.replace_all_uses(t, r)


def test_rewriter_chain_of_replacements_still_resolves() -> None:
    graph, _, r = _relu_exp()
    rw = Rewriter(graph)
    with rw.inserting_after(0):
        s = rw.exec(ops.scalar_mul(a=2.0), r)
        t = rw.exec(ops.scalar_mul(a=3.0), s)
    rw.replace_all_uses(r, s)
    rw.replace_all_uses(s, t)  # r -> s -> t: the exp reads 6 * relu(x)
    xv = np.float32([-1.0, 0.5, 2.0])
    want = np.exp(6.0 * np.maximum(xv.astype(np.float64), 0.0))
    np.testing.assert_allclose(interpret(rw.finish(), xv), want, rtol=1e-6)


def test_a_rule_returning_the_root_s_own_output_leaves_the_node() -> None:
    # A replacement returning the matched node's output (m["y"], y the root) looped
    # forever (the output was mapped to itself); it now means "no change", like None.
    graph, *_ = _relu_exp()
    keep = Rule(Pat.op("relu", Pat.var("x"), name="y"), lambda m: m["y"])
    assert graph_rewrite(graph, [keep]) is graph
    # with another rule after it, that one still applies
    leaky = Rule(
        Pat.op("relu", Pat.var("x")), lambda m: m.exec(ops.leaky_relu(negative_slope=0.5), m["x"])
    )
    new = graph_rewrite(graph, [keep, leaky])
    xv = np.float32([-1.0, 0.5, 2.0])
    x64 = xv.astype(np.float64)
    np.testing.assert_allclose(interpret(new, xv), np.exp(np.where(x64 < 0, 0.5 * x64, x64)))


def test_a_rule_returning_another_output_of_the_root_is_refused() -> None:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    values, _ = b.exec(ops.sort(), x)
    graph = b.build([b.exec(ops.relu(), values)])
    own_values = Rule(
        Pat.op("sort", Pat.var("x")),
        lambda m: (m.source.symbol(m.root.outputs[0]), m.exec(ops.argmax(axis=1), m["x"])),
    )
    with pytest.raises(GraphError, match="returns some of that node's own outputs"):
        graph_rewrite(graph, [own_values])


@pytest.mark.parametrize("checks", [True, False])
def test_run_passes_refuses_a_pass_that_returns_no_graph(checks: bool) -> None:
    # With checks off (FNNC_CHECKS=0) a pass that forgot its return made run_passes
    # return None, and the next pass or compile failed on it far from the cause.
    graph, *_ = _relu_exp()

    def forgot(g):
        g.nodes

    with pytest.raises(GraphError, match=r"pass forgot \(round 1\) returned NoneType None, not"):
        run_passes(graph, (forgot,), verify_each=checks)
    with config.override(checks=checks), pytest.raises(GraphError, match="not a Graph"):
        simplify(graph, passes=("cse", forgot))


def test_a_pattern_matches_a_command_valued_hyper_parameter_by_equality() -> None:
    # Pat.op("gradient", ..., of=ops.relu()) called the relu command on the node's
    # `of` value as if it were a predicate (DTypeError: input 0 is a Command).
    b = GraphBuilder()
    x = b.input((3,), name="x")
    t = b.exec(ops.tanh(), b.exec(ops.relu(), x))
    s = b.exec(ops.reduce_sum(axes=(0,)), t)
    graph, _ = backward(b.build([s]), s, [x])
    found = {
        of.name: [
            n.cmd.param("of").name
            for n in graph.nodes
            if match(Pat.op("gradient", ..., of=of), graph, n.outputs[0]) is not None
        ]
        for of in (ops.relu(), ops.tanh(), ops.sigmoid())
    }
    assert found == {"relu": ["relu"], "tanh": ["tanh"], "sigmoid": []}
    # a rule on it: swap relu's gradient for a straight-through one (the tanh gradient
    # passes unchanged), checked against the closed form
    ste = Rule(
        Pat.op("gradient", Pat.var("g"), ..., of=ops.relu()),
        lambda m: m.exec(ops.scalar_mul(a=1.0), m["g"]),
    )
    new = graph_rewrite(graph, [ste])
    xv = np.float32([-1.0, 0.5, 2.0])
    _, dx = interpret(new, xv)
    want = 1.0 - np.tanh(np.maximum(xv.astype(np.float64), 0.0)) ** 2
    np.testing.assert_allclose(dx, want, rtol=1e-6)


def _scanned_relu():
    bb = GraphBuilder()
    h, w = bb.input((3,), name="h"), bb.input((3,), name="w")
    body = bb.build([bb.exec(ops.relu(), bb.exec(ops.ewprod(), h, w))])
    b = GraphBuilder()
    h0, stack = b.input((3,), name="h0"), b.input((2, 3), name="W")
    (hf,) = scan(b, body, [h0], [stack])
    loss = b.exec(ops.reduce_sum(axes=(0,)), hf)
    return b.build([loss]), loss, h0, stack


def _backward_of(graph):
    """The gradient of the graph's one output with respect to all its inputs."""
    return backward(graph, graph.outputs[0], list(graph.inputs))[0]


def _leaky_scan_reference(h0, stack, slope):
    def f(h, ws):
        for w in ws:
            z = h * jnp.broadcast_to(w, h.shape)
            h = jnp.where(z >= 0, z, slope * z)
        return jnp.sum(h)

    # jitted: one compile, where eager jax.grad compiled each op of the loop (1.3 s)
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(h0, stack)


LEAKY = Rule(
    Pat.op("relu", Pat.var("x")), lambda m: m.exec(ops.leaky_relu(negative_slope=0.5), m["x"])
)
SILU = Rule(
    Pat.op("relu", Pat.var("x")),
    lambda m: m.exec(ops.ewprod(), m["x"], m.exec(ops.sigmoid(), m["x"])),
)


@pytest.mark.parametrize("after_backward", [False, True])
def test_a_rule_rewriting_a_scan_block_gives_the_new_block_s_gradient(after_backward) -> None:
    # graph_rewrite rewrote a scan's forward and backward bodies on their own: the forward
    # ran leaky_relu and the backward kept gradient[of=relu], so dh0 and dW were 0 where
    # jax.grad of the leaky loop gives -0.25, 0.25, ... (a silently wrong gradient).
    graph, loss, h0, stack = _scanned_relu()
    if after_backward:  # the tape keeps its specs: the gradient node takes the new loop
        grad_graph = graph_rewrite(backward(graph, loss, [h0, stack])[0], [LEAKY])
    else:
        grad_graph = _backward_of(graph_rewrite(graph, [LEAKY]))
    h0v = np.float32([1.0, -2.0, 0.5])
    wv = np.float32([[1.0, 0.5, -1.0], [-0.5, 2.0, 1.0]])
    value, dh0, dw = interpret(grad_graph, h0v, wv)
    want, (want_dh0, want_dw) = _leaky_scan_reference(
        h0v.astype(np.float64), wv.astype(np.float64), 0.5
    )
    np.testing.assert_allclose(value, [want], rtol=1e-6)
    np.testing.assert_allclose(dh0, want_dh0, rtol=1e-6)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-6)


def test_a_rule_changing_a_scan_s_tape_after_backward_is_refused() -> None:
    graph, loss, h0, stack = _scanned_relu()
    x64 = np.float64
    h0v, wv = np.float32([1.0, -2.0, 0.5]), np.float32([[1.0, 0.5, -1.0], [-0.5, 2.0, 1.0]])
    # before backward: silu's backward saves other tensors than relu's; fine
    _, dh0, dw = interpret(_backward_of(graph_rewrite(graph, [SILU])), h0v, wv)

    def f(h, ws):
        for w in ws:
            h = jax.nn.silu(h * w)
        return jnp.sum(h)

    want = jax.jit(jax.grad(f, argnums=(0, 1)))(h0v.astype(x64), wv.astype(x64))
    np.testing.assert_allclose(dh0, want[0], rtol=1e-5)
    np.testing.assert_allclose(dw, want[1], rtol=1e-5)
    # after backward the graph keeps relu's tape for the loop's gradient: refused
    with pytest.raises(GraphError, match="run it on the forward graph, before backward"):
        graph_rewrite(backward(graph, loss, [h0, stack])[0], [SILU])


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
def test_cast_precision_keeps_a_graph_s_own_conversions_exact(low) -> None:
    # cast_precision read a datatype_conversion's input in the low type first: an
    # explicit float16 -> float32 upcast of data came out bfloat16-exact (1000.5 ->
    # 1000, a sum off by 0.5), and float32 -> float16 was rounded to bfloat16 first.
    b = GraphBuilder()
    x, y = b.input((4,), np.float16, name="x"), b.input((4,), np.float32, name="y")
    up = b.exec(ops.datatype_conversion(dtype="float32"), x)
    total = b.exec(ops.reduce_sum(axes=(0,)), up)
    down = b.exec(ops.datatype_conversion(dtype="float16"), y)
    graph = cast_precision(b.build([total, up, down]), low)
    values = np.float32([1.001, 2.003, 3.005, 1000.5])
    xv = values.astype(np.float16)
    got_total, got_up, got_down = interpret(graph, xv, values)
    np.testing.assert_array_equal(got_up, xv.astype(np.float64))
    np.testing.assert_allclose(got_total, [xv.astype(np.float64).sum()], rtol=1e-7)
    np.testing.assert_array_equal(got_down, values.astype(np.float16))


def test_a_rule_rewriting_a_pipeline_block_gives_the_new_block_s_gradient() -> None:
    bb = GraphBuilder()
    h, w = bb.input((1, 3), name="h"), bb.input((3,), name="w")
    body = bb.build([bb.exec(ops.relu(), bb.exec(ops.ewprod(), h, w))])
    b = GraphBuilder()
    h0, stack = b.input((2, 3), name="h0"), b.input((2, 3), name="W")
    (hf,) = pipeline(b, body, [h0], [stack], stages=2, microbatches=2)
    graph = b.build([b.exec(ops.reduce_sum(axes=(0, 1)), hf)])
    rng = np.random.default_rng(0)
    h0v, wv = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    assert np.any(h0v * wv[0] < 0)  # some entries take leaky_relu's negative side
    _, dh0, dw = interpret(
        _backward_of(graph_rewrite(graph, [LEAKY])), h0v.astype(np.float32), wv.astype(np.float32)
    )
    _, (want_dh0, want_dw) = _leaky_scan_reference(
        h0v.astype(np.float32).astype(np.float64), wv.astype(np.float32).astype(np.float64), 0.5
    )
    np.testing.assert_allclose(dh0, want_dh0, rtol=1e-6)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-6, atol=1e-7)


DOUBLE_SECOND = Rule(
    Pat.op("ewsum", Pat.var("a"), Pat.var("b")),
    lambda m: m.exec(ops.add(p=1.0, q=2.0), m["a"], m["b"]),
)


@pytest.mark.parametrize("after_backward", [False, True])
def test_a_rule_leaves_the_backward_body_derived_from_the_rewritten_block_alone(
    after_backward,
) -> None:
    # graph_rewrite derived a scan's backward body from the rewritten block, then ran the
    # rules over every sub-graph again, that new backward body included: the ewsum that
    # adds the gradients of h * w through relu and sigmoid became add[q=2], and dh0 came
    # out [-0.419, 0.936, -1.144] where jax.grad of the rewritten loop gives
    # [-0.244, 0.542, -0.674].
    bb = GraphBuilder()
    h, w = bb.input((3,), name="h"), bb.input((3,), name="w")
    z = bb.exec(ops.ewprod(), h, w)
    out = bb.exec(ops.ewsum(), bb.exec(ops.relu(), z), bb.exec(ops.sigmoid(), z))
    b = GraphBuilder()
    h0, stack = b.input((3,), name="h0"), b.input((2, 3), name="W")
    (hf,) = scan(b, bb.build([out]), [h0], [stack])
    loss = b.exec(ops.reduce_sum(axes=(0,)), hf)
    graph = b.build([loss])
    if after_backward:
        grad_graph = graph_rewrite(backward(graph, loss, [h0, stack])[0], [DOUBLE_SECOND])
    else:
        grad_graph = _backward_of(graph_rewrite(graph, [DOUBLE_SECOND]))
    h0v = np.float32([1.0, -2.0, 0.5])
    wv = np.float32([[1.0, 0.5, -1.0], [-0.5, 2.0, 1.0]])
    value, dh0, dw = interpret(grad_graph, h0v, wv)

    def f(h, ws):
        for w in ws:
            h = jax.nn.relu(h * w) + 2.0 * jax.nn.sigmoid(h * w)
        return jnp.sum(h)

    with jax.enable_x64(True):
        args = (np.float64(h0v), np.float64(wv))
        want = np.asarray(f(*args))
        want_dh0, want_dw = (np.asarray(g) for g in jax.grad(f, argnums=(0, 1))(*args))
    np.testing.assert_allclose(value, [want], rtol=1e-6)
    np.testing.assert_allclose(dh0, want_dh0, rtol=1e-5)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-5)
