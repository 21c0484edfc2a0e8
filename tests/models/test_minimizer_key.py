"""Minimizers keyed by structure: a new learning rate is an input value, not a new program."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.graph import DynamicGraph
from fnnc.graph.dynamic.minimizer_key import split
from fnnc.models import Dense, Input, Model, minimizers
from fnnc.models.optim import Minimizers
from tests.helpers import assert_close, rand


def _flagged(decay):
    """A transformation whose ``decay`` decides Python control flow (``if decay:``)."""
    sgd = optax.sgd(0.1)

    def update(grads, state, params=None):
        updates, state = sgd.update(grads, state, params)
        if decay:
            updates = jax.tree.map(lambda u, p: u - decay * p, updates, params)
        return updates, state

    return optax.GradientTransformation(sgd.init, update)


def test_numbers_that_trace_are_inputs_and_the_others_stay_in_the_key():
    adam = optax.adam(1e-3)
    a, b = split(adam), split(optax.adam(1e-4))
    assert a.key == b.key and a.values != b.values
    assert split(adam) is a  # cached per object
    assert split(optax.sgd(1e-3)).key != a.key
    # optax computes 1 - b1 in Python (double precision, rounded once): a float32 input
    # would round twice and change Adam's numbers, so b1 stays a constant of the key
    assert split(optax.adam(1e-3, b1=0.8)).key != a.key
    # NNC's Adam takes a traced decay (optax.inject_hyperparams), as NNC's kernel adds
    # decay * a whatever decay is: the rate and decay are inputs
    n1 = split(minimizers.adam(1e-3, decay=0.1))
    assert n1.key == split(minimizers.adam(5e-2, decay=0.1)).key
    n2 = split(minimizers.adam(1e-3, decay=0.2))
    decay = float(np.float32(0.2))  # NNC's hyper-parameters are C floats
    assert n1.key == n2.key and decay in n2.values and decay not in n1.values
    # a float that decides Python control flow stays a constant
    assert (
        n1.key != split(_flagged(1.0)).key and split(_flagged(1.0)).key != split(_flagged(0.0)).key
    )
    # a schedule's numbers are inputs as well
    s1 = split(optax.adam(optax.exponential_decay(1e-3, 10, 0.5)))
    assert s1.key == split(optax.adam(optax.exponential_decay(2e-3, 10, 0.25))).key


def test_the_rebuilt_update_is_the_update_of_the_object_that_gave_the_numbers():
    params = [jnp.asarray(rand([3])), jnp.asarray(rand([2, 2], seed=1))]
    grads = [jnp.asarray(rand([3], seed=2)), jnp.asarray(rand([2, 2], seed=3))]
    adam = optax.adam(1e-3)
    template = Minimizers.of(["a", "b"], [adam] * 2)
    new = optax.adam(3e-2, eps=1e-6)
    fed = Minimizers.of(["a", "b"], [new] * 2)
    assert fed.key == template.key and fed.n_hyper == template.n_hyper
    tx = template.transform()
    tree = lambda xs: dict(zip("ab", xs))
    inner = new.init(tree(params))
    step = jax.jit(tx.update)
    updates, ((state,), hyper) = step(grads, ((inner,), tuple(fed.hyper_leaves())), params)
    want, want_state = jax.jit(new.update)(tree(grads), inner, tree(params))
    assert_close(updates, [want["a"], want["b"]], rtol=1e-6, atol=1e-7)
    assert_close(jax.tree.leaves(state), jax.tree.leaves(want_state), rtol=1e-6, atol=1e-7)
    assert_close(list(hyper), fed.hyper_leaves())


def _oracle_grad(p, x, t):
    def loss(p):
        return jnp.mean((x @ p["t-d-0-0"].T + p["t-d-0-1"][None] - t) ** 2)

    return jax.grad(loss)(p)


def test_a_new_rate_compiles_nothing_keeps_the_moments_and_takes_effect():
    x = Input()
    model = Model(x, Dense(2, name="d")(x))
    xs, ts = rand([4, 3]), rand([4, 2], seed=1)
    model.compile(xs, loss="mse", minimizer=optax.adam(1e-1))
    p = {k: jnp.asarray(v) for k, v in model.parameters().items()}
    opt_state = {k: optax.adam(1e-1).init(v) for k, v in p.items()}

    @jax.jit  # plain optax; the rate is an argument so that one compile serves every rate
    def oracle_step(p, opt_state, rate):
        grads = _oracle_grad(p, xs, ts)
        new_p, new_s = {}, {}
        for k in p:  # per parameter, as the engine applies minimizers
            u, new_s[k] = optax.adam(rate).update(grads[k], opt_state[k], p[k])
            new_p[k] = optax.apply_updates(p[k], u)
        return new_p, new_s

    def programs(kind):
        return [k for k in model.engine._programs if k[0] == kind]

    for rate in (1e-1, 1e-2, 3e-3):  # the step after each set_minimizer uses its rate
        model.set_minimizer(optax.adam(rate))
        model.fit(xs, ts)
        p, opt_state = oracle_step(p, opt_state, rate)
        assert_close(model.parameters(), p, rtol=1e-6, atol=1e-7)
    assert len(programs("fit")) == 1
    # apply_gradients is keyed the same way
    for rate in (1e-2, 5e-2):
        model.set_minimizer(optax.adam(rate))
        out = model.evaluate(xs, requires_grad=True)
        model.backward([2 * (np.asarray(out) - ts) / ts.size], outgrad=False)
        model.apply_gradients()
        p, opt_state = oracle_step(p, opt_state, rate)
        assert_close(model.parameters(), p, rtol=1e-6, atol=1e-7)
    assert len(programs("apply")) == 1


def test_a_schedule_that_rewrites_its_closure_trains_as_plain_optax():
    """Optax's cosine schedule turns its int ``decay_steps`` into a float on its first
    call; the walk must count the floats of its steady state."""
    x = Input()
    model = Model(x, Dense(2, name="d")(x))
    xs, ts = rand([4, 3]), rand([4, 2], seed=1)
    make = lambda: optax.adam(optax.cosine_decay_schedule(0.05, decay_steps=4))
    model.compile(xs, loss="mse", minimizer=make())
    p = {k: jnp.asarray(v) for k, v in model.parameters().items()}
    opt = make()
    state = {k: opt.init(v) for k, v in p.items()}
    for _ in range(3):
        model.fit(xs, ts)
        grads = jax.jit(_oracle_grad)(p, xs, ts)
        for k in p:
            u, state[k] = opt.update(grads[k], state[k], p[k])
            p[k] = optax.apply_updates(p[k], u)
    assert_close(model.parameters(), p, rtol=1e-6, atol=1e-7)


LOW_PRECISION = [
    ("clip+sgd", lambda: optax.chain(optax.clip_by_global_norm(0.5), optax.sgd(0.1))),
    ("adam", lambda: optax.adam(1e-2)),
    ("sgd-momentum", lambda: optax.sgd(0.1, momentum=0.9)),
    ("adamw", lambda: optax.adamw(1e-2, weight_decay=0.1)),
]


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("make", [m for _, m in LOW_PRECISION], ids=[n for n, _ in LOW_PRECISION])
def test_hyper_parameter_inputs_act_as_python_floats_on_half_parameters(make, dtype):
    """The rate, eps, max_norm fed as program inputs mix with float16/bfloat16 data as
    the Python floats they replace do: the update is Optax's own (clip_by_global_norm's
    ``jnp.where(norm < max_norm, ...)`` raised a dtype error with float32 inputs)."""
    params = [jnp.asarray(rand([3]), dtype), jnp.asarray(rand([2, 2], seed=1), dtype)]
    grads = [jnp.asarray(4 * rand([3], seed=2), dtype), jnp.asarray(rand([2, 2], seed=3), dtype)]
    tx = make()
    mins = Minimizers.of(["a", "b"], [tx] * 2)
    tree = lambda xs: dict(zip("ab", xs))
    state, want_state = mins.transform().init(params), tx.init(tree(params))
    step, oracle = jax.jit(mins.transform().update), jax.jit(tx.update)
    # one rounding on CPU; XLA:GPU fuses each program its own way (the H200 run of
    # 2026-11-28: adamw f16 off by 1.7 ulp), so each of the update's few half-precision
    # operations may round once more or less there
    ulp = float(jnp.finfo(dtype).eps) * (1 if jax.default_backend() == "cpu" else 4)
    for _ in range(3):
        updates, state = step(grads, state, params)
        want, want_state = oracle(tree(grads), want_state, tree(params))
        assert [u.dtype for u in updates] == [dtype, dtype]
        for got, w in zip(updates, [want["a"], want["b"]]):  # XLA may fuse away a rounding
            np.testing.assert_allclose(
                np.asarray(got, np.float32), np.asarray(w, np.float32), rtol=ulp
            )
        params = [p + u for p, u in zip(params, updates)]
    assert_close(jax.tree.leaves(state[0]), jax.tree.leaves(want_state), rtol=ulp, atol=0)


@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16], ids=["f16", "bf16"])
def test_clip_by_global_norm_fits_a_half_precision_model(dtype):
    x = Input(dtype=dtype)
    model = Model(x, Dense(2, name="d")(x))
    xs, ts = (5 * rand([4, 3])).astype(dtype), np.zeros((4, 2), dtype)
    model.compile(
        xs, loss="mse", minimizer=optax.chain(optax.clip_by_global_norm(0.5), optax.sgd(0.1))
    )
    before = model.parameters()
    model.fit(xs, ts)
    after = model.parameters()
    assert all(v.dtype == dtype for v in after.values())
    # the gradient's norm is far above 0.5: the step is 0.1 * 0.5 long (closed form),
    # up to the rounding of each stored parameter to its 16-bit type (half its spacing)
    moved = np.sqrt(
        sum(
            np.sum((np.asarray(after[k], np.float64) - np.asarray(before[k], np.float64)) ** 2)
            for k in after
        )
    )
    rounding = np.sqrt(
        sum(np.sum((np.spacing(np.abs(np.asarray(after[k]))).astype(np.float64) / 2) ** 2)
            for k in after)
    )  # fmt: skip
    assert abs(moved - 0.05) <= 2e-2 * 0.05 + rounding, (moved, rounding)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=["f16", "bf16"])
def test_dynamic_graph_clips_half_precision_variables(dtype):
    dg = DynamicGraph()
    w = dg.variable(jnp.asarray([3.0, 4.0], dtype), name="w")
    dg.minimize(optax.chain(optax.clip_by_global_norm(0.5), optax.sgd(0.1)), (w * w).sum(), [w])
    # the gradient (6, 8) has norm 10: clipped to (0.3, 0.4), then a step of 0.1 of it
    assert w.numpy().dtype == dtype
    np.testing.assert_allclose(np.asarray(w.numpy(), np.float32), [2.97, 3.96], rtol=4e-3)
