"""Traced reductions against JAX: logsumexp's gradient for large logits, reductions
over empty axes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import backward, interpret, trace
from tests.helpers import assert_close

BASE = np.array([[0.0, 0.0, -0.5, -2.0, 0.3, 0.1, -1.0, 0.2]], np.float32)


def _lse_sum(x):
    return jnp.sum(jax.nn.logsumexp(x, axis=-1))


def _traced_grad(f, x):
    graph = trace(f, x)
    with_grad, _ = backward(graph, graph.outputs[0], [graph.inputs[0]])
    return np.asarray(interpret(with_grad, x)[1])


@pytest.mark.parametrize("offset", [1e3, 1e4, 1e5, 1e6])
def test_traced_logsumexp_gradient_for_large_logits_is_jax_grad(offset) -> None:
    # the softmax must be taken with the maximum shifted out: exp(x - y), y the rounded
    # output, drifts by y's rounding (2e-4 at 1e4, 2% at 1e6; rows no longer sum to 1)
    x = BASE + np.float32(offset)
    graph = trace(_lse_sum, x)
    assert "reduce_logsumexp" in {n.cmd.name for n in graph.nodes}
    got, want = _traced_grad(_lse_sum, x), np.asarray(jax.grad(_lse_sum)(x))
    assert_close(got, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got.sum(), 1.0, rtol=1e-6)


def test_logsumexp_gradient_of_huge_equal_maxima_splits_them() -> None:
    x = np.array([[1e30, 1e30, -1e30], [1.0, 2.0, 3.0]], np.float32)
    got = _traced_grad(_lse_sum, x)
    assert_close(got, jax.grad(_lse_sum)(x), rtol=1e-6, atol=1e-7)
    assert_close(got[0], np.array([0.5, 0.5, 0.0], np.float32))


def test_reduce_logsumexp_backward_is_the_vjp_of_the_reference() -> None:
    x = jnp.asarray(BASE + np.float32(1e5)).reshape(2, 4)
    cmd = ops.reduce_logsumexp(axes=(1,))
    y, pullback = jax.vjp(lambda v: jax.nn.logsumexp(v, axis=1, keepdims=True), x)
    g = jnp.asarray([[2.0], [-1.0]], jnp.float32)
    (got,) = cmd.definition.backward((g,), (x,), (y,), axes=(1,))
    assert_close(got, pullback(g)[0], rtol=1e-6, atol=1e-7)


EMPTY = np.zeros((2, 0), np.float32)
EMPTY_CASES = {
    "max_initial": (lambda a: jnp.max(a, axis=1, initial=-jnp.inf), np.full(2, -np.inf)),
    "min_initial": (lambda a: jnp.min(a, axis=1, initial=jnp.inf), np.full(2, np.inf)),
    "max_initial_finite": (lambda a: jnp.max(a, axis=(0, 1), initial=3.0), np.float32(3.0)),
    "logsumexp": (lambda a: jax.nn.logsumexp(a, axis=1), np.full(2, -np.inf)),
    "reduce_max": (lambda a: jax.lax.reduce_max(a, (1,)), np.full(2, -np.inf)),
    "sum": (lambda a: jnp.sum(a, axis=1), np.zeros(2)),
}


@pytest.mark.parametrize("name", sorted(EMPTY_CASES))
def test_reduction_over_an_empty_axis_traces_to_jax_value(name) -> None:
    # NumPy's identities: max/min over nothing is their initial (-inf for lax.reduce_max),
    # a sum 0, log(sum(exp())) of nothing -inf; the max/min commands refuse an empty axis
    f, want = EMPTY_CASES[name]
    graph = trace(f, EMPTY)
    assert_close(interpret(graph, EMPTY), jnp.asarray(want, jnp.float32))
    assert_close(interpret(graph, EMPTY), f(EMPTY))


def test_max_over_an_empty_axis_differentiates() -> None:
    def f(a):
        return jnp.sum(jnp.max(a, axis=1, initial=0.0))

    graph = trace(f, EMPTY)
    with_grad, _ = backward(graph, graph.outputs[0], [graph.inputs[0]])
    value, grad = interpret(with_grad, EMPTY)
    assert_close(value, f(EMPTY))
    assert grad.shape == (2, 0)
