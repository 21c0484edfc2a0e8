"""Audit of control flow (session 20): the backward pass through bounded loops and
case_of follows the body commands' own backward rules; higher orders are refused by
name; oracles are jax.grad of plain JAX programs in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, case_of, compile, interpret, while_loop
from fnnc.graph.passes.backward import backward

F32 = np.float32


@ops.defcommand(
    family="elementwise",
    shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
    elementwise=True,
    name="audit8_ctrl8_ste_round",
    replace=True,
)
def ste_round(x):
    """Rounds; its hand-written backward passes the gradient straight through."""
    return jnp.round(x)


@ste_round.backward
def _ste_round_backward(grads, inputs, outputs):
    return (grads[0],)


@jax.custom_vjp
def _ste(x):
    return jnp.round(x)


_ste.defvjp(lambda x: (jnp.round(x), None), lambda _, g: (g,))


def _count_below(n):
    c = GraphBuilder()
    count = c.input((), np.int32, name="count")
    return c.build([c.exec(ops.compare(op="lt"), count, c.constant(np.int32(n)))])


Z, X = F32([1.3, 2.2]), F32([1.5, 0.7])


def _oracle(trips):
    """Gradients of sum(z_n), z_{k+1} = ste(z_k * x), by jax.grad in float64."""

    def f(z, x):
        return jnp.sum(jax.lax.fori_loop(0, trips, lambda _, z: _ste(z * x), z))

    with jax.enable_x64(True):
        return [np.asarray(g) for g in jax.grad(f, (0, 1))(np.float64(Z), np.float64(X))]


@pytest.mark.parametrize("mode", [{"max_iterations": 3}, {"tape": 4}])
def test_backward_pass_through_a_loop_uses_the_body_commands_backward(mode):
    """A bounded loop's gradient ran jax.vjp of the body's JAX code: a straight-through
    round got a zero gradient, where the taped loop and the unrolled graph pass it on."""
    bb = GraphBuilder()
    z0, x0 = bb.input((2,), name="z0"), bb.input((2,), name="x")
    z1 = bb.exec(ste_round(), bb.exec(ops.ewprod(), z0, x0), name="z1")
    body = bb.build([z1])
    b = GraphBuilder()
    z, x = b.input((2,), name="z"), b.input((2,), name="x")
    (out,) = while_loop(b, body, _count_below(2), [z, x], carry_overs={z1: z0}, **mode)
    loss = b.exec(ops.reduce_sum(axes=(0,)), out)
    grads, _ = backward(b.build([loss]), loss, [z, x])
    want = _oracle(2)
    for run in (compile(grads), lambda *a: interpret(grads, *a)):
        _, dz, dx = run(Z, X)
        np.testing.assert_allclose(dz, want[0], rtol=1e-6)
        np.testing.assert_allclose(dx, want[1], rtol=1e-6)


def test_backward_pass_through_case_of_uses_the_branch_commands_backward():
    s = GraphBuilder()
    s.input((2,), name="z"), s.input((2,), name="x")
    selector = s.build([s.constant(np.int32(0))])
    g = GraphBuilder()
    a, c = g.input((2,), name="z"), g.input((2,), name="x")
    branch = g.build([g.exec(ste_round(), g.exec(ops.ewprod(), a, c))])
    b = GraphBuilder()
    z, x = b.input((2,), name="z"), b.input((2,), name="x")
    (y,) = case_of(b, selector, [branch], [z, x], bypass=[z])
    loss = b.exec(ops.reduce_sum(axes=(0,)), y)
    grads, _ = backward(b.build([loss]), loss, [z, x])
    want = _oracle(1)
    for run in (compile(grads), lambda *a: interpret(grads, *a)):
        _, dz, dx = run(Z, X)
        np.testing.assert_allclose(dz, want[0], rtol=1e-6)
        np.testing.assert_allclose(dx, want[1], rtol=1e-6)
