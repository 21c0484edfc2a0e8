"""A cnnp model's minimizer is one Optax transformation over the parameter dict.

The oracle is plain Optax applied to ``{parameter id: array}`` with ``jax.grad`` of the
same loss; per-parameter ``set_minimizer`` overrides against ``optax.multi_transform``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.errors import CheckpointError, ModelError
from fnnc.io import Checkpoints
from fnnc.models import Dense, Input, Model, ReLU, minimizers
from tests.helpers import assert_close, rand

XS, TS = rand([6, 3]), rand([6, 2], seed=1)
HEAD = ["t-out-0-0", "t-out-0-1"]


def _mlp(minimizer):
    x = Input()
    model = Model(x, Dense(2, name="out")(ReLU()(Dense(5, name="h")(x))))
    model.compile(XS, loss="mse", minimizer=minimizer)
    return model


def _loss(p, x, t):
    h = jax.nn.relu(x @ p["t-h-0-0"].T + p["t-h-0-1"][None])
    return jnp.mean((h @ p["t-out-0-0"].T + p["t-out-0-1"][None] - t) ** 2)


_grad = jax.jit(jax.grad(_loss))


def _params(model):
    return {k: jnp.asarray(v) for k, v in model.parameters().items()}


def _oracle(opt, p, steps, state=None):
    """``steps`` steps of plain Optax ``opt`` on the parameter dict ``p``."""
    state = opt.init(p) if state is None else state
    update = jax.jit(opt.update)  # one compile: op by op, each operation compiles alone
    for _ in range(steps):
        updates, state = update(_grad(p, XS, TS), state, p)
        p = optax.apply_updates(p, updates)
    return p, state


def _clipped_sgd(learning_rate):
    return optax.chain(optax.clip_by_global_norm(0.05), optax.sgd(learning_rate, momentum=0.9))


def test_global_norm_clip_and_adamw_schedule_equal_optax_on_the_dict():
    schedule = optax.warmup_cosine_decay_schedule(0.0, 0.05, warmup_steps=2, decay_steps=5)

    def make():
        clip = optax.clip_by_global_norm(0.05)
        return optax.chain(clip, optax.adamw(schedule, weight_decay=0.1))

    model = _mlp(make())
    p0 = _params(model)
    assert float(optax.tree.norm(_grad(p0, XS, TS))) > 0.05  # the clip acts
    for _ in range(5):
        model.fit(XS, TS)
    want, state = _oracle(make(), p0, 5)
    assert_close(model.parameters(), want, rtol=1e-6, atol=1e-6)
    out = model.evaluate(XS, requires_grad=True)  # NNC's backward + apply: the same step
    model.backward([2 * (np.asarray(out) - TS) / TS.size], outgrad=False)
    model.apply_gradients()
    assert_close(model.parameters(), _oracle(make(), want, 1, state)[0], rtol=1e-6, atol=1e-6)


def test_multisteps_accumulates_the_dict_and_steps_every_k():
    def make(rate=0.5):
        return optax.MultiSteps(_clipped_sgd(rate), every_k_schedule=2)

    model = _mlp(make())
    p0 = _params(model)
    for _ in range(5):
        model.fit(XS, TS)
    want, state = _oracle(make(), p0, 5)
    assert_close(model.parameters(), want, rtol=1e-6, atol=1e-6)
    (seen,) = model.engine.optimizer_state("t-out-0-0").values()
    assert int(seen.mini_step) == int(state.mini_step) == 1
    assert int(seen.gradient_step) == int(state.gradient_step) == 2
    assert list(seen.acc_grads) == ["t-out-0-0"]  # the parameter's own accumulator
    assert_close(seen.acc_grads["t-out-0-0"], state.acc_grads["t-out-0-0"], 1e-6, 1e-7)
    model.set_minimizer(make(0.1))  # a new rate: the same program, the state carries over
    for _ in range(3):
        model.fit(XS, TS)
    assert_close(model.parameters(), _oracle(make(0.1), want, 3, state)[0], 1e-6, 1e-6)
    assert len([k for k in model.engine._programs if k[0] == "fit"]) == 1


def test_inject_hyperparams_a_new_rate_takes_effect_compiles_nothing_keeps_state():
    model = _mlp(optax.inject_hyperparams(_clipped_sgd)(learning_rate=0.5))
    p = _params(model)
    opt = optax.inject_hyperparams(_clipped_sgd)(learning_rate=0.5)
    state = opt.init(p)
    for rate in (0.5, 0.1, 0.02):
        model.set_minimizer(optax.inject_hyperparams(_clipped_sgd)(learning_rate=rate))
        state.hyperparams["learning_rate"] = jnp.asarray(rate)  # Optax's way to change it
        for _ in range(2):
            model.fit(XS, TS)
        p, state = _oracle(opt, p, 2, state)
        assert_close(model.parameters(), p, rtol=1e-6, atol=1e-6, what=f"rate {rate}")
    assert len([k for k in model.engine._programs if k[0] == "fit"]) == 1
    (seen,) = model.engine.optimizer_state("t-h-0-1").values()
    assert int(seen.count) == 6 and seen.hyperparams["learning_rate"] == np.float32(0.02)


def test_a_per_parameter_override_is_a_partition_updated_as_a_whole():
    body = minimizers.sgd(0.1, momentum=0.9)  # NNC's rule, per element
    head = optax.chain(optax.clip_by_global_norm(0.02), minimizers.adam(0.05))
    model = _mlp(body)
    model.set_minimizer(head, params=HEAD)
    p0 = _params(model)
    g = _grad(p0, XS, TS)
    assert float(optax.tree.norm({k: g[k] for k in HEAD})) > 0.02  # the head's clip acts
    for _ in range(3):
        model.fit(XS, TS)
    labels = {k: "head" if k in HEAD else "body" for k in p0}
    want, _ = _oracle(optax.multi_transform({"body": body, "head": head}, labels), p0, 3)
    assert_close(model.parameters(), want, rtol=1e-6, atol=1e-6)
    # NNC's per-parameter semantics: the body's SGD updates each parameter by its own rule
    alone = {k: minimizers.sgd(0.1, momentum=0.9) for k in p0 if k not in HEAD}
    nnc = optax.multi_transform({**alone, "head": head}, {**labels, **{k: k for k in alone}})
    assert_close(model.parameters(), _oracle(nnc, p0, 3)[0], rtol=1e-6, atol=1e-6)


def _accumulated_adam():
    inner = optax.inject_hyperparams(optax.adam)(learning_rate=0.05)
    return optax.MultiSteps(optax.chain(optax.clip_by_global_norm(0.05), inner), 2)


def test_checkpoint_of_the_whole_tree_state_round_trips_and_resume_is_exact(tmp_path):
    a = _mlp(_accumulated_adam())
    for _ in range(3):  # stops between two accumulated gradients
        a.fit(XS, TS)
    with Checkpoints(tmp_path / "run.ckpt") as ckpt:
        ckpt.save(3, a)
        rows = {r.removeprefix("__ckpt-3__[").removesuffix("]") for r in ckpt.file.names()}
        b = _mlp(_accumulated_adam())
        ckpt.restore_into(b)
    for pid in ("t-h-0-0", "t-out-0-1"):  # every parameter's rows are a whole state
        assert {f"{pid}/mini_step", f"{pid}/gradient_step", f"{pid}/acc_grads"} <= rows
        assert f"{pid}/inner_opt_state/hyperparams/learning_rate" in rows
        assert f"{pid}/inner_opt_state/inner_state/mu" in rows
        assert jax.tree.all(
            jax.tree.map(
                np.array_equal,
                a.engine.optimizer_state(pid),
                b.engine.optimizer_state(pid),
            )
        )
    for _ in range(3):
        a.fit(XS, TS)
        b.fit(XS, TS)
    for k, v in a.parameters().items():
        np.testing.assert_array_equal(b.parameters()[k], v, err_msg=k)


def test_restoring_shared_state_that_differs_within_a_partition_names_it(tmp_path):
    a = _mlp(optax.adam(0.05))
    a.set_minimizer(minimizers.noop(), params=HEAD)  # the body alone counts two steps
    a.fit(XS, TS)
    a.fit(XS, TS)
    head = optax.adam(0.05)
    a.set_minimizer(head, params=HEAD)  # a partition of its own, its own count
    a.fit(XS, TS)
    with Checkpoints(tmp_path / "run.ckpt") as ckpt:
        ckpt.save(1, a)
        b = _mlp(optax.adam(0.05))  # one partition: which count would it take?
        with pytest.raises(CheckpointError, match=r"(?s)share one minimizer.*count.*params="):
            ckpt.restore_into(b)
        b.set_minimizer(optax.adam(0.05), params=HEAD)  # the partitions it was saved with
        ckpt.restore_into(b)
    (seen,) = b.engine.optimizer_state("t-out-0-0").values()
    assert int(seen[0].count) == 1
    (seen,) = b.engine.optimizer_state("t-h-0-0").values()
    assert int(seen[0].count) == 3


def test_a_mask_that_is_not_a_tree_of_the_parameter_dict_names_the_ids():
    model = _mlp(optax.masked(optax.sgd(0.1), {"w": True, "b": False}))
    with pytest.raises(ModelError, match=r"(?s)\['t-h-0-0', .*keyed by these ids"):
        model.fit(XS, TS)


@pytest.mark.parametrize("k", [2, 3])
def test_k_accumulated_batches_with_scale_one_over_k_are_one_step_on_the_k_times_batch(k):
    """fit's loss is the batch mean: scale=1/k averages the k means (as documented in
    fnnc.models.minimizers' with_gradient_accumulation; 1/(batch_size*k) would divide
    the rate by the batch size too)."""
    xs, ts = rand([4 * k, 3], seed=2), rand([4 * k, 2], seed=3)
    model = _mlp(minimizers.with_gradient_accumulation(minimizers.sgd(0.1, scale=1 / k), k))
    p0 = _params(model)
    for i in range(k):  # k batches of 4
        model.fit(xs[4 * i : 4 * (i + 1)], ts[4 * i : 4 * (i + 1)])
    tx = optax.sgd(0.1)  # one plain Optax step on the batch of 4 * k
    updates, _ = tx.update(_grad(p0, xs, ts), tx.init(p0), p0)
    assert_close(model.parameters(), optax.apply_updates(p0, updates), rtol=1e-5, atol=1e-6)
