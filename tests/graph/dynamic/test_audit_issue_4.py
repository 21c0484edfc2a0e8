"""Audit of issue 4 (the dynamic graph, ``fnnc.graph.DynamicGraph``) against its own text.

Checks, as the issue states them: ``variable``/``constant``/``exec(cmd, *vars, name=)``;
operator sugar ``+ - * / @`` and ``.sum()`` (values against NumPy, gradients against
``jax.grad``); aliases (slices, reshapes, ``dg.alias``) composing as in NNC; writes
making new SSA versions; ``backward(f, wrt, df=None)`` with accumulation into gradients
that hold a value; ``apply_gradients``/``minimize`` with Optax (against Optax applied
directly, state kept per variable); ``no_grad``; ``free``/``detach`` pruning;
``evaluate`` of a cnnp model and of a traced graph; memoisation on for pure commands and
off for random ones; ``str(dg)`` and node/tensor counts; ``lazy=True``; the NNC numeric
cases; a 1,000-step loop with flat counts; eager/lazy/compiled agreement on random
command sequences (hypothesis); clear errors for a freed variable, backward on a
constant and a shape mismatch. Timing targets are not checked.
"""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fnnc import ops
from fnnc.errors import FnncError, GraphError, ShapeError
from fnnc.graph import DynamicGraph, GraphBuilder, compile, trace
from fnnc.models import Dense, ReLU, Sequential

F32 = np.float32
LAZY = pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])


def _rand(shape, seed=0, low=0.5, high=1.5):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(F32)


# -- NNC's dynamic-graph cases, float32, as the issue states them -----------------------


@LAZY
def test_x_log_x_plus_1_2_x_value_and_gradient_with_sugar(lazy: bool) -> None:
    """f = x * log(x) + 1.2 * x at x = 19 is 78.744340604; df/dx = log(19) + 2.2."""
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(F32([19.0]), name="x")
    f = x * dg.exec(ops.ewlog(), x) + 1.2 * x
    assert float(f.numpy()[0]) == pytest.approx(78.744340604, rel=1e-6)
    (dx,) = dg.backward(f, [x])
    assert float(dx.numpy()[0]) == pytest.approx(5.144438979, rel=1e-6)


@LAZY
def test_df_dy_with_y_a_variable_in_one_backward(lazy: bool) -> None:
    """With y = 1.2 a variable, one backward(f, [x, y]) gives df/dx = 5.1444, df/dy = 19."""
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(F32([19.0]), name="x")
    y = dg.variable(F32([1.2]), name="y")
    f = x * dg.exec(ops.ewlog(), x) + x * y
    assert float(f.numpy()[0]) == pytest.approx(78.744340604, rel=1e-6)
    dx, dy = dg.backward(f, [x, y])
    assert float(dx.numpy()[0]) == pytest.approx(5.144438979, rel=1e-6)
    assert float(dy.numpy()[0]) == pytest.approx(19.0, rel=1e-6)
    assert dg.grad(x) is dx and dg.grad(y) is dy


@LAZY
def test_second_backward_at_x_10_accumulates_into_the_same_dx(lazy: bool) -> None:
    """A second backward at x = 10 adds into the gradient already held: 9.647024072."""
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(F32([19.0]), name="x")
    y = dg.variable(F32([1.2]), name="y")
    (dx,) = dg.backward(x * dg.exec(ops.ewlog(), x) + x * y, [x])
    assert float(dx.numpy()[0]) == pytest.approx(5.144438979, rel=1e-6)
    dg.set(x, F32([10.0]))
    f = x * dg.exec(ops.ewlog(), x) + x * y
    assert float(f.numpy()[0]) == pytest.approx(10 * np.log(10) + 12, rel=1e-6)
    (again,) = dg.backward(f, [x])
    assert again is dx and dg.grad(x) is dx
    assert float(dx.numpy()[0]) == pytest.approx(9.647024072, rel=1e-6)


@LAZY
def test_x_32_times_constant_0_9_four_times(lazy: bool) -> None:
    """x = 32 times the constant 0.9 four times: backward to x gives 0.6561."""
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(F32([32.0]), name="x")
    c = dg.constant(F32([0.9]), name="c")
    z = x
    for _ in range(4):
        z = z * c
    (dx,) = dg.backward(z, [x])
    assert float(dx.numpy()[0]) == pytest.approx(0.6561, rel=1e-6)
    assert float(z.numpy()[0]) == pytest.approx(32 * 0.6561, rel=1e-6)
    assert dg.grad(c) is None  # a constant never gets a gradient


@LAZY
@pytest.mark.parametrize("how", ["dg.alias", "slice"])
def test_writes_through_one_element_aliases_then_x_times_y(lazy: bool, how: str) -> None:
    """y[0] = 10 z, y[1] = 2 z through one-element aliases at z = 2; x * y = [200, 40]."""
    dg = DynamicGraph(lazy=lazy)
    z = dg.variable(F32([2.0]), name="z")
    x = dg.variable(F32([10.0]), name="x")
    y = dg.variable(F32([0.0, 0.0]), name="y")
    if how == "dg.alias":
        dg.exec(ops.scalar_mul(a=10.0), z, outputs=[dg.alias(y, (1,))])
        dg.exec(ops.scalar_mul(a=2.0), z, outputs=[dg.alias(y, (1,), offset=(1,))])
    else:
        y[0:1] = z * 10.0
        y[1:2] = z * 2.0
    f = dg.exec(ops.ewprod(), x, y)
    np.testing.assert_allclose(f.numpy(), [200.0, 40.0], rtol=1e-6)
    dz, dx = dg.backward(f.sum(), [z, x])
    # f = [x * 10 z, x * 2 z]: d/dz sum = 12 x = 120, d/dx sum = 12 z = 24
    np.testing.assert_allclose(dz.numpy(), [120.0], rtol=1e-6)
    np.testing.assert_allclose(dx.numpy(), [24.0], rtol=1e-6)


def test_detach_then_free_counts_as_the_issue_states() -> None:
    """z = 0.5 * log(x): 2 nodes; detach log(x): 1 node, x no longer reaches z; free x: 0."""
    dg = DynamicGraph()
    x = dg.variable(F32([10.0]), name="x")
    y = dg.exec(ops.ewlog(), x)
    z = 0.5 * y
    assert dg.num_nodes == 2
    assert dg.has_effect([x], [z]) == [True]
    dg.detach(y)
    assert dg.num_nodes == 1
    assert dg.has_effect([x], [z]) == [False]
    assert not y.requires_grad
    (dx,) = dg.backward(z, [x])
    assert float(dx.numpy()[0]) == 0.0  # x no longer influences z
    dg.free(x)
    assert dg.num_nodes == 0
    assert float(z.numpy()[0]) == pytest.approx(0.5 * np.log(10.0), rel=1e-6)


# -- operator sugar --------------------------------------------------------------------

_BINARY = {
    "+": (lambda a, b: a + b, (2, 3), (2, 3)),
    "-": (lambda a, b: a - b, (2, 3), (2, 3)),
    "*": (lambda a, b: a * b, (2, 3), (2, 3)),
    "/": (lambda a, b: a / b, (2, 3), (2, 3)),
    "@": (lambda a, b: a @ b, (2, 3), (3, 4)),
}


@pytest.mark.parametrize("op", list(_BINARY))
def test_binary_operator_value_and_gradients_match_numpy_and_jax(op: str) -> None:
    """Each of + - * / @ on two variables: value as NumPy, gradients as jax.grad."""
    fn, sa, sb = _BINARY[op]
    a0, b0 = _rand(sa, 1), _rand(sb, 2)
    dg = DynamicGraph()
    a, b = dg.variable(a0, name="a"), dg.variable(b0, name="b")
    out = fn(a, b)
    np.testing.assert_allclose(out.numpy(), fn(a0, b0), rtol=1e-5)
    s = out.sum()
    np.testing.assert_allclose(s.numpy().reshape(()), fn(a0, b0).sum(), rtol=1e-5)
    da, db = dg.backward(s, [a, b])
    want = jax.grad(lambda p, q: jnp.sum(fn(p, q)), argnums=(0, 1))(a0, b0)
    np.testing.assert_allclose(da.numpy(), want[0], rtol=1e-5)
    np.testing.assert_allclose(db.numpy(), want[1], rtol=1e-5)


def test_numbers_and_arrays_on_either_side_of_the_operators() -> None:
    """2 + x, x - 3, 2 - x, 3 * x, x / 4, 3 / x, ndarray * x: NumPy values, jax.grad."""
    x0, k = _rand((3,), 3), _rand((3,), 4)

    def fn(x, k):
        return (2.0 + x) * (x - 3.0) + (2.0 - x) * (3.0 * x) + x / 4.0 + 3.0 / x + k * x

    dg = DynamicGraph()
    x = dg.variable(x0, name="x")
    out = fn(x, k)
    np.testing.assert_allclose(out.numpy(), fn(x0, k), rtol=1e-5)
    (dx,) = dg.backward(out.sum(), [x])
    want = jax.grad(lambda v: jnp.sum(fn(v, k)))(x0)
    np.testing.assert_allclose(dx.numpy(), want, rtol=1e-5)


def test_sum_is_every_element_and_its_gradient_is_ones() -> None:
    """``.sum()`` adds every element (one element kept); its gradient is ones."""
    x0 = _rand((2, 3), 5)
    dg = DynamicGraph()
    x = dg.variable(x0)
    s = x.sum()
    assert s.size == 1
    assert float(s.numpy().reshape(())) == pytest.approx(float(x0.sum()), rel=1e-6)
    np.testing.assert_allclose(dg.backward(s, [x])[0].numpy(), np.ones((2, 3)))


# -- exec, writes, aliases ---------------------------------------------------------------


def test_exec_name_appears_in_the_listing_and_constants_accept_arrays() -> None:
    """exec(cmd, *vars, name=) records a node listed with its name; arrays are constants."""
    dg = DynamicGraph()
    x = dg.variable(_rand((2,), 6), name="x")
    y = dg.exec(ops.ewprod(), x, np.asarray([2.0, 3.0], F32), name="scaled")
    np.testing.assert_allclose(y.numpy(), _rand((2,), 6) * [2.0, 3.0], rtol=1e-6)
    text = str(dg)
    assert "ewprod" in text and "# scaled" in text and " x" in text
    (dx,) = dg.backward(y.sum(), [x])
    np.testing.assert_allclose(dx.numpy(), [2.0, 3.0])


def test_write_makes_a_new_ssa_version_and_old_readers_keep_theirs() -> None:
    """Writing y = exp(w) over y = 3 w: old readers keep 3 w, gradients see both versions."""
    w0 = F32([1.0, 2.0])
    dg = DynamicGraph()
    w = dg.variable(w0, name="w")
    y = w * 3.0
    old_sum = y.sum()
    tensors = dg.num_tensors
    dg.exec(ops.ewexp(), w, outputs=[y])
    assert dg.num_tensors == tensors + 1  # a new version, the old one is kept
    np.testing.assert_allclose(y.numpy(), np.exp(w0), rtol=1e-6)
    assert float(old_sum.numpy().reshape(())) == pytest.approx(9.0)
    text = str(dg)
    assert "scalar_mul" in text and "ewexp" in text
    (g_old,) = dg.backward(old_sum, [w])
    np.testing.assert_allclose(g_old.numpy(), [3.0, 3.0])
    dg.zero_grad()
    (g_new,) = dg.backward(y.sum(), [w])
    np.testing.assert_allclose(g_new.numpy(), np.exp(w0), rtol=1e-6)


def test_write_through_an_alias_is_a_new_version_of_the_whole_variable() -> None:
    """y[1:3] = v: y and its other aliases see it; f computed before keeps the old y."""
    dg = DynamicGraph()
    y = dg.variable(np.arange(4, dtype=F32), name="y")
    v = dg.variable(F32([7.0, 8.0]), name="v")
    tail = y[2:]
    before = y * 2.0
    y[1:3] = v
    np.testing.assert_allclose(y.numpy(), [0, 7, 8, 3])
    np.testing.assert_allclose(tail.numpy(), [8, 3])
    np.testing.assert_allclose(before.numpy(), [0, 2, 4, 6])
    f = (y * y).sum()
    dy, dv = dg.backward(f, [y, v])
    np.testing.assert_allclose(dv.numpy(), [14.0, 16.0])
    # wrt y is y's current version (NNC: the variable's current symbol): 2 y
    np.testing.assert_allclose(dy.numpy(), [0.0, 14.0, 16.0, 6.0])


def test_aliases_compose_slices_reshapes_and_dg_alias() -> None:
    """A slice of a slice, a reshape of a slice and dg.alias on an alias are NumPy views;
    gradients through them sum into the root as jax.grad says."""
    x0 = np.arange(24, dtype=F32).reshape(4, 6) / 10
    dg = DynamicGraph()
    x = dg.variable(x0, name="x")
    s = x[1:3]
    t = s[:, 2:5]
    r = x[1:3].reshape(12)
    q = x.reshape(2, 12)[1]
    a = dg.alias(s, (2, 2), offset=(0, 1))
    np.testing.assert_array_equal(t.numpy(), x0[1:3][:, 2:5])
    np.testing.assert_array_equal(r.numpy(), x0[1:3].reshape(12))
    np.testing.assert_array_equal(q.numpy(), x0.reshape(2, 12)[1])
    np.testing.assert_array_equal(a.numpy(), x0[1:3, 1:3])
    f = (t * t).sum() + (r * 3.0).sum() + (q * q).sum() + (a * 5.0).sum()

    def jf(v):
        return (
            jnp.sum(v[1:3][:, 2:5] ** 2)
            + jnp.sum(v[1:3].reshape(12) * 3)
            + jnp.sum(v.reshape(2, 12)[1] ** 2)
            + jnp.sum(v[1:3, 1:3] * 5)
        )

    (dx,) = dg.backward(f, [x])
    np.testing.assert_allclose(dx.numpy(), jax.grad(jf)(x0), rtol=1e-5)
    t[...] = np.zeros((2, 3), F32)  # a write through the composed view
    want = x0.copy()
    want[1:3, 2:5] = 0
    np.testing.assert_array_equal(x.numpy(), want)
    np.testing.assert_array_equal(s.numpy(), want[1:3])


# -- backward --------------------------------------------------------------------------


def test_backward_df_keyword_seeds_like_jax_vjp() -> None:
    """backward(f, wrt, df=seed) for a non-scalar f equals jax.vjp with that seed."""
    x0, seed = _rand((2, 3), 7), _rand((2, 3), 8)
    dg = DynamicGraph()
    x = dg.variable(x0)
    f = dg.exec(ops.tanh(), x) * x
    (dx,) = dg.backward(f, [x], df=seed)
    _, vjp = jax.vjp(lambda v: jnp.tanh(v) * v, x0)
    np.testing.assert_allclose(dx.numpy(), vjp(seed)[0], rtol=1e-5)


def test_backward_twice_accumulates_into_the_held_gradient() -> None:
    """Two backward calls on the same f: dg.grad(x) holds twice the gradient."""
    x0 = _rand((3,), 9)
    dg = DynamicGraph()
    x = dg.variable(x0)
    f = (x * x).sum()
    (g1,) = dg.backward(f, [x])
    (g2,) = dg.backward(f, [x])
    assert g1 is g2 is dg.grad(x)
    np.testing.assert_allclose(g2.numpy(), 4 * x0, rtol=1e-6)


# -- Optax -----------------------------------------------------------------------------


def _loss_np(a, b):
    return jnp.sum(a * a * b) + jnp.sum(jnp.sin(a))


def _loss_dg(dg, a, b):
    return (a * a * b).sum() + dg.exec(ops.ewsin(), a).sum()


def _optax_per_variable(opt, steps, a0, b0, order_of_steps=None):
    """Optax applied directly, one state per variable (what 'kept per variable' means)."""
    p = {"a": jnp.asarray(a0), "b": jnp.asarray(b0)}
    s = {k: opt.init(v) for k, v in p.items()}
    for step in range(steps):
        names = order_of_steps[step] if order_of_steps else ("a", "b")
        g = dict(zip("ab", jax.grad(_loss_np, argnums=(0, 1))(p["a"], p["b"])))
        for k in names:
            u, s[k] = opt.update(g[k], s[k], p[k])
            p[k] = optax.apply_updates(p[k], u)
    return p


A0, B0 = F32([1.0, -2.0, 3.0]), F32([0.5, 0.25, -1.0])


@LAZY
def test_apply_gradients_with_adam_equals_optax_applied_directly(lazy: bool) -> None:
    """backward + apply_gradients(optax.adam) for 3 steps: Optax on jax.grad, state kept."""
    opt = optax.adam(0.1)
    dg = DynamicGraph(lazy=lazy)
    a, b = dg.variable(A0, name="a"), dg.variable(B0, name="b")
    for _ in range(3):
        dg.backward(_loss_dg(dg, a, b), [a, b])
        dg.apply_gradients(opt, [a, b])
    want = _optax_per_variable(opt, 3, A0, B0)
    np.testing.assert_allclose(a.numpy(), want["a"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.numpy(), want["b"], rtol=1e-5, atol=1e-6)


@LAZY
def test_minimize_with_an_optax_chain_equals_optax_applied_directly(lazy: bool) -> None:
    """minimize(chain(clip_by_global_norm, adamw), f, vars) for 3 steps equals Optax."""
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(0.05, weight_decay=0.1))
    dg = DynamicGraph(lazy=lazy)
    a, b = dg.variable(A0, name="a"), dg.variable(B0, name="b")
    for _ in range(3):
        dg.minimize(opt, _loss_dg(dg, a, b), [a, b])
    p = [jnp.asarray(A0), jnp.asarray(B0)]
    s = opt.init(p)
    for _ in range(3):
        g = list(jax.grad(lambda q: _loss_np(*q))(p))
        u, s = opt.update(g, s, p)
        p = optax.apply_updates(p, u)
    np.testing.assert_allclose(a.numpy(), p[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.numpy(), p[1], rtol=1e-5, atol=1e-6)


def test_separate_variable_sets_keep_separate_adam_states() -> None:
    """apply_gradients(adam, [a]) and (adam, [b]) alternately: each keeps its own state."""
    opt = optax.adam(0.1)
    dg = DynamicGraph()
    a, b = dg.variable(A0, name="a"), dg.variable(B0, name="b")
    for _ in range(3):
        dg.backward(_loss_dg(dg, a, b), [a, b])
        dg.apply_gradients(opt, [a])
        dg.apply_gradients(opt, [b])
    want = _optax_per_variable(opt, 3, A0, B0)
    np.testing.assert_allclose(a.numpy(), want["a"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.numpy(), want["b"], rtol=1e-5, atol=1e-6)


def test_adam_state_follows_each_variable_when_the_list_is_reordered() -> None:
    """apply_gradients(adam, [a, b]) then (adam, [b, a]): the state follows each variable."""
    opt = optax.adam(0.1)
    dg = DynamicGraph()
    a, b = dg.variable(A0, name="a"), dg.variable(B0, name="b")
    for step in range(4):
        dg.backward(_loss_dg(dg, a, b), [a, b])
        dg.apply_gradients(opt, [a, b] if step % 2 == 0 else [b, a])
    want = _optax_per_variable(opt, 4, A0, B0)
    np.testing.assert_allclose(a.numpy(), want["a"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.numpy(), want["b"], rtol=1e-5, atol=1e-6)


def test_adam_state_of_a_variable_carries_from_a_set_to_a_subset() -> None:
    """minimize(adam, f, [a, b]) twice, then (adam, f, [a]): a's Adam moments carry on."""
    opt = optax.adam(0.1)
    dg = DynamicGraph()
    a, b = dg.variable(A0, name="a"), dg.variable(B0, name="b")
    plan = [("a", "b"), ("a", "b"), ("a",)]
    for names in plan:
        dg.minimize(opt, _loss_dg(dg, a, b), [{"a": a, "b": b}[n] for n in names])
    want = _optax_per_variable(opt, 3, A0, B0, plan)
    np.testing.assert_allclose(b.numpy(), want["b"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.numpy(), want["a"], rtol=1e-5, atol=1e-6)


# -- no_grad, free ---------------------------------------------------------------------


def test_no_grad_runs_records_nothing_and_blocks_gradients() -> None:
    """Under no_grad commands run but record nothing; their results act as constants."""
    x0 = _rand((3,), 10)
    dg = DynamicGraph()
    x = dg.variable(x0, name="x")
    with dg.no_grad():
        c = x * 2.0
        c.name = "c"
    np.testing.assert_allclose(c.numpy(), 2 * x0, rtol=1e-6)
    assert dg.num_nodes == 0 and not c.requires_grad
    f = (c * x).sum()
    (dx,) = dg.backward(f, [x])
    np.testing.assert_allclose(dx.numpy(), 2 * x0, rtol=1e-6)  # not 4 x: c is a constant
    with pytest.raises(GraphError, match="'c'"):
        dg.backward(c, [x], df=np.ones(3, F32))


def test_free_and_dropping_a_variable_prune_the_record() -> None:
    """free(var) and Python dropping the last handle both prune recorded nodes."""
    dg = DynamicGraph()
    x = dg.variable(_rand((2,), 11))
    y = dg.exec(ops.ewexp(), x)
    z = dg.exec(ops.tanh(), x)
    assert dg.num_nodes == 2
    dg.free(y)
    assert dg.num_nodes == 1
    del z
    gc.collect()
    assert dg.num_nodes == 0


# -- evaluate ----------------------------------------------------------------------------


def test_evaluate_a_compiled_cnnp_model_is_one_node_with_gradients() -> None:
    """evaluate(model, [x]) of a compiled Sequential: one node, value and gradients as JAX."""
    x0 = np.random.default_rng(12).normal(size=(4, 5)).astype(F32)
    model = Sequential([Dense(3, name="l1"), ReLU(), Dense(2, name="l2")], name="mlp")
    model.compile([jax.ShapeDtypeStruct((4, 5), np.float32)])
    values = {k: np.asarray(v) for k, v in model.parameters().items()}
    by = {k.split("-")[3] + k[-1]: k for k in values}  # l10, l11, l20, l21

    def forward(x, p):
        h = jax.nn.relu(x @ p[by["l10"]].T + p[by["l11"]][None])
        return h @ p[by["l20"]].T + p[by["l21"]][None]

    dg = DynamicGraph()
    x = dg.variable(x0, name="x")
    y = dg.evaluate(model, [x])
    assert dg.num_nodes == 1
    np.testing.assert_allclose(y.numpy(), forward(x0, values), rtol=1e-5, atol=1e-6)
    params = dg.parameters(model)
    grads = dg.backward((y * y).sum(), [x, *params.values()])
    want_x, want_p = jax.grad(lambda v, p: jnp.sum(forward(v, p) ** 2), argnums=(0, 1))(x0, values)
    np.testing.assert_allclose(grads[0].numpy(), want_x, rtol=1e-4, atol=1e-5)
    for g, pid in zip(grads[1:], params):
        np.testing.assert_allclose(g.numpy(), want_p[pid], rtol=1e-4, atol=1e-5)
    # minimize on the parameters updates the model itself (sgd: p - lr * grad)
    dg.zero_grad()
    dg.minimize(optax.sgd(0.01), (dg.evaluate(model, [x]) ** 2).sum(), list(params.values()))
    after = model.parameters()
    for pid in params:
        want = values[pid] - 0.01 * np.asarray(want_p[pid])
        np.testing.assert_allclose(np.asarray(after[pid]), want, rtol=1e-4, atol=1e-6)


@LAZY
def test_evaluate_a_traced_function_gradients_flow_through(lazy: bool) -> None:
    """evaluate(trace(fn, ...), inputs) is one node; value and gradients as jax.grad."""

    def fn(x, w):
        return jnp.tanh(x @ w) * 2.0

    x0, w0 = _rand((2, 3), 13), _rand((3, 2), 14)
    graph = trace(fn, x0, w0)
    dg = DynamicGraph(lazy=lazy)
    x, w = dg.variable(x0), dg.variable(w0)
    y = dg.evaluate(graph, [x, w])
    assert dg.num_nodes == 1
    np.testing.assert_allclose(y.numpy(), fn(x0, w0), rtol=1e-5)
    dx, dw = dg.backward((y * y).sum(), [x, w])
    want = jax.grad(lambda a, b: jnp.sum(fn(a, b) ** 2), argnums=(0, 1))(x0, w0)
    np.testing.assert_allclose(dx.numpy(), want[0], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(dw.numpy(), want[1], rtol=1e-4, atol=1e-6)


# -- memoisation -------------------------------------------------------------------------


def test_memoisation_is_on_by_default_for_pure_commands() -> None:
    """The same pure command on the same inputs twice records one node (default on)."""
    x0 = _rand((3,), 15)
    dg = DynamicGraph()
    x = dg.variable(x0)
    cmd = ops.ewexp()
    a, b = dg.exec(cmd, x), dg.exec(cmd, x)
    c, d = x * 2.0, x * 2.0  # equal commands made apart by the operator
    assert dg.num_nodes == 2
    np.testing.assert_allclose(b.numpy(), np.exp(x0), rtol=1e-6)
    np.testing.assert_allclose(a.numpy(), b.numpy())
    np.testing.assert_allclose(d.numpy(), c.numpy())
    off = DynamicGraph(memo=False)
    y = off.variable(x0)
    _ = off.exec(cmd, y), off.exec(cmd, y)
    assert off.num_nodes == 2


def test_memoisation_is_off_for_random_commands() -> None:
    """dropout twice on the same inputs records two nodes (random: never memoised)."""
    dg = DynamicGraph()
    x = dg.variable(_rand((8,), 16))
    key = dg.constant(np.asarray(jax.random.key_data(jax.random.key(3))))
    first = dg.exec(ops.dropout(p=0.5), x, key)
    second = dg.exec(ops.dropout(p=0.5), x, key)
    assert isinstance(first, tuple) and isinstance(second, tuple)
    assert dg.num_nodes == 2


# -- introspection -----------------------------------------------------------------------


def test_str_and_counts_of_a_small_graph() -> None:
    """x, w variables; h = tanh(x @ w); f = h.sum(): 3 nodes, 5 tensors, all listed."""
    dg = DynamicGraph()
    x = dg.variable(_rand((2, 3), 17), name="x")
    w = dg.variable(_rand((3, 4), 18), name="w")
    h = dg.exec(ops.tanh(), x @ w, name="act")
    f = h.sum()
    assert dg.num_nodes == 3 and dg.num_tensors == 5
    text = str(dg)
    for part in ("gemm", "tanh", "reduce_sum", "# act", "f32[2,3] x", "f32[3,4] w"):
        assert part in text, (part, text)
    assert text.count(" = ") == 3
    assert f.shape == (1, 1)
    assert "3 nodes" in repr(dg)


# -- lazy mode ---------------------------------------------------------------------------


def test_lazy_records_and_runs_at_the_read_as_one_program() -> None:
    """lazy=True: commands compile nothing until a value is read; then one program."""
    x0 = _rand((3, 7), 19)
    dg = DynamicGraph(lazy=True)
    x = dg.variable(x0)
    before = dg.num_compiled
    h = x
    for _ in range(4):
        h = dg.exec(ops.ewsin(), h) * 1.25
    assert dg.num_compiled == before and dg.num_nodes == 8
    want = x0
    for _ in range(4):
        want = np.sin(want) * 1.25
    np.testing.assert_allclose(h.numpy(), want, rtol=1e-5)
    assert dg.num_compiled == before + 1


def test_lazy_backward_and_apply_gradients_are_sync_points() -> None:
    """In lazy mode backward runs the pending forward; apply_gradients steps as eager does."""
    x0 = _rand((4,), 20)
    results = []
    for lazy in (False, True):
        dg = DynamicGraph(lazy=lazy)
        x = dg.variable(x0, name="x")
        f = (dg.exec(ops.ewexp(), x) * x).sum()
        (dx,) = dg.backward(f, [x])
        grad = dx.numpy()
        dg.apply_gradients(optax.sgd(0.1), [x])
        results.append((grad, x.numpy(), f.numpy()))
    want = jax.grad(lambda v: jnp.sum(jnp.exp(v) * v))(x0)
    for grad, x, f in results:
        np.testing.assert_allclose(grad, want, rtol=1e-5)
        np.testing.assert_allclose(x, x0 - 0.1 * np.asarray(want), rtol=1e-5)
        np.testing.assert_allclose(f.reshape(()), np.sum(np.exp(x0) * x0), rtol=1e-5)


# -- a long loop keeps the graph flat ------------------------------------------------------


def test_1000_step_eager_mlp_loop_keeps_counts_flat() -> None:
    """1,000 eager minimize steps of a small MLP: nodes, tensors, programs, arrays flat."""
    rng = np.random.default_rng(21)
    dg = DynamicGraph()
    w0 = dg.variable(rng.normal(0, 0.5, (4, 8)).astype(F32), name="w0")
    b0 = dg.variable(np.zeros(8, F32), name="b0")
    w1 = dg.variable(rng.normal(0, 0.5, (8, 1)).astype(F32), name="w1")
    params = [w0, b0, w1]
    opt = optax.adam(1e-2)
    xs = rng.normal(size=(16, 4)).astype(F32)
    ys = (xs.sum(1, keepdims=True) > 0).astype(F32)
    counts, losses, live = set(), [], []
    gc.collect()
    for step in range(1000):
        h = dg.exec(ops.relu(), dg.constant(xs) @ w0 + b0)
        d = h @ w1 - dg.constant(ys)
        loss = (d * d).sum() / 16.0
        dg.minimize(opt, loss, params)
        if step in (0, 999):
            losses.append(float(loss.numpy().reshape(())))
        if step >= 2:
            counts.add((dg.num_nodes, dg.num_tensors, dg.num_compiled, DynamicGraph.programs()))
            live.append(len(jax.live_arrays()))
    assert len(counts) == 1, counts
    # a leak grows by a buffer or more a step; a GPU frees some buffers asynchronously,
    # so the count may be one higher at one step than at another
    assert max(live) <= min(live) + 1, (min(live), max(live))
    assert losses[1] < 0.5 * losses[0]


# -- eager, lazy and compiled agree on random command sequences ------------------------------

_UNARY = {"tanh": (ops.tanh(), np.tanh), "sin": (ops.ewsin(), np.sin)}
_BIN = {
    "+": (ops.ewsum(), np.add),
    "-": (ops.add(q=-1.0), np.subtract),
    "*": (ops.ewprod(), np.multiply),
    "@": (ops.gemm(), np.matmul),
}


_JAX = {
    "tanh": jnp.tanh,
    "sin": jnp.sin,
    "+": jnp.add,
    "-": jnp.subtract,
    "*": jnp.multiply,
    "@": jnp.matmul,
}


@st.composite
def _programs(draw):
    n = draw(st.integers(2, 6))
    steps = []
    for i in range(n):
        have = 3 + i
        if draw(st.booleans()):
            steps.append((draw(st.sampled_from(sorted(_UNARY))), draw(st.integers(0, have - 1))))
        else:
            op = draw(st.sampled_from(sorted(_BIN)))
            steps.append((op, draw(st.integers(0, have - 1)), draw(st.integers(0, have - 1))))
    return steps


def _run_dg(dg, steps, arrays):
    env = [dg.variable(a, name=f"in{i}") for i, a in enumerate(arrays)]
    for op, *args in steps:
        table = _UNARY if len(args) == 1 else _BIN
        env.append(dg.exec(table[op][0], *(env[i] for i in args)))
    grads = dg.backward(env[-1].sum(), env[:3])
    return env[-1].numpy(), [g.numpy() for g in grads]


@settings(max_examples=4)
@given(_programs())
def test_eager_lazy_and_compiled_agree_on_random_command_sequences(steps) -> None:
    """Random command sequences: eager == lazy == compile(GraphBuilder) == NumPy; the
    gradients of eager and lazy equal jax.grad."""
    arrays = [_rand((3, 3), 30 + i) for i in range(3)]
    env = [a.astype(np.float64) for a in arrays]
    b = GraphBuilder()
    syms = [b.input((3, 3), name=f"in{i}") for i in range(3)]
    for op, *args in steps:
        table = _UNARY if len(args) == 1 else _BIN
        env.append(table[op][1](*(env[i] for i in args)))
        syms.append(b.exec(table[op][0], *(syms[i] for i in args)))
    compiled = np.asarray(compile(b.build([syms[-1]]))(*arrays))
    np.testing.assert_allclose(compiled, env[-1], rtol=1e-4, atol=1e-5)

    def jfn(*xs):
        vals = list(xs)
        for op, *args in steps:
            vals.append(_JAX[op](*(vals[i] for i in args)))
        return jnp.sum(vals[-1])

    want_grads = jax.grad(jfn, argnums=(0, 1, 2))(*arrays)
    for lazy in (False, True):
        value, grads = _run_dg(DynamicGraph(lazy=lazy), steps, arrays)
        np.testing.assert_allclose(value, env[-1], rtol=1e-4, atol=1e-5, err_msg=f"{lazy}")
        for g, w in zip(grads, want_grads):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{lazy}")


# -- clear errors ------------------------------------------------------------------------------


def test_freed_variable_used_again_names_the_variable_and_command() -> None:
    """Using a freed variable in exec(name=) or an operator names both."""
    dg = DynamicGraph()
    x = dg.variable(F32([1.0]), name="x")
    dg.free(x)
    with pytest.raises(GraphError) as e:
        dg.exec(ops.ewexp(), x, name="step1")
    assert "'x'" in str(e.value) and "ewexp" in str(e.value) and "step1" in str(e.value)
    with pytest.raises(GraphError) as e:
        _ = x @ x
    assert "'x'" in str(e.value) and "gemm" in str(e.value) and "freed" in str(e.value)


def test_backward_on_a_constant_names_the_variable() -> None:
    """backward with respect to a constant, or of a constant f, names it."""
    dg = DynamicGraph()
    x = dg.variable(F32([1.0]), name="x")
    c = dg.constant(F32([2.0]), name="c")
    with pytest.raises(GraphError) as e:
        dg.backward((x * c).sum(), [c])
    assert "'c'" in str(e.value) and "constant" in str(e.value) and "backward" in str(e.value)
    k = c * c
    k.name = "k"
    with pytest.raises(GraphError) as e:
        dg.backward(k, [x])
    assert "'k'" in str(e.value) and "constant" in str(e.value)


@pytest.mark.parametrize("how", ["operator", "exec"])
def test_shape_mismatch_names_the_variables_and_command(how: str) -> None:
    """a @ b and exec(ewsum, a, b, name=) on mismatched shapes name both and the command."""
    dg = DynamicGraph()
    a = dg.variable(np.ones((2, 3), F32), name="a")
    b = dg.variable(np.ones((4, 4), F32), name="b")
    with pytest.raises(ShapeError) as e:
        if how == "operator":
            _ = a @ b
        else:
            dg.exec(ops.ewsum(), a, b, name="mysum")
    msg = str(e.value)
    assert "'a'" in msg and "'b'" in msg
    assert ("gemm" in msg) if how == "operator" else ("ewsum" in msg and "mysum" in msg)
    assert dg.num_nodes == 0  # nothing recorded by the failed command
    assert isinstance(e.value, FnncError)


@LAZY
def test_int_index_writes_of_one_element_values_as_numpy_does(lazy: bool) -> None:
    """``y[0] = z * 10`` and ``y[1] = z * 2`` with ``z`` of shape [1] (NumPy writes a
    size-1 value into one element): f = x * y is [200, 40], df/dz = 12 x = 120."""
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(F32([10.0]), name="x")
    y = dg.variable(np.zeros(2, np.float32), name="y")
    z = dg.variable(F32([2.0]), name="z")
    y[0] = z * 10
    y[1] = z * 2
    f = x * y
    np.testing.assert_allclose(f.numpy(), [200.0, 40.0], rtol=1e-6)
    (dz,) = dg.backward(f.sum(), [z])
    np.testing.assert_allclose(dz.numpy(), [120.0], rtol=1e-6)
    with pytest.raises(ShapeError, match="writes float32\\[2\\]"):
        y[0] = dg.variable(np.zeros(2, np.float32))
