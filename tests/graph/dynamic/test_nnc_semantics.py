"""Issue 12 (NNC fidelity), dynamic graph: freeing gradients, optimizer state by
structure, simplify in dynamic programs, higher-order gradients, cnnp models."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import GraphError
from fnnc.graph import DynamicGraph
from fnnc.graph.dynamic.extract import PROGRAMS


def test_free_gradient_resets_accumulation() -> None:
    dg = DynamicGraph()
    x = dg.variable(np.float32([3.0]), name="x")
    (dx,) = dg.backward(x * x, [x])
    assert float(dx.numpy()[0]) == 6.0
    dg.free(dx)
    assert dg.grad(x) is None
    (dx2,) = dg.backward(x * x, [x])  # a new gradient, not accumulated into the freed one
    assert float(dx2.numpy()[0]) == 6.0
    (dx3,) = dg.backward(x * x, [x])
    assert dx3 is dx2 and float(dx3.numpy()[0]) == 12.0


def _quadratic_steps(make, steps: int = 5, *, apply: bool = False) -> np.ndarray:
    dg = DynamicGraph()
    w = dg.variable(np.float32([1.0, -2.0, 3.0]), name="w")
    for _ in range(steps):
        f = (w * w).sum()
        if apply:
            dg.backward(f, [w])
            dg.apply_gradients(make(), [w])
        else:
            dg.minimize(make(), f, [w])
    return w.numpy()


@pytest.mark.parametrize("apply", [False, True])
def test_fresh_adam_per_step_equals_one_reused(apply: bool) -> None:
    reused = optax.adam(0.1)
    one = _quadratic_steps(lambda: reused, apply=apply)
    fresh = _quadratic_steps(lambda: optax.adam(0.1), apply=apply)
    np.testing.assert_allclose(fresh, one, rtol=1e-6)
    # against plain optax
    params, opt = jnp.float32([1.0, -2.0, 3.0]), optax.adam(0.1)
    state = opt.init(params)
    for _ in range(5):
        updates, state = opt.update(2 * params, state, params)
        params = optax.apply_updates(params, updates)
    np.testing.assert_allclose(one, params, rtol=1e-5)


def test_a_scheduled_optimizer_made_fresh_per_step_keeps_its_state() -> None:
    """``optax.exponential_decay`` closes over a cell bound after its inner function."""
    make = lambda: optax.adam(optax.exponential_decay(0.1, 2, 0.5))
    fresh = _quadratic_steps(make)
    params, opt = jnp.float32([1.0, -2.0, 3.0]), make()
    state = opt.init(params)
    for _ in range(5):
        updates, state = opt.update(2 * params, state, params)
        params = optax.apply_updates(params, updates)
    np.testing.assert_allclose(fresh, params, rtol=1e-5)


def test_fresh_optimizer_compiles_once_and_injected_rate_recompiles_nothing() -> None:
    dg = DynamicGraph()
    w = dg.variable(np.float32([1.0, -2.0]), name="w")
    dg.minimize(optax.adam(0.1), (w * w).sum(), [w])
    compiled = dg.num_compiled
    for _ in range(3):
        dg.minimize(optax.adam(0.1), (w * w).sum(), [w])
    assert dg.num_compiled == compiled
    assert len(dg.optimizer_states(w)) == 1  # one state, carried on
    # an injected learning rate is an input: changing it compiles nothing new
    adam = optax.inject_hyperparams(optax.adam)
    before = w.numpy()
    dg.minimize(adam(learning_rate=0.1), (w * w).sum(), [w])
    compiled = dg.num_compiled
    moved = w.numpy()
    assert not np.allclose(before, moved)
    dg.minimize(adam(learning_rate=0.0), (w * w).sum(), [w])
    assert dg.num_compiled == compiled
    after_zero = w.numpy()
    np.testing.assert_array_equal(after_zero, moved)  # rate 0 took effect: no move
    dg.minimize(adam(learning_rate=0.5), (w * w).sum(), [w])
    assert dg.num_compiled == compiled
    assert not np.allclose(w.numpy(), after_zero)  # the new rate took effect


def test_other_structure_sets_state_aside() -> None:
    dg = DynamicGraph()
    w = dg.variable(np.float32([1.0, -2.0]), name="w")
    dg.minimize(optax.adam(0.1), (w * w).sum(), [w])
    dg.minimize(optax.sgd(0.1), (w * w).sum(), [w])
    views = dg.optimizer_states(w)
    assert len(views) == 2  # adam's moments kept, sgd's (empty) state apart
    (adam_state,) = [jax.tree.leaves(v) for v in views.values() if jax.tree.leaves(v)]
    assert int(adam_state[0]) == 1  # adam's count: one adam step so far


def _gradient_graphs():
    # keys are (structure key, dispatch state); a structure key starts with its kind
    return [v[0] for (k, _), v in PROGRAMS._items.items() if k[0] in ("backward", "minimize")]


@pytest.mark.parametrize("lazy", [False, True])
def test_softmax_crossentropy_fuses_in_the_gradient_program(lazy: bool) -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 5)).astype(np.float32)
    labels = np.int32([0, 3, 1, 4])
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(logits, name="x")
    loss = dg.exec(ops.categorical_crossentropy(), dg.exec(ops.softmax(), x), dg.constant(labels))
    (dx,) = dg.backward(dg.exec(ops.reduce_mean(axes=(0, 1)), loss), [x])

    def ref(z):
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(z), labels[:, None], axis=1))

    np.testing.assert_allclose(dx.numpy(), jax.grad(ref)(logits), rtol=1e-5, atol=1e-7)
    graph = _gradient_graphs()[-1]
    shown = [str(n.cmd) for n in graph.nodes]
    fused = [s for s in shown if s.startswith("softmax_crossentropy.backward")]
    assert len(fused) == 1, graph
    assert not any("categorical" in s or s.startswith("softmax.") for s in shown), graph


@pytest.mark.parametrize("lazy", [False, True])
def test_second_derivative_of_cube(lazy: bool) -> None:
    dg = DynamicGraph(lazy=lazy)
    x0 = np.float32([1.5, -2.0, 0.25])
    x = dg.variable(x0, name="x")
    (dx,) = dg.backward((x * x * x).sum(), [x], create_graph=True)
    (dxx,) = dg.backward(dx.sum(), [x])
    np.testing.assert_allclose(dx.numpy(), jax.grad(lambda z: jnp.sum(z**3))(x0), rtol=1e-6)
    want = jax.grad(lambda z: jnp.sum(jax.grad(lambda u: jnp.sum(u**3))(z)))(x0)
    np.testing.assert_allclose(dxx.numpy(), want, rtol=1e-6)


def test_mixed_partial_of_two_variables() -> None:
    dg = DynamicGraph()
    x = dg.variable(np.float32([1.5]), name="x")
    y = dg.variable(np.float32([0.7]), name="y")
    f = x * x * dg.exec(ops.ewexp(), x * y) + y * y * y
    (dx,) = dg.backward(f.sum(), [x], create_graph=True)
    (dxy,) = dg.backward(dx.sum(), [y])

    def g(a, b):
        return a * a * jnp.exp(a * b) + b**3

    want = jax.grad(jax.grad(g, argnums=0), argnums=1)(1.5, 0.7)
    np.testing.assert_allclose(dxy.numpy(), [want], rtol=1e-5)
    with pytest.raises(GraphError, match="create_graph"):
        dg.backward(f.sum(), [x], create_graph=True, into=[dx])


@pytest.mark.parametrize("lazy", [False, True])
def test_create_graph_seed_variable_is_differentiated(lazy: bool) -> None:
    # df=v with create_graph: the gradient exp(x) * v depends on v, so d/dv of its sum
    # is exp(x) (jax.vjp's cotangent is differentiable); v was once taken as a constant
    x0, v0 = np.float32([0.5, 1.0, 2.0]), np.float32([1.0, 2.0, 3.0, 4.0])
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(x0, name="x")
    v = dg.variable(v0, name="v")
    (g,) = dg.backward(dg.exec(ops.ewexp(), x), [x], df=v[1:], create_graph=True)
    gv, gx = dg.backward((g * g).sum(), [v, x])

    def second(xs, vs):
        return jnp.sum(jax.vjp(jnp.exp, xs)[1](vs[1:])[0] ** 2)

    want_x, want_v = jax.grad(second, argnums=(0, 1))(x0, v0)
    np.testing.assert_allclose(g.numpy(), np.exp(x0) * v0[1:], rtol=1e-6)
    np.testing.assert_allclose(gv.numpy(), want_v, rtol=1e-5)
    np.testing.assert_allclose(gx.numpy(), want_x, rtol=1e-5)


def _model():
    from fnnc.models import Dense, Input, Model, ReLU

    x = Input()
    model = Model([x], [Dense(2, name="out")(ReLU()(Dense(4, name="hidden")(x)))])
    model.compile([np.zeros((8, 3), np.float32)])
    return model


def test_evaluate_cnnp_model_gradients_reach_its_parameters() -> None:
    model = _model()
    rng = np.random.default_rng(1)
    xs = rng.normal(size=(8, 3)).astype(np.float32)
    dg = DynamicGraph()
    out = dg.evaluate(model, [dg.constant(xs)])
    np.testing.assert_allclose(out.numpy(), np.asarray(model.evaluate(xs)), rtol=1e-5, atol=1e-6)
    assert dg.num_nodes == 1  # one call[graph] node
    params = dg.parameters(model)
    loss = (out * out).sum()
    grads = dg.backward(loss, list(params.values()))
    values = model.parameters()
    by_shape = {tuple(np.shape(values[p])): p for p in params}
    w0, b0, w1, b1 = (by_shape[s] for s in [(4, 3), (4,), (2, 4), (2,)])

    def ref(p):  # the model's forward in plain JAX
        h = jax.nn.relu(xs @ p[w0].T + p[b0][None])
        y = h @ p[w1].T + p[b1][None]
        return jnp.sum(y * y)

    want = jax.grad(ref)({p: values[p] for p in params})
    for pid, g in zip(params, grads):
        np.testing.assert_allclose(g.numpy(), want[pid], rtol=1e-5, atol=1e-6)


def test_minimize_trains_the_cnnp_model() -> None:
    model = _model()
    before = model.parameters()
    rng = np.random.default_rng(2)
    xs = rng.normal(size=(8, 3)).astype(np.float32)
    target = rng.normal(size=(8, 2)).astype(np.float32)
    dg = DynamicGraph()
    losses = []
    for _ in range(5):
        d = dg.evaluate(model, [dg.constant(xs)]) - dg.constant(target)
        loss = (d * d).sum()
        losses.append(float(loss.numpy().reshape(())))
        dg.minimize(optax.sgd(0.01), loss, list(dg.parameters(model).values()))
    assert losses[-1] < losses[0]
    after = model.parameters()
    assert any(not np.allclose(before[p], after[p]) for p in before)
    np.testing.assert_allclose(
        np.asarray(model.evaluate(xs)),
        dg.evaluate(model, [dg.constant(xs)]).numpy(),
        rtol=1e-5,
        atol=1e-6,
    )


def test_evaluate_cnnp_model_without_parameters() -> None:
    from fnnc.models import Input, Model, ReLU

    x = Input()
    model = Model([x], [ReLU()(x)])
    model.compile([np.zeros((2, 3), np.float32)])
    dg = DynamicGraph()
    v = dg.variable(np.float32([[1, -2, 3], [-1, 2, -3]]), name="v")
    (dv,) = dg.backward(dg.evaluate(model, [v]).sum(), [v])
    np.testing.assert_array_equal(dv.numpy(), np.float32([[1, 0, 1], [0, 1, 0]]))
    assert dg.parameters(model) == {}


def test_a_transformation_taking_a_list_keeps_its_state_per_variable_list() -> None:
    """``optax.masked`` with a list mask takes the parameters as the list it is given:
    its state is kept per ordered variable list, and it equals Optax on that list."""
    dg = DynamicGraph()
    a = dg.variable(np.float32([1.0, -2.0]), name="a")
    b = dg.variable(np.float32([3.0]), name="b")
    make = lambda: optax.masked(optax.adam(0.1), [True, False])
    want = [jnp.float32([1.0, -2.0]), jnp.float32([3.0])]
    tx = make()
    state = tx.init(want)
    for _ in range(3):
        dg.minimize(make(), (a * a).sum() + (b * b).sum(), [a, b])
        updates, state = tx.update([2 * w for w in want], state, want)
        want = optax.apply_updates(want, updates)
    np.testing.assert_allclose(a.numpy(), want[0], rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), want[1], rtol=1e-6)
    assert len(dg.opt_states) == 1 and not dg.optimizer_states(a)


def test_a_variable_listed_twice_steps_with_a_state_of_the_programs_layout() -> None:
    """``minimize(adam, f, [a] * 10 + [b] * 2)``: the state (kept per list, as variables
    appear twice) has the layout of the program's dict of twelve positions ("10" sorts
    before "2"), so every update reads moments of its own shape; the last write wins."""
    dg = DynamicGraph()
    a = dg.variable(np.float32([1.0, -2.0]), name="a")
    b = dg.variable(np.float32([0.5, 1.0, -1.5]), name="b")
    for _ in range(2):
        dg.minimize(optax.adam(0.1), (a * a).sum() + (b * b).sum(), [a] * 10 + [b] * 2)
    tx = optax.adam(0.1)
    for var, start in ((a, [1.0, -2.0]), (b, [0.5, 1.0, -1.5])):
        want = jnp.float32(start)
        state = tx.init(want)
        for _ in range(2):
            updates, state = tx.update(2 * want, state, want)
            want = optax.apply_updates(want, updates)
        np.testing.assert_allclose(var.numpy(), want, rtol=1e-6)


def test_a_dict_mask_gets_a_clear_error_and_a_list_or_callable_mask_steps() -> None:
    """The variables reach the optimizer as a list: ``mask={"w": ...}`` cannot match
    (a GraphError that says so, not a raw pytree error); a list in the variables' order
    or a callable steps as Optax does on that list."""
    w0, b0 = np.float32([[1.0, -2.0], [0.5, 3.0]]), np.float32([0.5, -1.0])

    def run(mask):
        dg = DynamicGraph()
        w, b = dg.variable(w0, name="w"), dg.variable(b0, name="b")
        for _ in range(2):
            dg.minimize(
                optax.adamw(0.1, weight_decay=0.5, mask=mask), (w * w).sum() + b.sum(), [w, b]
            )
        return w.numpy(), b.numpy()

    with pytest.raises(GraphError, match="as a list, in the order") as info:
        run({"w": True, "b": False})
    assert "float32[2, 2], float32[2]" in str(info.value)
    tx = optax.adamw(0.1, weight_decay=0.5, mask=[True, False])
    want = [jnp.asarray(w0), jnp.asarray(b0)]
    state = tx.init(want)
    for _ in range(2):
        updates, state = tx.update([2 * want[0], jnp.ones_like(want[1])], state, want)
        want = optax.apply_updates(want, updates)
    for got in (run([True, False]), run(lambda ps: jax.tree.map(lambda p: p.ndim > 1, ps))):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
