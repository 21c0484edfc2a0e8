"""Gradients through an unbounded while_loop with a tape (``tape=K``).

Oracles: ``jax.grad`` of the loop unrolled in Python for the trip count it takes, central
finite differences of a NumPy float64 loop, and the ``max_iterations`` (scan) lowering.
Inputs sit away from the points where a condition changes its answer, so finite
difference steps never change the trip count.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.core.command import Spec
from fnnc.errors import CommandError, GraphError
from fnnc.graph import DynamicGraph, GraphBuilder, compile, interpret, load, save
from fnnc.graph.passes.backward import backward
from fnnc.ops.while_tape import taped_while

F32 = np.float32
X0 = F32([0.3, 0.5, 0.4])
W = F32([1.5, 1.4, 1.6])
C = F32([1.0, -2.0, 3.0])
TAPE = 8


# --- the loop: x *= w while sum(x) < t ---------------------------------------------


def _grow_loop(**reverse):
    """``while_loop`` command: body x1 = x0 * w, condition sum(x0) < t (t from data)."""
    b = GraphBuilder()
    x0, w, _ = b.input((3,), name="x0"), b.input((3,), name="w"), b.input((), name="t")
    body = b.build([b.exec(ops.ewprod(), x0, w, name="x1")])
    c = GraphBuilder()
    c.input((), np.int32, name="count")
    x, t = c.input((3,), name="x"), c.input((), name="t")
    total = c.exec(ops.reshape(shape=()), c.exec(ops.reduce_sum(axes=(0,)), x))
    cond = c.build([c.exec(ops.compare(op="lt"), total, t)])
    return ops.while_loop(
        body=body, cond=cond, carry_overs=((0, 0),), cond_inputs=(("in", 0), ("in", 2)), **reverse
    )


def _grow_graph(**reverse):
    """loss = sum(c * loop(x, w, t)) and its gradients with respect to x and w."""
    b = GraphBuilder()
    x, w, t = b.input((3,), name="x"), b.input((3,), name="w"), b.input((), name="t")
    xf = b.exec(_grow_loop(**reverse), x, w, t, name="grow")
    weighted = b.exec(ops.ewprod(), xf, b.constant(C))
    loss = b.exec(ops.reshape(shape=()), b.exec(ops.reduce_sum(axes=(0,)), weighted))
    graph, _ = backward(b.build([loss]), loss, [x, w])
    return graph


def _trips(x, w, t):
    n = 0
    while x.sum() < t:
        x, n = x * w, n + 1
    return n


def _threshold(trips):
    """A t half-way between the sums after ``trips - 1`` and ``trips`` steps."""
    sums = [float((X0.astype(np.float64) * W**k).sum()) for k in range(trips + 1)]
    return F32(sums[0] - 0.5) if trips == 0 else F32((sums[trips - 1] + sums[trips]) / 2)


def _unrolled_grad(trips):
    """jax.grad of the loop written out for ``trips`` steps (the Python reference)."""

    def loss(x, w):
        for _ in range(trips):
            x = x * w
        return jnp.sum(C * x)

    return jax.grad(loss, argnums=(0, 1))(X0, W)


def _finite_differences(t, eps=1e-6):
    """Central differences of the NumPy float64 loop, in x then w."""

    def loss(x, w):
        while x.sum() < t:
            x = x * w
        return float((C * x).sum())

    x, w = X0.astype(np.float64), W.astype(np.float64)
    grads = []
    for which in (0, 1):
        g = np.zeros(3)
        for i in range(3):
            e = np.zeros(3)
            e[i] = eps
            args_p = [x + e, w] if which == 0 else [x, w + e]
            args_m = [x - e, w] if which == 0 else [x, w - e]
            g[i] = (loss(*args_p) - loss(*args_m)) / (2 * eps)
        grads.append(g)
    return grads


@pytest.fixture(scope="module")
def taped():
    graph = _grow_graph(tape=TAPE)
    return graph, compile(graph)


@pytest.mark.parametrize("trips", [0, 1, 5])
def test_gradients_match_unrolled_reference_and_float64_differences(taped, trips):
    graph, program = taped
    t = _threshold(trips)
    assert _trips(X0.astype(np.float64), W.astype(np.float64), float(t)) == trips
    want = _unrolled_grad(trips)
    fd = _finite_differences(float(t))
    for run in (lambda *a: interpret(graph, *a), program):
        loss, dx, dw = run(X0, W, t)
        np.testing.assert_allclose(float(loss), float(np.sum(C * X0 * W**trips)), rtol=1e-5)
        for got, ref, diff in zip((dx, dw), want, fd):
            np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5)
            np.testing.assert_allclose(np.asarray(got), diff, rtol=1e-4, atol=1e-6)


def test_tape_gradient_equals_the_max_iterations_form(taped):
    _, program = taped
    bounded = compile(_grow_graph(max_iterations=TAPE))
    t = _threshold(4)
    for got, want in zip(program(X0, W, t), bounded(X0, W, t)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


def test_more_trips_than_the_tape_holds_is_an_error_naming_loop_and_cap(taped):
    graph, program = taped
    t = _threshold(TAPE + 3)
    message = rf"the loop ran {TAPE + 3} iterations, but its tape holds {TAPE} .*tape=16"
    with pytest.raises(GraphError, match=r"node \d+ \(grow\.backward\)[\s\S]*" + message):
        interpret(graph, X0, W, t)
    with pytest.raises(CommandError, match=r"^Program: node \d+ \(grow\.backward\): .*" + message):
        program(X0, W, t)  # the program waits for a taped backward: raised here
    # The forward alone needs no tape: its value stays exact past the cap.
    loop = _grow_loop(tape=TAPE)
    np.testing.assert_allclose(np.asarray(loop(X0, W, t)), X0 * W ** (TAPE + 3), rtol=1e-5)


class _Pending:
    """An output whose runtime error shows only when it is waited for: how an
    asynchronous runtime (XLA:GPU) reports a failed host callback. XLA:CPU raises at
    the call instead, so the test below simulates the GPU's order on CPU."""

    def __init__(self, spec, error):
        self.shape, self.dtype, self._error = spec.shape, spec.dtype, error

    def block_until_ready(self):
        raise self._error


def test_an_overflow_reported_only_when_waited_for_still_names_the_node(taped, monkeypatch):
    import importlib

    from fnnc.core.command import output_specs
    from fnnc.core.dispatch import as_specs
    from fnnc.ops import while_tape

    interpret_module = importlib.import_module("fnnc.graph.interpret")  # not the function
    real = interpret_module.compiled_forward

    def deferred(cmd, backend):
        run = real(cmd, backend)
        if not while_tape.checks_on_host(cmd):
            return run

        def later(*inputs):
            try:
                return run(*inputs)
            except jax.errors.JaxRuntimeError as e:
                return tuple(_Pending(s, e) for s in output_specs(cmd, as_specs(inputs, "t")))

        return later

    monkeypatch.setattr(interpret_module, "compiled_forward", deferred)
    graph, _ = taped
    message = rf"the loop ran {TAPE + 3} iterations, but its tape holds {TAPE} .*tape=16"
    with pytest.raises(GraphError, match=r"node \d+ \(grow\.backward\)[\s\S]*" + message):
        interpret(graph, X0, W, _threshold(TAPE + 3))


class _Token:
    """A runtime token as JAX keeps one per device after a program with host callbacks
    on a GPU: waiting on it raises the callback's error, if any. XLA:CPU keeps none."""

    def __init__(self, error=None):
        self.error = error

    def block_until_ready(self):
        if self.error is not None:
            raise self.error


def test_a_reported_overflow_leaves_no_failed_token_behind(taped):
    """On the H100 the overflow error, reported once, stayed in JAX's runtime token:
    jax.effects_barrier() raised it again and every process printed it at exit."""
    from jax._src import dispatch as jax_dispatch

    graph, program = taped
    for run, caught in ((lambda t: program(X0, W, t), CommandError), (
        lambda t: interpret(graph, X0, W, t), GraphError
    )):  # fmt: skip
        held = jax_dispatch.runtime_tokens.output_runtime_tokens  # a barrier renews it
        failed = jax.errors.JaxRuntimeError("INTERNAL: CpuCallback error: CommandError: x")
        held.update({"failed": _Token(failed), "healthy": _Token()})
        try:
            with pytest.raises(caught, match="tape holds"):
                run(_threshold(TAPE + 3))
            assert "failed" not in held and "healthy" in held
            jax.effects_barrier()  # nothing stale left to raise
        finally:
            held.pop("failed", None)
            held.pop("healthy", None)


def test_overflow_poisons_gradients_and_the_backward_follows_the_trips():
    """taped_while directly: NaN gradients past the cap with on_overflow="nan"; within
    it, under vmap, each element replays its own trip count."""
    grow = lambda w, c: (c[0] + 1, c[1] * w)
    below = lambda w, c: c[1] < 10.0

    def f(w, on_overflow="raise"):
        carry = (jnp.int32(0), jnp.float32(1))
        return taped_while(below, grow, w, carry, capacity=4, on_overflow=on_overflow)[1]

    assert np.isnan(float(jax.grad(lambda w: f(w, "nan"))(F32(1.5))))  # 6 trips > 4
    ws = F32([3.0, 2.0, 11.0])  # 3, 4 and 1 trips: x = w**n, dx/dw = n w**(n-1)
    got = jax.jit(jax.vmap(jax.grad(f)))(ws)
    np.testing.assert_allclose(np.asarray(got), [27.0, 32.0, 1.0], rtol=1e-6)
    with pytest.raises(CommandError, match="capacity must be an int >= 1"):
        taped_while(below, grow, F32(2), (jnp.int32(0), F32(1)), capacity=0)


# --- breakpoints ---------------------------------------------------------------------


def _two_carry(where, **reverse):
    """z1 = z0 * x (node 0); w1 = w0 + z1 (node 1); while sum(z) < 5 read at ``where``."""
    b = GraphBuilder()
    z0, w0, x = b.input((2,), name="z0"), b.input((2,), name="w0"), b.input((2,), name="x")
    z1 = b.exec(ops.ewprod(), z0, x, name="z1")
    w1 = b.exec(ops.ewsum(), w0, z1, name="w1")
    body = b.build([z1, w1])
    c = GraphBuilder()
    c.input((), np.int32, name="count")
    z = c.input((2,), name="z")
    total = c.exec(ops.reshape(shape=()), c.exec(ops.reduce_sum(axes=(0,)), z))
    cond = c.build([c.exec(ops.compare(op="lt"), total, c.constant(F32(5)))])
    early = {"before": (), "mid": (0,), "after": (0, 1)}[where]
    read = ("in", 0) if where == "before" else ("out", 0)
    return ops.while_loop(
        body=body,
        cond=cond,
        carry_overs=((0, 0), (1, 1)),
        cond_inputs=(read,),
        breakpoint=early,
        **reverse,
    )


@pytest.mark.parametrize("where", ["before", "mid", "after"])
def test_breakpoints_keep_values_and_gradients(where):
    """The taped loop gives the bounded loop's values and gradients, and a reference
    written out in Python with NNC's breakpoint semantics."""
    z, w, x = F32([0.4, 0.3]), F32([0.1, 0.2]), F32([1.7, 1.5])
    seed = (F32([1.0, 2.0]), F32([-1.0, 0.5]))

    def run(cmd):
        out, pull = jax.vjp(lambda *a: cmd(*a), z, w, x)
        return out, pull(seed)

    def python(z, w, x):
        while True:
            z1 = z * x
            if where == "mid" and not jnp.sum(z1) < 5:
                return z1, w  # stopped at the breakpoint: z updated, w not
            if where == "before" and not jnp.sum(z) < 5:
                return z, w
            w1 = w + z1
            if where == "after" and not jnp.sum(z1) < 5:
                return z1, w1  # the whole body ran before the condition
            z, w = z1, w1

    taped, bounded = run(_two_carry(where, tape=8)), run(_two_carry(where, max_iterations=8))
    ref = jax.vjp(python, z, w, x)
    want = (ref[0], ref[1](seed))
    for got in (taped, bounded):
        for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-6)


# --- rules, listing ------------------------------------------------------------------


def test_tape_rules_listing_and_save_load(tmp_path):
    graph = _grow_graph(tape=8)
    save(graph, tmp_path / "loop.json")
    assert load(tmp_path / "loop.json") == graph
    assert "while_loop[1 nodes; carry x1->x0; break before; tape=8]" in str(_grow_loop(tape=8))
    specs = (Spec((3,), F32), Spec((3,), F32), Spec((), F32))
    with pytest.raises(CommandError, match="not both"):
        _grow_loop(tape=8, max_iterations=8).shape(*specs)
    with pytest.raises(CommandError, match="tape must be None or an int >= 1"):
        _grow_loop(tape=0).shape(*specs)


# --- the dynamic graph: a fixed-point layer run to convergence -----------------------


def _fixed_point_loop():
    """y1 = tanh(w * y0 + x) / 2 until sum |y1 - y0| < 1e-3 (breakpoint after the body)."""
    b = GraphBuilder()
    y0, w, x = b.input((3,), name="y0"), b.input((3,), name="w"), b.input((3,), name="x")
    v = b.exec(ops.ewsum(), b.exec(ops.ewprod(), w, y0), x)
    y1 = b.exec(ops.scalar_mul(a=0.5), b.exec(ops.tanh(), v), name="y1")
    body = b.build([y1])
    c = GraphBuilder()
    c.input((), np.int32, name="count")
    old, new = c.input((3,), name="y0"), c.input((3,), name="y1")
    step = c.exec(ops.ewabs(), c.exec(ops.add(p=1.0, q=-1.0), new, old))
    size = c.exec(ops.reshape(shape=()), c.exec(ops.reduce_sum(axes=(0,)), step))
    cond = c.build([c.exec(ops.compare(op="gt"), size, c.constant(F32(1e-3)))])
    return ops.while_loop(
        body=body,
        cond=cond,
        carry_overs=((0, 0),),
        cond_inputs=(("in", 0), ("out", 0)),
        breakpoint=(0,),
        tape=32,
    )


def test_dynamic_graph_trains_through_a_loop_run_to_convergence():
    x, target = F32([0.5, -0.3, 0.8]), F32([0.2, -0.1, 0.3])
    w0 = F32([0.9, 0.4, -0.6])

    def reference_loss(w):
        y, steps = np.zeros(3, np.float64), 0
        while True:  # the trip count, in float64 on the side
            y1, steps = np.tanh(w * y + x) / 2, steps + 1
            if np.abs(y1 - y).sum() <= 1e-3:
                break
            y = y1

        def loss(w):
            y = jnp.zeros(3, F32)
            for _ in range(steps):
                y = jnp.tanh(w * y + x) / 2
            return jnp.sum((y - target) ** 2)

        return steps, jax.grad(loss)(w)

    steps, want = reference_loss(w0)
    assert steps > 3
    dg = DynamicGraph()
    w = dg.variable(w0, name="w")
    y = dg.exec(_fixed_point_loop(), dg.constant(np.zeros(3, F32)), w, dg.constant(x))
    e = dg.exec(ops.add(p=1.0, q=-1.0), y, dg.constant(target))
    loss = dg.exec(ops.reshape(shape=()), dg.exec(ops.reduce_sum(axes=(0,)), e * e))
    (dw,) = dg.backward(loss, [w])
    np.testing.assert_allclose(dw.numpy(), np.asarray(want), rtol=1e-5, atol=1e-7)
    dg.apply_gradients(optax.sgd(0.5), [w])
    np.testing.assert_allclose(w.numpy(), w0 - 0.5 * np.asarray(want), rtol=1e-6)


def test_taped_loop_inside_a_taped_loop_body():
    """Outer: three times a <- inner(a, x) / 2; inner: a *= x while a < 2 (data trips)."""
    b = GraphBuilder()
    z0, x = b.input((), name="z0"), b.input((), name="x")
    inner_body = b.build([b.exec(ops.ewprod(), z0, x, name="z1")])
    c = GraphBuilder()
    c.input((), np.int32, name="count")
    z = c.input((), name="z")
    inner_cond = c.build([c.exec(ops.compare(op="lt"), z, c.constant(F32(2)))])
    inner = ops.while_loop(
        body=inner_body, cond=inner_cond, carry_overs=((0, 0),), cond_inputs=(("in", 0),), tape=8
    )
    b = GraphBuilder()
    a0, x = b.input((), name="a0"), b.input((), name="x")
    outer_body = b.build([b.exec(ops.scalar_mul(a=0.5), b.exec(inner, a0, x), name="a1")])
    c = GraphBuilder()
    count = c.input((), np.int32, name="count")
    outer_cond = c.build([c.exec(ops.compare(op="lt"), count, c.constant(np.int32(3)))])
    outer = ops.while_loop(body=outer_body, cond=outer_cond, carry_overs=((0, 0),), tape=4)

    def python(a, x):
        for _ in range(3):
            while a < 2:
                a = a * x
            a = a * 0.5
        return a

    args = (F32(0.7), F32(1.3))
    got = jax.grad(lambda a, x: outer(a, x), argnums=(0, 1))(*args)
    want = jax.grad(python, argnums=(0, 1))(*args)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5)


def test_the_graph_builder_takes_a_tape():
    """``fnnc.graph.while_loop(..., tape=K)`` builds the same taped loop as the command."""
    from fnnc.graph import while_loop

    bb = GraphBuilder()
    x0, w0, t0 = bb.input((3,), name="x0"), bb.input((3,), name="w"), bb.input((), name="t")
    x1 = bb.exec(ops.ewprod(), x0, w0, name="x1")
    body = bb.build([x1])
    c = GraphBuilder()
    c.input((), np.int32, name="count")
    xc, tc = c.input((3,), name="x"), c.input((), name="t")
    total = c.exec(ops.reshape(shape=()), c.exec(ops.reduce_sum(axes=(0,)), xc))
    cond = c.build([c.exec(ops.compare(op="lt"), total, tc)])
    b = GraphBuilder()
    x, w, t = b.input((3,), name="x"), b.input((3,), name="w"), b.input((), name="t")
    (xf,) = while_loop(
        b, body, cond, [x, w, t], carry_overs={x1: x0}, cond_inputs=[x0, t0], tape=TAPE
    )
    loss = b.exec(ops.reshape(shape=()), b.exec(ops.reduce_sum(axes=(0,)), xf))
    graph, _ = backward(b.build([loss]), loss, [x, w])
    assert "tape=8" in str(graph)
    trips = 3
    _, dx, dw = interpret(graph, X0, W, _threshold(trips))
    np.testing.assert_allclose(np.asarray(dx), W**trips, rtol=1e-5)  # d sum(x w^n)/dx
    np.testing.assert_allclose(np.asarray(dw), trips * X0 * W ** (trips - 1), rtol=1e-5)
