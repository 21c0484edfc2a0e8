"""Audit 9 (left-alone defects): a restore that fails on a damaged ``fnnc.train`` entry
leaves the model exactly as it was."""

from __future__ import annotations

import copy

import jax
import numpy as np
import optax
import pytest

from fnnc.errors import CheckpointError
from fnnc.io import Checkpoints
from fnnc.models import Dense, Input, Model
from fnnc.models.batches import progress

X, Y = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)
BAD = {2: [1.0, 2**40], 3: "abc", 4: [[1.0, 2.0], 3], 5: [-1.0, 1], 6: [1.0, True]}


def _mlp() -> Model:
    x = Input()
    model = Model(x, Dense(2, name="fc")(x))
    model.compile(X, loss="mse", minimizer=optax.adam(0.1), precision="float16")
    return model


def _snapshot(model: Model):
    engine = model.engine
    host = lambda tree: jax.tree.map(np.asarray, tree)
    return (
        host(dict(model.parameters())),
        host({p: engine.optimizer_state(p) for p in engine.infos}),
        tuple(model.loss_scale),
        progress(model).to_json(),
        np.asarray(jax.random.key_data(engine.key)),
    )


def _same(a, b) -> bool:
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Step 1: a float16 model after one step; steps 2-6: its arrays with a damaged
    loss_scale entry in ``fnnc.train``; a second model trained three steps."""
    source = _mlp()
    source.fit(X, Y)
    ckpt = Checkpoints(tmp_path_factory.mktemp("ckpt") / "run.ckpt")
    ckpt.save(1, source)
    good = ckpt.restore(1)
    for step, entry in BAD.items():
        meta = copy.deepcopy(good.metadata)
        meta["fnnc.train"]["loss_scale"] = entry
        ckpt.save(step, good.state, good.optimizer_state, metadata=meta)
    target = _mlp()
    for _ in range(3):
        target.fit(X, Y)
    return ckpt, source, target


@pytest.mark.parametrize("step", sorted(BAD))
def test_a_damaged_loss_scale_entry_leaves_the_model_as_it_was(saved, step):
    """The parameters and optimizer state were set before the loss scale was read, so
    [1.0, 2**40] raised a bare OverflowError and "abc" a CheckpointError on a model
    holding step 1's parameters and step 3's scale; [[1, 2], 3] and [-1.0, 1] were taken
    as scales. Oracle: the model's own state before the call."""
    ckpt, _, target = saved
    target.fit(X, Y)  # a state of its own, whatever the cases before did
    before = _snapshot(target)
    with pytest.raises(CheckpointError, match=rf"step {step} .*loss_scale is .*expected \[scale"):
        ckpt.restore_into(target, step)
    assert _same(_snapshot(target), before)


def test_the_undamaged_step_still_restores_everything(saved):
    """The control: step 1 restores into the same model (oracle: the model that saved
    it), so the comparisons above would see a change."""
    ckpt, source, target = saved
    ckpt.restore_into(target, 1)
    assert _same(_snapshot(target), _snapshot(source))
