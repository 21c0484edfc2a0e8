"""Audit of control flow (session 20): the backward pass through bounded loops and
case_of follows the body commands' own backward rules; higher orders are refused by
name; oracles are jax.grad of plain JAX programs in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.core import command as command_module
from fnnc.errors import CommandError
from fnnc.graph import GraphBuilder, case_of, compile, interpret, while_loop
from fnnc.graph.passes.backward import backward

F32 = np.float32


@pytest.fixture(scope="module")
def ste_round():
    """A straight-through round, registered for this module only (the registry is global)."""

    @ops.defcommand(
        family="elementwise",
        shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
        elementwise=True,
        name="audit8_ctrl8_ste_round",
    )
    def _ste_round(x):
        """Rounds; its hand-written backward passes the gradient straight through."""
        return jnp.round(x)

    @_ste_round.backward
    def _ste_round_backward(grads, inputs, outputs):
        return (grads[0],)

    yield _ste_round
    command_module._REGISTRY.pop("audit8_ctrl8_ste_round")


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
def test_backward_pass_through_a_loop_uses_the_body_commands_backward(mode, ste_round):
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


def test_backward_pass_through_case_of_uses_the_branch_commands_backward(ste_round):
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


def _inner(mode):
    """A graph (h, w) -> h * w**2 by a loop built with ``mode``."""
    ib = GraphBuilder()
    h0, w0 = ib.input((2,), name="h0"), ib.input((2,), name="w")
    h1 = ib.exec(ops.ewprod(), h0, w0, name="h1")
    ob = GraphBuilder()
    h, w = ob.input((2,), name="H0"), ob.input((2,), name="W")
    args = dict(carry_overs={h1: h0}, name="inner", **mode)
    (out,) = while_loop(ob, ib.build([h1]), _count_below(2), [h, w], **args)
    return ob.build([out]), h, out


def _second_order(outer):
    """The graph of d/dz sum(d sum(y * y)/dz), y = outer(inner)(z, w)."""
    b = GraphBuilder()
    z, w = b.input((2,), name="z"), b.input((2,), name="w")
    (y,) = outer(b, z, w)
    loss = b.exec(
        ops.reshape(shape=()), b.exec(ops.reduce_sum(axes=(0,)), b.exec(ops.ewprod(), y, y))
    )
    g1, (dz,) = backward(b.build([loss]), loss, [z])
    b2 = GraphBuilder.from_graph(g1)
    s = b2.exec(ops.reshape(shape=()), b2.exec(ops.reduce_sum(axes=(0,)), dz))
    g2 = b2.build([s])
    return g2, s


def _in_loop(mode):
    def outer(b, z, w):
        body, h, out = _inner(mode)
        return while_loop(b, body, _count_below(2), [z, w], carry_overs={out: h}, max_iterations=3)

    return outer


def _in_case(mode):
    def outer(b, z, w):
        s = GraphBuilder()
        s.input((2,)), s.input((2,))
        return case_of(b, s.build([s.constant(np.int32(0))]), [_inner(mode)[0]], [z, w], bypass=[z])

    return outer


@pytest.mark.parametrize("where", [_in_loop, _in_case], ids=["bounded loop", "case_of"])
def test_second_order_through_a_taped_loop_inside_is_refused_by_the_pass(where):
    """Was: the pass built the graph and running it raised JAX's bare 'Reverse-mode
    differentiation does not work for lax.while_loop'."""
    g2, s = _second_order(where({"tape": 4}))
    with pytest.raises(CommandError, match=r"node inner .*tape=4.*first-order gradients only"):
        backward(g2, s, [g2.inputs[0]])


@pytest.mark.parametrize("where", [_in_loop, _in_case], ids=["bounded loop", "case_of"])
def test_second_order_through_a_bounded_loop_inside_matches_jax(where):
    g2, s = _second_order(where({"max_iterations": 3}))
    g3, (ddz,) = backward(g2, s, [g2.inputs[0]])
    z, w = F32([1.1, 0.9]), F32([1.2, 0.8])
    got = interpret(GraphBuilder.from_graph(g3).build([ddz]), z, w)
    trips = 2 if where is _in_loop else 1  # the outer loop runs the inner one twice

    def f(z, w):
        y = jax.lax.fori_loop(0, 2 * trips, lambda _, h: h * w, z)
        return jnp.sum(y * y)

    with jax.enable_x64(True):
        want = jax.grad(lambda z: jnp.sum(jax.grad(f)(z, np.float64(w))))(np.float64(z))
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("mode", [{"max_iterations": 300}, {"tape": 300}])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_a_16_bit_loop_invariant_gradient_is_summed_in_float32(mode, dtype):
    """h <- h + 0.01 w for 300 trips: dsum(h)/dw = 300 * 0.01. Summed in bfloat16 trip
    by trip it was 3.22 (7% off); scan already sums in float32."""
    bb = GraphBuilder()
    h0, w0 = bb.input((4,), dtype, name="h0"), bb.input((4,), dtype, name="w")
    h1 = bb.exec(ops.ewsum(), h0, bb.exec(ops.scalar_mul(a=0.01), w0), name="h1")
    b = GraphBuilder()
    h, w = b.input((4,), dtype, name="h"), b.input((4,), dtype, name="w")
    (out,) = while_loop(b, bb.build([h1]), _count_below(300), [h, w], carry_overs={h1: h0}, **mode)
    loss = b.exec(ops.reduce_sum(axes=(0,)), out)
    grads, _ = backward(b.build([loss]), loss, [w])
    _, dw = compile(grads)(np.zeros(4, dtype), np.ones(4, dtype))
    assert dw.dtype == dtype
    want = 300 * float(np.asarray(0.01, dtype))  # each trip's term, rounded once at the end
    np.testing.assert_allclose(np.asarray(dw, np.float64), want, rtol=4e-3)


def test_taped_while_sums_16_bit_invariant_gradients_in_float32():
    from fnnc.ops.while_tape import taped_while

    def f(w):
        grow = lambda w, c: (c[0] + 1, c[1] + w * jnp.asarray(0.01, w.dtype))
        init = (jnp.int32(0), jnp.zeros(4, w.dtype))
        return jnp.sum(taped_while(lambda w, c: c[0] < 300, grow, w, init, capacity=300)[1])

    dw = jax.grad(f)(jnp.ones(4, jnp.bfloat16))
    np.testing.assert_allclose(np.asarray(dw, np.float64), 300 * 0.01, rtol=4e-3)


def _two_node_loop(where):
    """z1 = z0 * x (node 0), w1 = w0 + z1 (node 1); count < 2; breakpoint ``where``."""
    bb = GraphBuilder()
    z0, w0, x = bb.input((), name="z0"), bb.input((), name="w0"), bb.input((), name="x")
    z1 = bb.exec(ops.ewprod(), z0, x, name="z1")
    w1 = bb.exec(ops.ewsum(), w0, z1, name="w1")
    b = GraphBuilder()
    z, w, xo = b.input((), name="z"), b.input((), name="w"), b.input((), name="x")
    args = dict(carry_overs={z1: z0, w1: w0}, breakpoint=where)
    outs = while_loop(b, bb.build([z1, w1]), _count_below(2), [z, w, xo], **args)
    return b.build(list(outs))


def test_breakpoint_true_is_refused_and_a_numpy_int_is_a_node_count():
    """breakpoint=True was taken as node count 1; np.int64(1) was refused."""
    with pytest.raises(CommandError, match="breakpoint must be"):
        _two_node_loop(True)
    z, w = interpret(_two_node_loop(np.int64(1)), F32(1), F32(0), F32(2))
    # after node 0: z is updated 3 times (the last pass stops at the breakpoint), w twice
    assert (float(z), float(w)) == (8.0, 2.0 + 4.0)


def test_mistakes_found_before_the_node_exists_name_it():
    """The graph-level helpers' own checks did not say which loop, branch or scan."""
    from fnnc.errors import GraphError
    from fnnc.graph import scan

    bb = GraphBuilder()
    z0, x0 = bb.input((2,), name="z0"), bb.input((2,), name="x")
    z1 = bb.exec(ops.ewprod(), z0, x0, name="z1")
    body = bb.build([z1])
    b = GraphBuilder()
    z, x = b.input((2,), name="z"), b.input((2,), name="x")
    with pytest.raises(GraphError, match=r"source %0 \(z0\) is not a body output.*node 'loop 3'"):
        while_loop(b, body, _count_below(2), [z, x], carry_overs={z0: z1}, name="loop 3")
    with pytest.raises(CommandError, match=r"breakpoint must be.*node 'loop 3'"):
        while_loop(
            b, body, _count_below(2), [z, x], carry_overs={z1: z0}, breakpoint=7, name="loop 3"
        )
    with pytest.raises(GraphError, match=r"not one of the node's inputs.*node 'pick'"):
        case_of(b, body, [body], [z, x], bypass=[b.input((2,))], name="pick")
    ib = GraphBuilder()
    h, w = ib.input((2,), np.int32, name="h"), ib.input((2,), np.int32, name="w")
    blocks = ib.build([ib.exec(ops.ewsum(), h, w)])
    hs, ws = b.input((2,), np.int32), b.input((3, 2), np.int32)
    with pytest.raises(GraphError, match=r"carry 0 .* is int32.*node 'blocks'"):
        scan(b, blocks, [hs], [ws], name="blocks")
