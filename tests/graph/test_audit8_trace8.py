"""Audit 8 (trace): regressions found by using trace as a demanding user would.

Oracles: JAX's own error types and values (jnp code that the hint recommends).
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc.errors import CommandError, DTypeError, TraceError
from fnnc.graph import backward, interpret, trace


def test_numpy_on_a_traced_array_gets_the_jax_numpy_hint_not_the_static_one() -> None:
    """np.sin(x) inside fn raised TracerArrayConversionError, which trace reported as
    "needs an argument as a concrete Python value (a shape, a jit static argument, a
    Python if)" with functools.partial(fn, n=...): binding x does not help, jnp does."""
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    with pytest.raises(TraceError) as e:
        trace(lambda x: np.sin(x) * 2, x)
    said = str(e.value)
    assert "NumPy" in said and "jax.numpy" in said and "jnp.sin" in said
    assert "a Python if" not in said and "JAX said: TracerArrayConversionError" in said
    assert isinstance(e.value.__cause__, jax.errors.TracerArrayConversionError)
    graph = trace(lambda x: jnp.sin(x) * 2, x)  # what the hint says works
    np.testing.assert_allclose(interpret(graph, x), np.sin(x.astype(np.float64)) * 2, rtol=1e-6)


def test_numpy_on_a_python_number_argument_names_it_and_binding_works() -> None:
    x = np.ones((2, 3), np.float32)

    def fn(x, n):
        return x * np.asarray(n).sum()

    with pytest.raises(TraceError, match=r"functools\.partial\(fn, n=") as e:
        trace(fn, x, 3)
    assert "Python numbers here: n" in str(e.value) and "jax.numpy" in str(e.value)
    graph = trace(functools.partial(fn, n=3), x)
    np.testing.assert_allclose(interpret(graph, x), np.full((2, 3), 3.0))


def _sum_of(f):
    return lambda x: jnp.sum(f(x))


NOT_REVERSE_DIFFERENTIABLE = {
    "while_loop": (
        _sum_of(lambda x: jax.lax.while_loop(lambda c: c.sum() < 50, lambda c: c * 2, x)),
        "while",
    ),
    "pure_callback": (
        _sum_of(lambda x: jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)),
        "pure_callback",
    ),
}


@pytest.mark.parametrize("name", sorted(NOT_REVERSE_DIFFERENTIABLE))
def test_backward_through_a_primitive_jax_cannot_reverse_is_refused_by_name(name) -> None:
    """backward() built a gradient node for a traced while_loop / pure_callback that JAX
    cannot differentiate; it failed only when the gradient graph ran: a bare JAX
    ValueError out of compile, a GraphError from interpret. Oracle: jax.grad fails too."""
    f, prim = NOT_REVERSE_DIFFERENTIABLE[name]
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError):  # JAX says why
        jax.grad(f)(x)
    graph = trace(f, x)
    with pytest.raises(CommandError, match=f"primitive {prim} ") as e:
        backward(graph, graph.outputs[0], [graph.inputs[0]])
    assert "JAX said" in str(e.value) and "stop_gradient" in str(e.value)


def test_backward_through_a_while_loop_for_its_condition_input_only_still_works() -> None:
    """The refusal is JAX's own answer for the inputs asked: an input reaching the loop
    only through its condition has a (zero) gradient, as jax.grad says."""

    def f(x, w):
        return jnp.sum(jax.lax.while_loop(lambda c: c.sum() < w.sum(), lambda c: c + 1.0, x)) * w[0]

    x, w = np.zeros(2, np.float32), np.full(2, 3.0, np.float32)
    graph = trace(f, x, w)
    grad_graph, _ = backward(graph, graph.outputs[0], [graph.inputs[1]])
    got = interpret(grad_graph, x, w)[-1]
    np.testing.assert_allclose(got, jax.jit(jax.grad(f, argnums=1))(x, w), rtol=1e-6)


@pytest.mark.parametrize("error", [RuntimeError("a bug in fnnc"), DTypeError("a bug in fnnc")])
def test_an_internal_error_in_the_derived_backward_propagates(monkeypatch, error) -> None:
    """vjp_problem caught every exception while tracing the derived backward and said
    "JAX has no reverse-mode derivative of the primitive cummax" for any of them, a bug
    in fnnc's own code included; only JAX's errors for such primitives are answered so
    now. fnnc's own errors (a DTypeError is a TypeError too) propagate as well."""
    primitive = sys.modules["fnnc.ops.primitive"]

    def f(x):
        return jnp.sum(jax.lax.cummax(x, 0) * x)

    x = np.float32([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]])
    graph = trace(f, x)
    primitive.vjp_problem.cache_clear()
    grad_graph, _ = backward(graph, graph.outputs[0], [graph.inputs[0]])  # unpatched: fine
    with jax.enable_x64(True):
        want = np.asarray(jax.grad(f)(np.float64(x)))
    np.testing.assert_allclose(interpret(grad_graph, x)[-1], want, rtol=1e-6)

    def broken(prim, params, args):
        raise error

    monkeypatch.setattr(primitive, "bind", broken)
    primitive.vjp_problem.cache_clear()
    try:
        with pytest.raises(Exception, match="a bug in fnnc") as e:
            backward(graph, graph.outputs[0], [graph.inputs[0]])
        # the builder names the node: a DTypeError stays one, another exception becomes
        # its RuleError for a failing shape rule, naming the exception
        said = str(e.value)
        assert "reverse-mode" not in said and "JAX said" not in said
        assert isinstance(e.value, type(error)) or "RuntimeError: a bug in fnnc" in said
    finally:
        primitive.vjp_problem.cache_clear()
