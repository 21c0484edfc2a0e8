"""Common Flax layers trace to commands only, and fnnc's backward of the traced graph
equals ``jax.grad`` of the original function (stop_gradient, gather, softplus, ... keep
JAX's derivatives, not just its values)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fnnc.graph import backward, compile, trace
from tests.graph.test_trace import generic_prims
from tests.helpers import assert_close, rand

IMG = rand((2, 6, 6, 3), seed=1)
SEQ = rand((2, 5, 8), seed=2)
X = rand((4, 8), lo=-3, hi=3, seed=3)
IDS = np.array([[1, 9, 0], [3, 3, -2]], np.int32)


def _module(layer: nnx.Module):
    """(f(state, x), state): the layer as a pure function of its parameters."""
    graphdef, state = nnx.split(layer)
    return (lambda state, x: nnx.merge(graphdef, state)(x)), state


def _layers() -> dict:
    rngs = nnx.Rngs(0)
    cases = {
        "embed": (*_module(nnx.Embed(10, 4, rngs=rngs)), IDS),
        "batch_norm": (*_module(nnx.BatchNorm(3, use_running_average=False, rngs=rngs)), IMG),
        "attention": (*_module(nnx.MultiHeadAttention(2, 8, decode=False, rngs=rngs)), SEQ),
        "layer_norm": (*_module(nnx.LayerNorm(8, rngs=rngs)), X),
    }
    return cases


FUNCTIONS = {
    "softplus": jax.nn.softplus,
    "log_sigmoid": jax.nn.log_sigmoid,
    "softmax": jax.nn.softmax,
    "log_softmax": jax.nn.log_softmax,
    "exact_gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "stop_gradient": lambda x: x * jax.lax.stop_gradient(jnp.tanh(x)),
    "avg_pool": lambda x: nnx.avg_pool(x.reshape(1, 4, 4, 1), (2, 2), (1, 2), "SAME"),
    "take_fill": lambda x: jnp.take(x, jnp.array([3, -1, 7, -9, 0]), axis=0),
    "index_clip": lambda x: jnp.take(x, jnp.array([[0, 3], [9, -7]]), axis=0, mode="clip"),
    # x[i] promises in-bounds indices (outside, JAX clamps reads but drops gradients)
    "index_promised": lambda x: jnp.asarray(x)[jnp.array([[0, 3], [2, -1]])],
}


def _check_gradients(f, *args) -> None:
    """Values, no generic node, and fnnc's backward equals jax.grad for float inputs."""
    out_shape = jax.eval_shape(f, *args).shape
    ct = rand(out_shape, seed=11)

    def loss(*a):
        return jnp.sum(f(*a) * ct)

    graph = trace(loss, *args)
    assert not generic_prims(graph), generic_prims(graph)
    leaves = jax.tree.leaves(args)
    floats = [i for i, v in enumerate(leaves) if np.issubdtype(np.asarray(v).dtype, np.floating)]
    out = graph.symbols[graph.outputs[0]]
    grad_graph, _ = backward(graph, out, [graph.inputs[i] for i in floats])
    got = compile(grad_graph)(*args)
    want_tree = jax.grad(loss, argnums=tuple(range(len(args))), allow_int=True)(*args)
    want = [w for i, w in enumerate(jax.tree.leaves(want_tree)) if i in floats]
    assert_close(got[0], loss(*args), rtol=1e-5, atol=1e-5)
    assert_close(list(got[1:]), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_function_traces_to_commands_with_jax_gradients(name: str) -> None:
    f = FUNCTIONS[name]
    x = rand((16,), lo=-4, hi=4, seed=5) if not name.startswith(("take", "index")) else X[:, :4]
    x = x.reshape(4, 4) if name in ("softmax", "log_softmax") else x
    _check_gradients(f, x)


@pytest.mark.parametrize("name", ["embed", "batch_norm", "attention", "layer_norm"])
def test_layer_traces_to_commands_with_jax_gradients(name: str) -> None:
    f, state, x = _layers()[name]
    _check_gradients(f, state, x)


def test_softplus_at_the_extremes_matches_jax() -> None:
    x = np.array([-np.inf, -100.0, -1.0, 0.0, 1.0, 100.0, np.inf], np.float32)
    graph = trace(lambda x: jnp.sum(jax.nn.softplus(x)), x)
    grad_graph, _ = backward(graph, graph.outputs[0], [graph.inputs[0]])
    got = compile(grad_graph)(x)[1]
    assert_close(got, jax.grad(lambda x: jnp.sum(jax.nn.softplus(x)))(x), rtol=0, atol=0)


def test_out_of_range_take_reads_nan_and_gets_no_gradient() -> None:
    table = rand((3, 2))
    idx = np.array([-7, -4, -1, 2, 3], np.int32)  # -7 and -4 wrap out of range, 3 too
    graph = trace(lambda t, i: jnp.take(t, i, axis=0), table, idx)
    want = jnp.take(table, idx, axis=0)
    got = compile(graph)(table, idx)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert_close(got[~np.isnan(want)], want[~np.isnan(want)], rtol=0, atol=0)
