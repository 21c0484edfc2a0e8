"""Trace rules and idioms for JAX's descending sorts (``rev``), ``stack``, keepdims
logsumexp and the other scatter-add modes: each traced graph is commands only and
gives exactly what the JAX function gives (values, and gradients through fnnc's
backward where the function is differentiable)."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from fnnc import ops
from fnnc.graph import (
    DynamicGraph,
    GraphBuilder,
    backward,
    compile,
    cse,
    interpret,
    load,
    save,
    simplify,
    trace,
)

RNG = np.random.default_rng(31)


def f32(*shape):
    return RNG.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def names(graph) -> collections.Counter:
    return collections.Counter(n.cmd.name for n in graph.nodes)


def same_bits(got, want):
    """Equal arrays, bit for bit (so ``-0.0`` is not ``0.0``, NaN is NaN)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def commands_only(f, *args):
    """``f`` traced: no generic node, and interpret and compile give f's bits."""
    graph = trace(f, *args)
    assert "primitive" not in names(graph), str(graph)
    want = f(*args)
    same_bits(interpret(graph, *args), want)
    same_bits(compile(graph)(*args), want)
    return graph


def grad_matches(f, *args):
    """fnnc's backward of ``sum(f(args) * c)`` equals ``jax.grad``'s."""
    graph = trace(f, *args)
    b = GraphBuilder.from_graph(graph)
    (out,) = [graph.symbols[i] for i in graph.outputs]
    dy = b.input(out.shape, out.dtype)
    wrt = [graph.symbols[i] for i in graph.inputs]
    g, _ = backward(b.build([out]), out, wrt, df=[dy])
    c = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    got = compile(g)(*args, c)[1:]
    want = jax.grad(lambda *a: jnp.sum(f(*a) * c), argnums=tuple(range(len(args))))(*args)
    for gv, wv in zip(got, want, strict=True):
        np.testing.assert_allclose(gv, wv, 1e-5, 1e-6)


# -- the rev and stack rules, as test_trace.py's RULE_CASES check each rule ------------------
X = f32(3, 4)
MORE_RULE_CASES = {
    "rev": (lambda x: lax.rev(x, (0, 1)) * 2.0, X),
    "stack": (lambda x: jnp.stack([x, x * 2.0, x + 1.0], axis=1), X),
}


@pytest.mark.parametrize("name", sorted(MORE_RULE_CASES))
def test_rev_and_stack_rules_map_and_preserve_values(name):
    f, *args = MORE_RULE_CASES[name]
    prims = {e.primitive.name for e in jax.make_jaxpr(f)(*args).jaxpr.eqns}
    assert name in prims  # jax 0.10 and 0.11 both have the primitive the rule maps
    commands_only(f, *args)
    grad_matches(f, *args)


def test_rev_of_a_constant_folds_and_of_a_length_one_axis_is_no_node():
    table = np.arange(12, dtype=np.float32).reshape(3, 4)
    graph = commands_only(lambda x: x + lax.rev(jnp.asarray(table), (1,)), X)
    assert names(graph)["index_select"] == 0
    graph = commands_only(lambda x: lax.rev(x, (0,)), f32(1, 4))
    assert "index_select" not in names(graph)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
def test_flip_is_exact_for_every_dtype(dtype):
    x = RNG.integers(0, 3, (2, 3, 4)).astype(dtype)
    commands_only(lambda x: jnp.flip(x, (0, 2)), x)


@pytest.mark.parametrize("axis", [0, 1, -1, 3])
def test_stack_along_any_axis(axis):
    a, b = f32(2, 3, 4), f32(2, 3, 4)
    commands_only(lambda a, b: jnp.stack([a, b, a], axis=axis), a, b)
    grad_matches(lambda a, b: jnp.stack([a, b * b], axis=axis), a, b)


def test_stack_of_one_operand_and_of_integers():
    commands_only(lambda x: jnp.stack([x], 0), X)
    i = RNG.integers(-5, 5, (3, 2)).astype(np.int32)
    commands_only(lambda i: jnp.stack([i, i * 3], -1), i)


# -- descending sort and argsort ------------------------------------------------------------
TIES = np.array(
    [[0.0, -0.0, 1.0, np.nan, -0.0, 1.0, 0.0], [2.0, 2.0, -1.0, -np.inf, 2.0, np.inf, 0.5]],
    np.float32,
)


@pytest.mark.parametrize("axis", [0, 1])
def test_descending_float_sort_is_jaxs_bit_for_bit_and_its_gradient(axis):
    """Ties (``0.0`` / ``-0.0``, NaNs, equal values) come out in JAX's order, and the
    gradient reaches the entry JAX's reversal took."""
    f = lambda x: jnp.sort(x, axis=axis, descending=True)
    graph = commands_only(f, TIES)
    assert "sort" in names(graph)
    repeated = np.array([[1.0, 1.0, 0.5, 1.0], [3.0, -2.0, 3.0, 3.0]], np.float32)
    grad_matches(f, repeated)


@pytest.mark.parametrize("axis", [0, 1])
def test_descending_integer_sort_is_one_descending_sort(axis):
    x = RNG.integers(0, 3, (4, 5)).astype(np.int32)
    graph = commands_only(lambda x: jnp.sort(x, axis=axis, descending=True), x)
    (node,) = [n for n in graph.nodes if n.cmd.name == "sort"]
    assert node.cmd.param("descending") is True
    assert "index_select" not in names(graph)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_descending_argsort_is_one_argsort_with_jaxs_ties(axis, dtype):
    x = TIES if dtype == np.float32 else RNG.integers(0, 3, (2, 7)).astype(dtype)
    graph = commands_only(lambda x: jnp.argsort(x, axis=axis, descending=True), x)
    assert list(names(graph)) == ["argsort"], str(graph)
    assert graph.nodes[0].cmd.param("descending") is True


def test_ascending_sort_with_a_reversed_iota_payload():
    """``sort_key_val(x, rev(iota))``: the payload permuted, not argsort."""
    x = RNG.integers(0, 3, (2, 6)).astype(np.float32)

    def f(x):
        back = lax.rev(lax.broadcasted_iota(jnp.int32, x.shape, 1), (1,))
        return lax.sort_key_val(x, back, dimension=1)[1]

    graph = commands_only(f, x)
    assert "argsort" not in names(graph)


# -- logsumexp -------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, -1, (0, 2)])
def test_logsumexp_with_keepdims_is_one_reduce_logsumexp(axis):
    x = 3 * f32(3, 4, 5)
    f = lambda x: jax.nn.logsumexp(x, axis=axis, keepdims=True)
    graph = trace(f, x)
    assert list(names(graph)) == ["reduce_logsumexp"], str(graph)
    np.testing.assert_allclose(interpret(graph, x), f(x), 1e-6, 1e-6)
    grad_matches(f, x)


# -- scatter-add -----------------------------------------------------------------------------
IDX = np.array([0, 3, 3, 1, 0, 9, -1, -7], np.int32)


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint8, np.float32])
def test_integer_scatter_add_counts(dtype):
    f = lambda e: jnp.ones(4, dtype).at[e].add(jnp.asarray(2, dtype))
    graph = commands_only(f, IDX)
    assert "scatter_add" in names(graph)


@pytest.mark.parametrize("mode", ["clip", "promise_in_bounds", "drop"])
def test_scatter_add_modes(mode):
    idx = np.clip(IDX, -4, 3) if mode == "promise_in_bounds" else IDX
    u = f32(len(idx), 3)
    f = lambda u, i: jnp.zeros((4, 3), jnp.float32).at[i].add(u, mode=mode)
    graph = trace(f, u, idx)
    assert "primitive" not in names(graph) and "scatter_add" in names(graph), str(graph)
    np.testing.assert_allclose(interpret(graph, u, idx), f(u, idx), 1e-6, 1e-6)
    grad_matches(lambda u: f(u, idx), u)


def test_integer_clip_scatter_add():
    f = lambda e: jnp.zeros(4, jnp.int32).at[e].add(1, mode="clip")
    graph = commands_only(f, IDX)
    assert "clamp" in names(graph)


def test_interleaved_rope_differentiates():
    def rope(x):
        t, d = x.shape[1], x.shape[-1]
        inv = 1.0 / (10000.0 ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
        angle = jnp.arange(t, dtype=jnp.float32)[:, None] * inv[None]
        cos, sin = jnp.cos(angle)[None, :, None, :], jnp.sin(angle)[None, :, None, :]
        re, im = x[..., 0::2], x[..., 1::2]
        return jnp.stack([re * cos - im * sin, re * sin + im * cos], -1).reshape(x.shape)

    x = f32(2, 3, 2, 8)
    graph = trace(rope, x)
    assert "primitive" not in names(graph), str(graph)
    np.testing.assert_allclose(interpret(graph, x), rope(x), 1e-6, 1e-6)
    grad_matches(rope, x)


# -- max / min / clip: trace keeps JAX's tie rule (half of a tie's gradient to each side) --
TIE_X = np.array([-1.0, 0.0, 0.5, 1.0, 2.0], np.float32)
TIE_CASES = {
    "maximum(x, x)": lambda x: jnp.maximum(x, x) * 3.0,
    "maximum(x, -x)": lambda x: jnp.maximum(x, -x),
    "minimum(x, 0.5)": lambda x: jnp.minimum(x, 0.5) * x,
    "clip(x, 0, 1)": lambda x: jnp.clip(x, 0.0, 1.0),
}


def _grad_of(graph, x):
    """fnnc's gradient of sum(graph(x) * w) by the backward pass, and the forward graph."""
    b = GraphBuilder.from_graph(graph)
    (out,) = [graph.symbols[i] for i in graph.outputs]
    w = b.constant(np.arange(1.0, 6.0, dtype=np.float32))
    loss = b.exec(ops.reduce_sum(axes=(0,)), b.exec(ops.ewprod(), out, w))
    return backward(b.build([loss]), loss, [graph.symbols[graph.inputs[0]]])[0]


@pytest.mark.parametrize("name", sorted(TIE_CASES))
def test_traced_max_min_and_clip_split_ties_as_jax_grad(name, tmp_path):
    f = TIE_CASES[name]
    want = jax.grad(lambda x: jnp.sum(f(x) * jnp.arange(1.0, 6.0)))(TIE_X)
    graph = trace(f, TIE_X)
    picks = [n.cmd for n in graph.nodes if n.cmd.name in ("max", "min")]
    assert picks and all(c.param("ties") == "split" for c in picks), str(graph)
    save(graph, tmp_path / "g.json")
    fused = simplify(graph, passes=("cse", "fold", "fuse", "dce"))
    for form in (graph, load(tmp_path / "g.json"), fused):
        g = _grad_of(form, TIE_X)
        np.testing.assert_allclose(interpret(g, TIE_X)[-1], want, err_msg=str(form))
        np.testing.assert_allclose(compile(g)(TIE_X)[-1], want, err_msg=str(form))
    # through jax.vjp of the graph as one call node (each command's own backward rule)
    dg = DynamicGraph()
    x = dg.variable(TIE_X)
    y = dg.evaluate(graph, [x])
    loss = dg.exec(
        ops.reduce_sum(axes=(0,)),
        dg.exec(ops.ewprod(), y, dg.constant(np.arange(1.0, 6.0, dtype=np.float32))),
    )
    (gx,) = dg.backward(loss, [x])
    np.testing.assert_allclose(gx.numpy(), want)


def test_untraced_max_keeps_nncs_tie_rule_and_cse_keeps_the_two_apart():
    b = GraphBuilder()
    x = b.input((3,), name="x")
    nnc, split = b.exec(ops.max(), x, x), b.exec(ops.max(ties="split"), x, x)
    graph = b.build([b.exec(ops.ewsum(), nnc, split)])
    assert len(cse(graph).nodes) == 3
    loss = b.exec(ops.reduce_sum(axes=(0,)), graph.symbols[graph.outputs[0]])
    g = backward(b.build([loss]), loss, [x])[0]
    np.testing.assert_allclose(interpret(g, np.ones(3, np.float32))[-1], [3.0, 3.0, 3.0])  # 2 + 1
