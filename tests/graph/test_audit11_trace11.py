"""Audit 11 (trace): regressions found by using trace as a demanding user would.

Oracles: JAX's own values and gradients (jax.grad) of the traced function, and NumPy.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import TraceError
from fnnc.graph import backward, compile, interpret, trace

FLOAT8 = [jnp.float8_e4m3fn, jnp.float8_e5m2]


@pytest.mark.parametrize("dtype", FLOAT8, ids=lambda d: np.dtype(d).name)
def test_negation_of_float8_runs_and_equals_jax(dtype) -> None:
    """-x of a float8 array traces to scalar_mul(a=-1), whose float32 widening asked
    jnp.promote_types(float8, float32), which JAX refuses: a valid JAX program failed in
    interpret and compile with TypePromotionError."""
    x = jnp.array([1.0, -2.0, 3.0, 0.5, -0.0], dtype)
    graph = trace(lambda a: -a, x)
    want = np.asarray(-x)
    for got in (interpret(graph, x), compile(graph)(x)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got, np.float32), want.astype(np.float32))
        assert np.array_equal(np.signbit(np.asarray(got, np.float32)), np.signbit(-x))

    def loss(a):
        return jnp.sum((-a).astype(jnp.float32) * jnp.arange(5.0))

    h = trace(loss, x)
    gg, _ = backward(h, h.outputs[0], [h.inputs[0]])
    want_grad = np.asarray(jax.grad(loss)(x), np.float32)
    np.testing.assert_array_equal(np.asarray(interpret(gg, x)[-1], np.float32), want_grad)


@pytest.mark.parametrize("dtype", FLOAT8, ids=lambda d: np.dtype(d).name)
def test_scalar_products_of_float8_round_once_from_float32(dtype) -> None:
    """scalar_mul / add(p, q) of float8 values: computed in float32, rounded once."""
    x = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
    a = jnp.asarray(x, dtype)
    wide = np.asarray(a, np.float32)
    cmd = ops.scalar_mul(a=0.75)
    got = cmd.definition.forward(a, **cmd.kwargs)
    np.testing.assert_array_equal(got, (wide * 0.75).astype(dtype))
    cmd = ops.add(p=0.5, q=2.0)
    got = cmd.definition.forward(a, a, **cmd.kwargs)
    np.testing.assert_array_equal(got, (wide * 0.5 + wide * 2.0).astype(dtype))


def test_jax_grad_of_a_run_traced_relu_is_zero_at_zero() -> None:
    """jax.nn.relu traces to the relu command, whose forward was lax.max(x, 0): jax.grad
    (or jax.jvp) of interpret / compile of the graph split the tie at 0 (0.5) where
    jax.grad of jax.nn.relu, and fnnc's own backward of the graph, give 0."""
    x = jnp.array([0.0, -0.0, 1.5, -1.0, 2.0], jnp.float32)
    graph = trace(jax.nn.relu, x)
    assert [n.cmd.name for n in graph.nodes] == ["relu"]
    weights = jnp.arange(1.0, 6.0)

    def loss(run):
        return lambda a: jnp.sum(run(a) * weights)

    want = np.asarray(jax.grad(loss(jax.nn.relu))(x))
    np.testing.assert_array_equal(want, [0.0, 0.0, 3.0, 0.0, 5.0])
    program = compile(graph)
    for run in (lambda a: interpret(graph, a), program):
        np.testing.assert_array_equal(jax.grad(loss(run))(x), want)
        tangent = jax.jvp(run, (x,), (jnp.ones_like(x),))[1]
        np.testing.assert_array_equal(tangent, [0.0, 0.0, 1.0, 0.0, 1.0])
    h = trace(loss(jax.nn.relu), x)
    gg, _ = backward(h, h.outputs[0], [h.inputs[0]])
    np.testing.assert_array_equal(interpret(gg, x)[-1], want)


def _pool(x):
    """A 1-D max pool (window 3, stride 1, one padded cell each side) as Flax spells it."""
    return jax.lax.reduce_window(
        x.reshape(1, 6, 1), -jnp.inf, jax.lax.max, (1, 3, 1), (1, 1, 1), ((0, 0), (1, 1), (0, 0))
    )


def test_jax_grad_of_a_run_traced_max_pool_gives_a_tie_to_the_first_maximum() -> None:
    """max_pool's CPU forward is the maximum of the window cells (jnp.maximum), whose JAX
    derivative splits a tie among the tied cells: jax.grad of interpret / compile of a
    traced max pool split ties ([1.5, 3, 0, 10.5, 3, 3]) where jax.grad of reduce_window (and
    fnnc's backward) give each window's gradient to its first maximum."""
    x = jnp.array([2.0, 2.0, -1.0, 2.0, 0.0, 0.0], jnp.float32)
    graph = trace(_pool, x)
    assert "max_pool" in [n.cmd.name for n in graph.nodes]
    weights = jnp.arange(1.0, 7.0).reshape(1, 6, 1)

    def loss(run):
        return lambda a: jnp.sum(run(a) * weights)

    want = np.asarray(jax.grad(loss(_pool))(x))
    np.testing.assert_array_equal(want, [3.0, 3.0, 0.0, 9.0, 6.0, 0.0])
    want_tangent = np.asarray(jax.jvp(_pool, (x,), (jnp.arange(6.0),))[1])
    program = compile(graph)
    for run in (lambda a: interpret(graph, a), program):
        np.testing.assert_array_equal(run(x), _pool(x))
        np.testing.assert_array_equal(jax.grad(loss(run))(x), want)
        np.testing.assert_array_equal(jax.jvp(run, (x,), (jnp.arange(6.0),))[1], want_tangent)
    h = trace(loss(_pool), x)
    gg, _ = backward(h, h.outputs[0], [h.inputs[0]])
    np.testing.assert_array_equal(interpret(gg, x)[-1], want)


def test_a_wrong_count_of_example_arguments_is_a_trace_error_naming_the_signature() -> None:
    """trace(fn, x) for fn(x, y) raised the function's own TypeError from inside
    jax.make_jaxpr; it is now a TraceError naming fn's signature and the count given."""
    x = jnp.ones((2,), jnp.float32)

    def fn(x, y):
        return x + y

    with pytest.raises(TypeError) as direct:  # the oracle: Python's own call
        fn(x)
    with pytest.raises(TraceError) as e:
        trace(fn, x)
    said = str(e.value)
    assert "fn(x, y)" in said and "1 example argument" in said and "'y'" in said
    assert "'y'" in str(direct.value)
    with pytest.raises(TraceError, match="2 example argument"):
        trace(lambda x: x, x, x)
    graph = trace(lambda *xs: xs[0] * xs[1], x, x)  # *args takes any count
    np.testing.assert_array_equal(interpret(graph, x, x), x * x)

    def binds_scale(f):  # a decorator taking fewer arguments than the function it wraps
        @functools.wraps(f)
        def wrapper(x):
            return f(x, 2.0)

        return wrapper

    @binds_scale
    def scaled(x, s):
        return x * s

    np.testing.assert_array_equal(interpret(trace(scaled, x), x), x * 2.0)
