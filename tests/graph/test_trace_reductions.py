"""Traced reductions against JAX: logsumexp's gradient for large logits."""

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
