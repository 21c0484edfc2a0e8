"""Audit of control flow (session 23): loops, branches and calls run their bodies' effects
once per trip, forward and backward together, as jax.grad of the same JAX program does;
oracles are jax.grad in float64 and its callback count."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import GraphError
from fnnc.graph import (
    GraphBuilder,
    backward,
    case_of,
    compile,
    interpret,
    scan,
    trace,
    while_loop,
)

F32 = np.float32
CALLS: list[int] = []
X, W = F32([0.1, 0.2]), F32([0.5, 0.7])


def _noisy(h, w):
    jax.debug.callback(lambda v: CALLS.append(1), h)
    return jnp.tanh(h * w)


@pytest.fixture(scope="module")
def noisy_body():
    return trace(_noisy, jnp.ones(2), jnp.ones(2))


def _count_below(n):
    c = GraphBuilder()
    count = c.input((), np.int32, name="count")
    return c.build([c.exec(ops.compare(op="lt"), count, c.constant(np.int32(n)))])


def _wrapped(kind, body):
    """sum(out) for out = the body (h, w) -> tanh(h * w) run 3 times by a loop, or once
    by a case_of branch or a call; with its gradients with respect to h and w."""
    b = GraphBuilder()
    x, w = b.input((2,), name="x"), b.input((2,), name="w")
    h0, h1 = (body.symbols[body.inputs[0]], body.symbols[body.outputs[0]])
    if kind == "case_of":
        s = GraphBuilder()
        s.input((2,)), s.input((2,))
        selector = s.build([s.constant(np.int32(0))])
        (out,) = case_of(b, selector, [body], [x, w], bypass=[x], name="C")
    elif kind == "call":
        out = b.exec(ops.call(graph=body), x, w, name="C")
    else:
        mode = {kind: 5}
        (out,) = while_loop(b, body, _count_below(3), [x, w], carry_overs={h1: h0}, **mode)
    loss = b.exec(ops.reduce_sum(axes=(0,)), out)
    return backward(b.build([loss]), loss, [x, w])[0]


def _oracle(trips):
    """(loss, d/dx, d/dw) by jax.grad in float64, and the callbacks that call made."""

    def f(x, w):
        return jnp.sum(jax.lax.fori_loop(0, trips, lambda _, h: _noisy(h, w), x))

    with jax.enable_x64(True):
        CALLS.clear()
        value, grads = jax.jit(jax.value_and_grad(f, (0, 1)))(np.float64(X), np.float64(W))
        jax.effects_barrier()
        return [value, *grads], len(CALLS)


@pytest.mark.parametrize("kind", ["max_iterations", "tape", "case_of", "call"])
def test_a_body_effect_runs_once_per_trip_with_its_gradient(kind, noisy_body):
    """The backward of a loop, a case_of and a call recomputed the body's forward with
    its debug callback: 6 calls for a 3-trip bounded loop, 9 taped, 2 for one branch."""
    graph = _wrapped(kind, noisy_body)
    want, calls = _oracle(1 if kind in ("case_of", "call") else 3)
    CALLS.clear()
    got = compile(graph)(X, W)
    jax.effects_barrier()
    assert len(CALLS) == calls
    for g, v in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(v), rtol=1e-6)


def _bypass_only(bypass):
    """A case_of whose selector always bypasses, over inputs (x, y), as a graph."""
    s = GraphBuilder()
    s.input((2,)), s.input((2,))
    selector = s.build([s.constant(np.int32(-1))])
    g = GraphBuilder()
    a, _ = g.input((2,)), g.input((2,))
    branch = g.build([g.exec(ops.relu(), a)])
    b = GraphBuilder()
    x, y = b.input((2,), name="x"), b.input((2,), name="y")
    (out,) = case_of(b, selector, [branch], [x, y], bypass=bypass, name="C")
    return b.build([out])


@pytest.mark.parametrize("position", [np.int64(1), np.int32(1), 1])
def test_case_of_bypass_takes_numpy_int_positions(position):
    """A NumPy int position was searched among the input symbols and refused as 'not one
    of the node's inputs'; it is the position, as a Python int (oracle: input 1, y)."""
    graph = _bypass_only([position])
    got = interpret(graph, F32([1, 2]), F32([3, 4]))
    np.testing.assert_array_equal(np.asarray(got), F32([3, 4]))


@pytest.mark.parametrize("flag", [True, np.True_])
def test_case_of_bypass_refuses_a_bool(flag):
    """bypass=[True] was taken silently as position 1 (a bool is an int to Python)."""
    with pytest.raises(
        GraphError, match=r"bypass output 0 is (np.)?True_?; pass one of .*node 'C'"
    ):
        _bypass_only([flag])


def test_a_scan_before_a_taped_loops_breakpoint_differentiates():
    """A scan computed before the breakpoint of a taped loop failed its backward with
    'a tape output has a gradient': the head handed every root it wrote to the next
    trip, the scan's tape among them, so the replay gave that tape a zero gradient.
    Oracle: jax.grad in float64 of the same loop in Python."""
    sb = GraphBuilder()
    sh, sw = sb.input((2,), name="sh"), sb.input((2,), name="sw")
    block = sb.build([sb.exec(ops.tanh(), sb.exec(ops.ewprod(), sh, sw))])
    bb = GraphBuilder()
    h0, ws0 = bb.input((2,), name="h0"), bb.input((2, 2), name="ws")
    (h1,) = scan(bb, block, [h0], [ws0], name="S")
    s1 = bb.exec(ops.reduce_sum(axes=(0,)), h1, name="s1")
    body = bb.build([h1, s1])
    c = GraphBuilder()
    c.input((), np.int32, name="count")
    total = c.exec(ops.reshape(shape=()), c.input((1,), name="s"))
    cond = c.build([c.exec(ops.compare(op="gt"), total, c.constant(F32(0.5)))])
    b = GraphBuilder()
    x, ws = b.input((2,), name="x"), b.input((2, 2), name="ws")
    mode = dict(cond_inputs=[s1], breakpoint="after", tape=4, name="L")
    (out,) = while_loop(b, body, cond, [x, ws], carry_overs={h1: h0}, **mode)
    loss = b.exec(ops.reduce_sum(axes=(0,)), b.exec(ops.ewprod(), out, out))
    graph = backward(b.build([loss]), loss, [x, ws])[0]
    xv, wv = F32([0.9, 0.8]), F32([[0.9, 0.8], [0.7, 0.6]])  # 2 trips

    def f(h, w):  # the loop stops after 2 trips (sums 0.76, then 0.41)
        for _ in range(2):
            h = jnp.tanh(jnp.tanh(h * w[0]) * w[1])
        return jnp.sum(h * h)

    with jax.enable_x64(True):
        value, grads = jax.jit(jax.value_and_grad(f, (0, 1)))(np.float64(xv), np.float64(wv))
        want = [value, *grads]
    for got, value in zip(compile(graph)(xv, wv), want):
        np.testing.assert_allclose(np.asarray(got), np.asarray(value).reshape(got.shape), rtol=1e-5)
