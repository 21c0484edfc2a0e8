"""Audit 12, issA: issues 2, 3, 4 and 26 used as their texts word them (see report)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fnnc import ops
from fnnc.graph import DynamicGraph, trace

F32 = np.float32


# -- issue 4: ``@`` has NumPy's matmul shapes -------------------------------------------


def test_matmul_of_a_vector_and_a_batch_has_numpys_shape_and_gradient() -> None:
    # gemm keeps a rank-1 a's row axis against a batch of matrices ([2, 1, 3])
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(4,)).astype(F32), rng.normal(size=(2, 4, 3)).astype(F32)
    dg = DynamicGraph()
    x, y = dg.variable(a), dg.variable(b)
    z = x @ y
    np.testing.assert_allclose(np.asarray(z.value), np.matmul(a, b), rtol=1e-5, atol=1e-6)
    gx, gy = dg.backward((z * z).sum(), [x, y])
    want = jax.grad(lambda p, q: jnp.sum(jnp.matmul(p, q) ** 2), argnums=(0, 1))(a, b)
    np.testing.assert_allclose(np.asarray(gx.value), want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gy.value), want[1], rtol=1e-4, atol=1e-5)


def test_lazy_matmul_of_an_array_vector_and_a_4d_batch_has_numpys_shape() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(4,)).astype(F32), rng.normal(size=(2, 1, 4, 3)).astype(F32)
    dg = DynamicGraph(lazy=True)
    z = a @ dg.variable(b)  # np.matmul calls the variable's __rmatmul__
    np.testing.assert_allclose(np.asarray(z.value), np.matmul(a, b), rtol=1e-5, atol=1e-6)


# -- issue 4: memoisation is for pure commands only ----------------------------------------


def test_memo_reruns_an_evaluated_graph_that_holds_an_effect() -> None:
    # the command is pure by its own attributes; the debug callback inside is not
    seen: list[float] = []

    def f(x):
        jax.debug.callback(lambda v: seen.append(float(v[0])), x)
        return x * 2.0

    x = F32([1.0, 2.0])
    graph = trace(f, x)
    jitted = jax.jit(f)
    for _ in range(2):
        jitted(x)
    jax.effects_barrier()
    want, seen[:] = len(seen), []  # what JAX runs for two calls: 2
    dg = DynamicGraph()  # memoisation on, the default
    v = dg.variable(x)
    outs = [dg.evaluate(graph, [v]), dg.evaluate(graph, [v]), dg.exec(ops.call(graph=graph), v)]
    jax.effects_barrier()
    assert len(seen) == want + 1
    for out in outs:
        np.testing.assert_array_equal(np.asarray(out.value), np.asarray(jitted(x)))


# -- issue 26: the lazy flush's passes and the gradient agree ------------------------------


def test_lazy_passes_rewrite_the_forward_that_backward_differentiates() -> None:
    # relu -> leaky_relu at the flush: values were leaky, the gradient was relu's
    from fnnc.graph import Pat, Rule, rewrite_pass

    leaky = Rule(
        Pat.op("relu", Pat.var("x")),
        lambda m: m.exec(ops.leaky_relu(negative_slope=0.1), m["x"]),
    )
    xs = F32([[-1.0, 2.0, -0.5], [0.3, -2.0, 1.0]])
    ws = F32([[0.5, -1.0], [2.0, 0.1], [-0.3, 0.7]])

    def loss(x, w):
        h = x @ w
        return jnp.sum(jnp.where(h > 0, h, 0.1 * h) ** 2)

    want = jax.grad(loss, argnums=(0, 1))(xs, ws)
    dg = DynamicGraph(lazy=True, passes=[rewrite_pass(leaky, name="leaky")])
    x, w = dg.variable(xs), dg.variable(ws)
    h = dg.exec(ops.relu(), x @ w)
    s = (h * h).sum()
    np.testing.assert_allclose(np.asarray(s.value).item(), loss(xs, ws), rtol=1e-6)  # flushed
    gx, gw = dg.backward(s, [x, w])
    np.testing.assert_allclose(np.asarray(gx.value), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(gw.value), want[1], rtol=1e-5, atol=1e-6)


# -- issues 3 and 4: any Optax optimizer, optax.MultiSteps too (as Model takes it) ---------


def _multi_steps_reference(w0, xs, steps):
    ms = optax.MultiSteps(optax.sgd(0.5), 2)
    w, state = w0, ms.init(w0)
    for _ in range(steps):
        g = jax.grad(lambda v: jnp.sum(jnp.tanh(v * xs) ** 2))(w)
        u, state = ms.update(g, state, w)
        w = optax.apply_updates(w, u)
    return w


def test_dynamic_graph_minimize_takes_optax_multisteps() -> None:
    w0, xs = F32([0.5, -1.0]), F32([1.5, 0.7])
    ms = optax.MultiSteps(optax.sgd(0.5), 2)
    dg = DynamicGraph()
    w, x = dg.variable(w0), dg.constant(xs)
    for _ in range(3):
        h = dg.exec(ops.tanh(), w * x)
        dg.minimize(ms, (h * h).sum(), [w])
    np.testing.assert_allclose(np.asarray(w.value), _multi_steps_reference(w0, xs, 3), rtol=1e-6)


def test_symbolic_minimize_takes_optax_multisteps() -> None:
    from fnnc.graph import GraphBuilder, interpret, minimize

    w0, xs = F32([0.5, -1.0]), F32([1.5, 0.7])
    b = GraphBuilder()
    w, x = b.input((2,), name="w"), b.input((2,), name="x")
    h = b.exec(ops.tanh(), b.exec(ops.ewprod(), w, x))
    loss = b.exec(
        ops.reshape(shape=()), b.exec(ops.reduce_sum(axes=(0,)), b.exec(ops.ewprod(), h, h))
    )
    step, layout = minimize(b.build([loss]), loss, [w], optax.MultiSteps(optax.sgd(0.5), 2))
    params, state = [w0], layout.init([w0])
    for _ in range(3):
        params, state, _ = layout.split(interpret(step, *params, *state, xs))
    np.testing.assert_allclose(np.asarray(params[0]), _multi_steps_reference(w0, xs, 3), rtol=1e-6)


def test_design_names_while_and_caseof_are_the_builders():
    """DESIGN.md and issue 3 call the sub-graph nodes ``While`` and ``CaseOf``."""
    import fnnc.graph as g

    assert g.While is g.while_loop and g.CaseOf is g.case_of
