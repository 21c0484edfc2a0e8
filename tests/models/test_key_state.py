"""Optax transformations that keep a typed PRNG key in their state (``noisy_sgd``,
``add_noise``): fnnc carries the key's bits (:func:`fnnc.ops.optimizer.keys_as_bits`),
so a run adds the same noise as plain Optax, through the graph pass, a checkpoint and a
resume."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import CommandError
from fnnc.graph import GraphBuilder, interpret
from fnnc.graph.passes.minimize import minimize
from fnnc.io import Checkpoints
from fnnc.models import Dense, Input, Model
from fnnc.ops.optimizer import keys_as_bits, optax_update_command
from tests.helpers import assert_close

RNG = np.random.default_rng(5)
X = RNG.standard_normal((6, 3)).astype(np.float32)
Y = RNG.standard_normal((6, 2)).astype(np.float32)


def _noisy():
    return optax.chain(optax.add_noise(0.3, 0.55, key=11), optax.sgd(0.1, momentum=0.9))


def _model() -> Model:
    x = Input()
    model = Model(x, Dense(2, name="fc")(x))
    model.compile(X, loss="mse", minimizer=_noisy())
    return model


def test_wrapped_state_holds_bits_and_the_wrapper_is_kept_per_object():
    """The state holds uint32 key data; one object always gets the same wrapper;
    a transformation without a key comes back as it is."""
    tx = _noisy()
    wrapped = keys_as_bits(tx)
    assert keys_as_bits(tx) is wrapped
    dtypes = {str(x.dtype) for x in jax.tree.leaves(wrapped.init([jnp.ones(3)]))}
    assert "uint32" in dtypes and not any("key" in d for d in dtypes)
    plain = optax.adam(0.1)
    assert keys_as_bits(plain) is plain


def test_graph_minimize_pass_steps_with_optax_noise():
    """fnnc.graph.passes.minimize with add_noise: three interpreted steps equal Optax's."""
    b = GraphBuilder()
    w = b.input((3,), name="w")
    loss = b.exec(ops.reduce_sum(axes=(0,)), b.exec(ops.ewprod(), w, w))
    step, layout = minimize(b.build([loss]), loss, [w], _noisy())
    value = np.array([1.0, -2.0, 0.5], np.float32)
    state = layout.init([value])
    tx, want = _noisy(), jnp.asarray(value)
    oracle = tx.init([want])
    for _ in range(3):
        (value,), state, _ = layout.split(interpret(step, value, *state))
        updates, oracle = tx.update([2 * want], oracle, [want])
        want = optax.apply_updates([want], updates)[0]
    assert_close(value, want, rtol=1e-6, atol=1e-6)


def test_checkpoint_resume_continues_the_same_noise(tmp_path):
    """Two fits, a checkpoint, a fresh model restored, one more fit: equal to three fits
    in one run (the key's bits are saved and restored with the optimizer state)."""
    straight = _model()
    start = {k: np.asarray(v) for k, v in straight.parameters().items()}
    for _ in range(3):
        straight.fit(X, Y)
    first = _model()
    first.set_parameters(start)
    for _ in range(2):
        first.fit(X, Y)
    with Checkpoints(tmp_path / "run.ckpt") as ckpt:
        ckpt.save(2, first)
        resumed = _model()
        resumed.set_parameters({k: v + 1 for k, v in start.items()})  # overwritten
        ckpt.restore_into(resumed)
    resumed.fit(X, Y)
    assert_close(resumed.parameters(), straight.parameters(), rtol=1e-6, atol=1e-6)


def test_a_key_state_the_probe_cannot_see_is_refused_clearly():
    """A transformation whose init the probe cannot run keeps its typed key: the update
    command names the key's path and says what to do."""
    inner = optax.noisy_sgd(0.1, key=0)

    def init(params):
        if not isinstance(params, tuple):
            raise TypeError("wants a tuple")
        return inner.init(params)

    odd = optax.GradientTransformation(init, inner.update)
    assert keys_as_bits(odd) is odd
    with pytest.raises(CommandError, match=r"PRNG key in its state \(at .*rng_key.*keys_as_bits"):
        optax_update_command(
            optax.GradientTransformation(lambda p: inner.init(p), inner.update),
            [jax.ShapeDtypeStruct((2,), np.float32)],
        )
