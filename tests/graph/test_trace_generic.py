"""Primitives without a trace rule become one generic node whose backward is jax.vjp."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from fnnc import ops
from fnnc.graph import backward, interpret, trace
from fnnc.graph.trace_rules import TRACE_RULES
from fnnc.ops.primitive import Opaque, primitive_command
from tests.helpers import assert_close, rand

CASES = {
    "cumsum": (lambda x: jnp.cumsum(x, axis=1), rand((3, 4))),
    "tan": (jnp.tan, rand((3, 4))),
    "cummax": (lambda x: lax.cummax(x, axis=0), rand((5, 3))),
    # a custom_jvp other than relu: the node must keep JAX's custom derivative
    "custom_jvp_call": (lambda x: jnp.logaddexp(x, 0.5), rand((4,))),
    "cond": (lambda x: lax.cond(x[0] > 0, jnp.sin, jnp.cos, x), rand((3,))),
}


def _single_generic_node(graph, name: str):
    (node,) = [
        n for n in graph.nodes if n.cmd.name == "primitive" and str(n.cmd.param("prim")) == name
    ]
    return node


def graph_vjp(graph, args, cts):
    """Reverse mode through ``graph`` with each command's own backward (no aliases here)."""
    env = dict(zip(graph.inputs, args))
    for node in graph.nodes:
        out = node.cmd.definition.forward(*[env[i] for i in node.inputs], **node.cmd.kwargs)
        env.update(zip(node.outputs, out if isinstance(out, tuple) else (out,)))
    grads = dict(zip(graph.outputs, cts))
    for node in reversed(graph.nodes):
        gs = [grads.get(o) for o in node.outputs]
        opdef = node.cmd.definition
        if all(g is None for g in gs) or not opdef.attributes.differentiable:
            continue
        ins, outs = [env[i] for i in node.inputs], [env[o] for o in node.outputs]
        for i, g in zip(node.inputs, opdef.backward(gs, ins, outs, **node.cmd.kwargs)):
            if g is not None and jnp.issubdtype(env[i].dtype, jnp.inexact):
                grads[i] = g if i not in grads else grads[i] + g
    return [grads.get(i, jnp.zeros_like(env[i])) for i in graph.inputs]


@pytest.mark.parametrize("name", sorted(CASES))
def test_generic_node_values_and_backward(name: str) -> None:
    f, x = CASES[name]
    graph = trace(f, x)
    _single_generic_node(graph, name)
    assert_close(interpret(graph, x), f(x))
    out, pullback = jax.vjp(f, jnp.asarray(x))
    ct = jnp.asarray(rand(out.shape, seed=3))
    (want,) = pullback(ct)
    (got,) = graph_vjp(graph, [jnp.asarray(x)], [ct])
    assert_close(got, want)


def test_generic_backward_is_the_vjp_of_the_primitive() -> None:
    x = jnp.asarray(rand((3, 4)))
    node = _single_generic_node(trace(lambda x: jnp.cumsum(x, axis=1), x), "cumsum")
    ct = jnp.asarray(rand((3, 4), seed=1))
    y = ops.lookup("primitive").forward(x, **node.cmd.kwargs)
    (got,) = ops.lookup("primitive").backward((ct,), (x,), (y,), **node.cmd.kwargs)
    assert_close(got, jax.vjp(lambda x: jnp.cumsum(x, axis=1), x)[1](ct)[0])


def test_generic_node_with_several_outputs() -> None:
    def f(x):
        return lax.sort((x, -x), num_keys=1)

    x = rand((6,))
    graph = trace(f, x)
    node = _single_generic_node(graph, "sort")
    assert len(node.outputs) == 2
    assert_close(interpret(graph, x), f(x))


def test_primitive_without_operands(monkeypatch) -> None:
    monkeypatch.delitem(TRACE_RULES, "iota")  # iota maps to a constant; take the generic path
    graph = trace(lambda x: x + lax.iota(np.float32, 3), rand((3,)))
    node = _single_generic_node(graph, "iota")
    assert node.inputs == ()
    assert_close(interpret(graph, rand((3,))), rand((3,)) + np.arange(3))


def test_effects_keep_the_node() -> None:
    graph = trace(lambda x: (jax.debug.callback(lambda v: None, x), x * 2)[1], rand((2,)))
    (node,) = [n for n in graph.nodes if n.cmd.name == "effectful_primitive"]
    assert node.cmd.definition.attributes.has_effects
    assert not ops.lookup("primitive").attributes.has_effects


def test_opaque_hash_and_equality() -> None:
    a = Opaque({"table": np.arange(3), "axis": 0})
    b = Opaque({"table": np.arange(3), "axis": 0})
    c = Opaque({"table": np.arange(4), "axis": 0})
    assert a == b and hash(a) == hash(b) and a != c
    jaxpr = jax.make_jaxpr(jnp.sin)(1.0)
    assert Opaque({"j": jaxpr}) == Opaque({"j": jaxpr})
    cmd = primitive_command(lax.erf_p, {}, [((2,), jnp.float32)])
    assert cmd == primitive_command(lax.erf_p, {}, [((2,), np.float32)])
    assert hash(trace(lax.erf, rand((2,)))) == hash(trace(lax.erf, rand((2,))))


@pytest.mark.parametrize("update", ["constant", "input"])
def test_generic_backward_differentiates_only_the_wanted_inputs(update) -> None:
    # JAX has no derivative of scatter_mul w.r.t. its updates for repeated indices: the
    # gradient node wants X alone, so the updates must not be differentiated
    X, i = rand((4, 3)), np.array([1, 1, 3], np.int32)
    c = np.full((3, 3), 3.0, np.float32)

    def f(X, i, c):
        return jnp.sum(X.at[i].multiply(c if update == "input" else 3.0) * X)

    graph = trace(f, X, i, c)
    (node,) = [n for n in graph.nodes if n.cmd.name == "primitive"]
    assert str(node.cmd.param("prim")) == "scatter-mul"
    with_grad, _ = backward(graph, graph.outputs[0], [graph.inputs[0]])
    assert_close(interpret(with_grad, X, i, c)[1], jax.grad(f)(X, i, c))


@jax.custom_jvp
def relu(x):  # a user's straight-through ReLU: JAX's name, forward max(x, 0), slope 1
    return jnp.maximum(x, 0.0)


relu.defjvp(lambda p, t: (relu(p[0]), t[0]))


@jax.custom_jvp
def logaddexp(a, b):  # a user's function named like jnp.logaddexp: a hard max
    return jnp.maximum(a, b)


logaddexp.defjvp(lambda p, t: (logaddexp(*p), jnp.where(p[0] > p[1], t[0], t[1])))


@pytest.mark.parametrize("fn", [relu, lambda x: logaddexp(x, 0.0)], ids=["relu", "logaddexp"])
def test_user_custom_jvp_named_like_jax_keeps_its_own_derivative(fn) -> None:
    # only JAX's own relu / logaddexp map to relu / softplus; the name alone must not
    x = np.array([-2.0, -0.5, 0.5, 2.0], np.float32)
    w = np.arange(1.0, 5.0, dtype=np.float32)

    def f(x):
        return jnp.sum(fn(x) * w)

    graph = trace(f, x)
    assert not {"relu", "softplus"} & {n.cmd.name for n in graph.nodes}
    assert_close(interpret(graph, x), f(x))
    with_grad, _ = backward(graph, graph.outputs[0], [graph.inputs[0]])
    assert_close(interpret(with_grad, x)[1], jax.grad(f)(x))


def test_jax_relu_and_softplus_still_map_to_commands() -> None:
    graph = trace(lambda x: jax.nn.relu(x) + jax.nn.softplus(x), rand((4,)))
    assert {"relu", "softplus"} <= {n.cmd.name for n in graph.nodes}
