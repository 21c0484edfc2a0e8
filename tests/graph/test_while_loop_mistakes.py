"""while_loop mistakes and limits get fnnc errors that say what to do: a body that is
no graph, carry-overs that are not pairs, a trip bound that is no int, a tape too short
(without XLA's callback traceback) and forward mode through a taped loop."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError, GraphError
from fnnc.graph import GraphBuilder, backward, interpret, while_loop


def _body():
    bb = GraphBuilder()
    z0, x = bb.input((2,), name="z0"), bb.input((2,), name="x")
    z1 = bb.exec(ops.ewprod(), z0, x, name="z1")
    return bb.build([z1]), z0, z1


def _cond(n=None):
    """``count < n`` (a cond input) or ``count < 3``."""
    cb = GraphBuilder()
    c = cb.input((), np.int32, name="count")
    bound = cb.input((), np.int32, name="n") if n else cb.constant(np.int32(3))
    return cb.build([cb.exec(ops.compare(op="lt"), c, bound)])


def test_a_body_that_is_no_graph_says_so():
    b = GraphBuilder()
    z, x = b.input((2,)), b.input((2,))
    _, z0, z1 = _body()
    with pytest.raises(CommandError, match=r"while_loop: body must be a Graph.*got function"):
        while_loop(b, lambda z: z, _cond(), [z, x], carry_overs={z1: z0})


def test_carry_overs_must_be_pairs():
    b = GraphBuilder()
    z, x = b.input((2,)), b.input((2,))
    body, z0, z1 = _body()
    with pytest.raises(GraphError, match=r"carry_overs must map .* or be \(y, x\) pairs"):
        while_loop(b, body, _cond(), [z, x], carry_overs=[z1, z0])


@pytest.mark.parametrize("bound", [5.5, "5", True])
def test_max_iterations_must_be_an_int(bound):
    b = GraphBuilder()
    z, x = b.input((2,)), b.input((2,))
    body, z0, z1 = _body()
    with pytest.raises(CommandError, match="max_iterations must be None or an int >= 0"):
        while_loop(b, body, _cond(), [z, x], carry_overs={z1: z0}, max_iterations=bound)


def test_a_numpy_int_bound_is_an_int():
    b = GraphBuilder()
    z, x = b.input((2,)), b.input((2,))
    body, z0, z1 = _body()
    (o,) = while_loop(b, body, _cond(), [z, x], carry_overs={z1: z0}, max_iterations=np.int64(5))
    got = interpret(b.build([o]), np.ones(2, np.float32), np.full(2, 2.0, np.float32))
    np.testing.assert_array_equal(got, [8.0, 8.0])  # 1 * 2**3


def _loop(**bound):
    """``sum(z_n^2)``, ``z <- z * x`` run ``n`` times (``n`` a graph input)."""
    body, z0, z1 = _body()
    bb_n = GraphBuilder.from_graph(body)
    n_in = bb_n.input((), np.int32, name="n")
    body = bb_n.build([body.symbols[body.outputs[0]]])
    b = GraphBuilder()
    z, x, n = b.input((2,), name="z"), b.input((2,), name="x"), b.input((), np.int32, name="n")
    (o,) = while_loop(
        b, body, _cond(n=True), [z, x, n], carry_overs={z1: z0}, cond_inputs=[n_in], **bound
    )
    loss = b.exec(
        ops.reshape(shape=()), b.exec(ops.reduce_sum(axes=(0,)), b.exec(ops.ewprod(), o, o))
    )
    return b.build([loss]), loss


Z, X = np.array([0.3, -0.4], np.float32), np.array([0.9, 1.1], np.float32)


def test_a_tape_too_short_names_the_loop_without_xlas_traceback(caplog):
    graph, loss = _loop(tape=2)
    grads = backward(graph, loss, [graph.inputs[0]])[0]
    with caplog.at_level(logging.ERROR), pytest.raises(GraphError) as info:
        interpret(grads, Z, X, np.int32(5))
    text = str(info.value)
    assert "the loop ran 5 iterations, but its tape holds 2" in text
    assert "tape=8 or more" in text
    assert "Traceback" not in text and "Callback" not in text, text
    assert not [r for r in caplog.records if r.name.startswith("jax")], caplog.text


def test_second_order_through_a_taped_loop_says_to_bound_it():
    def plain(z):
        for _ in range(3):
            z = z * X
        return jnp.sum(z * z)

    taped, _ = _loop(tape=4)
    with pytest.raises(GraphError, match=r"reverse-mode gradients only.*max_iterations=N"):
        jax.hessian(lambda z: interpret(taped, z, X, np.int32(3)))(Z)
    bounded, _ = _loop(max_iterations=4)
    got = jax.hessian(lambda z: interpret(bounded, z, X, np.int32(3)))(Z)
    np.testing.assert_allclose(got, jax.hessian(plain)(Z), rtol=1e-5)


def _backward_twice(graph, loss):
    """The graph of d/dz sum(d loss/dz): the second order of fnnc's backward pass."""
    g1, (dz,) = backward(graph, loss, [graph.inputs[0]])
    b2 = GraphBuilder.from_graph(g1)
    s = b2.exec(ops.reshape(shape=()), b2.exec(ops.reduce_sum(axes=(0,)), dz))
    return b2, s


def _plain_hvp(z):
    """d/dz sum(d/dz sum((z x^3)^2)) = 2 x^6 elementwise (the oracle)."""
    return 2 * X.astype(np.float64) ** 6 * np.ones_like(z)


def test_backward_twice_through_a_taped_loop_is_refused_at_backward():
    b2, s = _backward_twice(*_loop(tape=4))
    with pytest.raises(
        CommandError, match=r"loop with a tape has first-order gradients only.*max_iterations=N"
    ):
        backward(b2.build([s]), s, [b2.build([s]).inputs[0]])
    b2, s = _backward_twice(*_loop(max_iterations=4))
    g2 = b2.build([s])
    g2, (ddz,) = backward(g2, s, [g2.inputs[0]])
    got = interpret(GraphBuilder.from_graph(g2).build([ddz]), Z, X, np.int32(3))
    np.testing.assert_allclose(got, _plain_hvp(Z), rtol=1e-5)


@pytest.mark.parametrize(("bound", "ok"), [({"tape": 4}, False), ({"max_iterations": 4}, True)])
def test_dynamic_backward_twice_through_a_taped_loop_says_to_bound_it(bound, ok):
    from fnnc.graph import DynamicGraph

    graph, _ = _loop(**bound)
    dg = DynamicGraph()
    z = dg.variable(Z, name="z")
    loss = dg.evaluate(graph, [z, dg.constant(X), dg.constant(np.int32(3))])
    (g,) = dg.backward(loss, [z], create_graph=True)
    np.testing.assert_allclose(g.numpy(), 2 * Z * X**6, rtol=1e-5)
    if not ok:
        with pytest.raises(CommandError, match=r"node .*tape=4.*first-order gradients only"):
            dg.backward(g.sum(keepdims=False), [z])
        return
    (h,) = dg.backward(g.sum(keepdims=False), [z])
    np.testing.assert_allclose(h.numpy(), _plain_hvp(Z), rtol=1e-5)
