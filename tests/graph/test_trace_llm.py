"""Traced LLM code becomes NNC's commands: RoPE (rotate-half), SwiGLU, top-k routing,
scatter-add, sort, logsumexp, sin / cos / pow. No generic ``primitive`` node is left;
the graphs save and load, and their gradients (fnnc's ``backward`` pass, each command's
own backward) equal ``jax.grad`` of the original function."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, compile, interpret, load, save, trace
from fnnc.graph.trace_idioms import rewrite_idioms
from tests.helpers import assert_close, rand


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def rope(x, positions):
    """Hugging Face Llama's rotary embedding (frequencies from positions)."""
    dim = x.shape[-1]
    inv = 1.0 / (10000.0 ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    freqs = positions[:, None] * inv[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return x * jnp.cos(emb) + rotate_half(x) * jnp.sin(emb)


def swiglu_mlp(x, w_gate, w_up, w_down):
    return (jax.nn.silu(x @ w_gate) * (x @ w_up)) @ w_down


def topk_routing(x, w_router):
    """Mixture-of-experts routing: softmax over the top-2 expert logits, and the load
    per expert (a scatter-add of the routing weights)."""
    logits = x @ w_router
    top, experts = jax.lax.top_k(logits, 2)
    weights = jax.nn.softmax(top, axis=-1)
    load = jnp.zeros((w_router.shape[1],), x.dtype).at[experts.reshape(-1)].add(weights.reshape(-1))
    return weights, load


def scatter_rows(table, index, rows):
    return jnp.asarray(table).at[index].add(rows * 2.0)


def lse_loss(logits, labels):
    """Cross-entropy written out: logsumexp minus the label's logit."""
    picked = jnp.sum(logits * jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype), axis=-1)
    return jax.nn.logsumexp(logits, axis=-1) - picked


CASES = {
    "rope": (
        rope,
        (rand((3, 8), seed=1), rand((3,), lo=0, hi=5, seed=2)),
        {"rotate_half", "ewsin", "ewcos", "ewpow"},
    ),
    "swiglu": (
        swiglu_mlp,
        (rand((4, 6), seed=3), rand((6, 8), seed=4), rand((6, 8), seed=5), rand((8, 6), seed=6)),
        {"swish_mul"},
    ),
    "topk": (
        topk_routing,
        (rand((5, 6), seed=7), rand((6, 4), seed=8)),
        {"partition", "scatter_add"},
    ),
    "scatter_add": (
        scatter_rows,
        (rand((5, 3), seed=9), np.array([4, 0, 4, -1], np.int32), rand((4, 3), seed=10)),
        {"scatter_add"},
    ),
    "logsumexp": (
        lse_loss,
        (rand((4, 5), lo=-3, hi=3, seed=11), np.array([1, 0, 4, 2], np.int32)),
        {"reduce_logsumexp"},
    ),
}


def _names(graph) -> collections.Counter:
    return collections.Counter(n.cmd.name for n in graph.nodes)


@pytest.mark.parametrize("name", sorted(CASES))
def test_traced_idiom_is_commands_and_saves(name, tmp_path):
    f, args, wanted = CASES[name]
    graph = trace(f, *args)
    names = _names(graph)
    assert "primitive" not in names, f"generic nodes left:\n{graph}"
    assert wanted <= set(names), f"expected {wanted} in\n{graph}"
    got = compile(graph)(*args)
    assert_close(got, f(*args), rtol=1e-5, atol=1e-5)
    path = tmp_path / "g.json"
    save(graph, str(path))
    loaded = load(str(path))
    assert _names(loaded) == names
    assert_close(compile(loaded)(*args), got, rtol=0, atol=0)


def _fnnc_grads(graph, args):
    """Gradient of the sum of every float output wrt every float input, through
    fnnc's ``backward`` pass."""
    b = GraphBuilder.from_graph(graph)
    total = None
    for sid in graph.outputs:
        sym = graph.symbols[sid]
        if not jnp.issubdtype(sym.dtype, jnp.floating):
            continue
        s = b.exec(ops.reduce_sum(axes=tuple(range(len(sym.shape)))), sym) if sym.shape else sym
        s = b.exec(ops.reshape(shape=()), s)
        total = s if total is None else b.exec(ops.add(), total, s)
    wrt = [graph.symbols[i] for i, a in zip(graph.inputs, args) if np.asarray(a).dtype.kind == "f"]
    gg, _ = backward(b.build([total]), total, wrt)
    return compile(gg)(*args)[1:]  # after the total


@pytest.mark.parametrize("name", sorted(CASES))
def test_traced_idiom_gradient_equals_jax_grad(name):
    f, args, _ = CASES[name]
    graph = trace(f, *args)
    floats = [i for i, a in enumerate(args) if np.asarray(a).dtype.kind == "f"]

    def loss(*diff):
        full = list(args)
        for i, d in zip(floats, diff):
            full[i] = d
        return sum(
            jnp.sum(o) for o in jax.tree.leaves(f(*full)) if jnp.issubdtype(o.dtype, jnp.floating)
        )

    want = jax.grad(loss, argnums=tuple(range(len(floats))))(
        *[jnp.asarray(args[i]) for i in floats]
    )
    assert_close(tuple(_fnnc_grads(graph, args)), tuple(want), rtol=1e-4, atol=1e-5)


def test_sort_and_argsort_trace_to_one_command_each():
    x = rand((3, 5), seed=12)
    graph = trace(lambda x: (jnp.sort(x, axis=0), jnp.argsort(x, axis=1)), x)
    assert _names(graph)["sort"] == 2 and "primitive" not in _names(graph)
    values, indices = interpret(graph, x)
    np.testing.assert_array_equal(values, np.sort(x, axis=0))
    np.testing.assert_array_equal(indices, np.argsort(x, axis=1, kind="stable"))


def test_a_shared_silu_stays_swish_and_the_product_stays_a_mul():
    """SwiGLU fuses only when the SiLU is read by the product alone."""
    a, u = rand((2, 4), seed=13), rand((2, 4), seed=14)

    def f(a, u):
        s = jax.nn.silu(a)
        return s * u, s

    graph = trace(f, a, u)
    names = _names(graph)
    assert names["swish"] == 1 and "swish_mul" not in names and "sigmoid" not in names
    assert_close(interpret(graph, a, u), (jax.nn.silu(a) * u, jax.nn.silu(a)))


def test_a_half_swap_without_the_minus_sign_is_left_alone():
    x = rand((2, 6), seed=15)
    f = lambda x: jnp.concatenate([x[:, 3:], -x[:, :3]], axis=1)
    graph = trace(f, x)
    assert "rotate_half" not in _names(graph)
    assert_close(interpret(graph, x), f(x))


def test_logsumexp_with_a_shift_that_is_not_the_maximum_is_left_alone():
    x = rand((3, 4), seed=16)

    def f(x):
        shift = jax.lax.stop_gradient(jnp.where(jnp.isfinite(x.min(axis=1)), x.min(axis=1), 0.0))
        return jnp.log(jnp.sum(jnp.exp(x - shift[:, None]), axis=1)) + shift

    graph = trace(f, x)
    assert "reduce_logsumexp" not in _names(graph)
    assert_close(interpret(graph, x), f(x))


def test_rewrite_idioms_returns_the_same_graph_when_nothing_matches():
    graph = trace(lambda x: jnp.tanh(x) * 2.0, rand((2, 3)))
    assert rewrite_idioms(graph) is graph


def test_scatter_add_drops_indices_out_of_range_as_jax_does():
    """``lax.scatter_add`` drops an index of -1 (no wrap-around) and one past the end."""
    x, rows = rand((4, 2), seed=17), rand((3, 2), seed=18)

    def f(x, rows):
        dn = jax.lax.ScatterDimensionNumbers((1,), (0,), (0,))
        return jax.lax.scatter_add(x, jnp.array([[1], [-1], [4]], jnp.int32), rows, dn)

    graph = trace(f, x, rows)
    assert "scatter_add" in _names(graph) and "primitive" not in _names(graph)
    assert_close(interpret(graph, x, rows), f(x, rows))


def test_rewrite_idioms_is_idempotent():
    f, args, _ = CASES["rope"]
    graph = trace(f, *args)
    assert rewrite_idioms(graph) is graph
