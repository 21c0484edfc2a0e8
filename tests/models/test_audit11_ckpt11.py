"""Audit 11 (checkpoints area): restoring a model's checkpoint gives the run it saved.

The oracle is the uninterrupted run: a model that steps from the saved step on, never
having stepped elsewhere."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc.errors import CheckpointError
from fnnc.io import Checkpoints, ShardedCheckpoints
from fnnc.models import BatchNorm, Dense, Input, Model

RNG = np.random.default_rng(0)
X = RNG.standard_normal((8, 3)).astype(np.float32)
Y = RNG.standard_normal((8, 2)).astype(np.float32)


def _model() -> Model:
    x = Input()
    model = Model(x, Dense(2, name="fc")(x))
    model.compile(X, loss="mse", minimizer=optax.adam(0.1), seed=0)
    return model


@pytest.mark.parametrize("kind,name", [(Checkpoints, "run.ckpt"), (ShardedCheckpoints, "run.dir")])
def test_a_step_saved_before_any_update_rewinds_the_optimizer_state_too(tmp_path, kind, name):
    """Step 0 is saved before the first update (no Adam state yet). Restored into a
    model that has stepped since, the model kept its own Adam moments and count 3, so
    the next steps differed from the run's; the restored model now starts Adam afresh,
    as the run did."""
    run = _model()
    with kind(tmp_path / name) as ckpt:
        ckpt.save(0, run)
    for _ in range(2):
        run.fit(X, Y)
    rewound = _model()
    for _ in range(3):
        rewound.fit(X, Y)
    with kind(tmp_path / name) as ckpt:
        ckpt.restore_into(rewound, 0)
    for _ in range(2):
        rewound.fit(X, Y)
    for pid, want in run.parameters().items():
        np.testing.assert_array_equal(np.asarray(rewound.parameters()[pid]), np.asarray(want))


def test_a_sharded_checkpoint_of_another_model_names_the_class_that_reads_it(tmp_path):
    """The error of a sharded step restored into another model told to copy what fits
    with Checkpoints(path).restore(), which cannot open a directory; it names
    ShardedCheckpoints, and that remedy works."""
    path = tmp_path / "run.dir"
    with ShardedCheckpoints(path) as ckpt:
        ckpt.save(1, _model())
    x = Input()
    other = Model(x, Dense(2, name="fc")(Dense(2, name="more")(x)))
    other.compile(X, loss="mse", minimizer=optax.adam(0.1))
    with pytest.raises(CheckpointError, match=r"missing[\s\S]*ShardedCheckpoints\(path\)"):
        ShardedCheckpoints(path).restore_into(other)
    with ShardedCheckpoints(path) as ckpt:
        saved = ckpt.restore().state
        assert "t-fc-0-0" in other.set_parameters(saved, strict=False)  # the misshaped one
    np.testing.assert_array_equal(other.parameters()["t-fc-0-1"], np.asarray(saved["t-fc-0-1"]))


def test_a_checkpoint_step_reads_as_a_named_model_internals_included(tmp_path):
    """The journal's doc says ccv_cnnp_model_read(handle, "ckpt-<step>") reads a step;
    NNC (and Model.read) look internals up as __ckpt-<step>__[<id>(0)], but they were
    saved as __ckpt-<step>__[<id>], so the read missed the batch-norm statistics."""
    x = Input()
    run = Model(x, BatchNorm(name="bn")(Dense(2, name="fc")(x)))
    run.compile(X, loss="mse", minimizer=optax.adam(0.1))
    run.fit(X, Y)
    path = tmp_path / "run.ckpt"
    with Checkpoints(path) as ckpt:
        ckpt.save(1, run)
    x = Input()
    other = Model(x, BatchNorm(name="bn")(Dense(2, name="fc")(x)))
    other.compile(X, loss="mse", minimizer=optax.adam(0.1))
    assert other.read(path, name="ckpt-1") == []
    with Checkpoints(path) as ckpt:
        restored = ckpt.restore(1).state
    for pid, want in run.parameters().items():
        np.testing.assert_array_equal(np.asarray(other.parameters()[pid]), np.asarray(want))
        np.testing.assert_array_equal(np.asarray(restored[pid]), np.asarray(want))


def test_a_float32_step_restored_into_a_float16_model_starts_its_loss_scale_afresh(tmp_path):
    """A float32 run saves no loss scale; restored into a float16 model that had stepped,
    the model kept its own scale state (good_steps 2), unlike the same step restored into
    a fresh float16 model (the oracle): it now starts from the policy's initial state."""
    from fnnc.models import loss_scale

    path = tmp_path / "run.ckpt"
    with Checkpoints(path) as ckpt:
        ckpt.save(1, _model())

    def half() -> Model:
        x = Input()
        model = Model(x, Dense(2, name="fc")(x))
        model.compile(X, loss="mse", minimizer=optax.adam(0.1), seed=0, precision="float16")
        return model

    stepped, fresh = half(), half()
    for _ in range(2):
        stepped.fit(X, Y)
    assert loss_scale.visible(stepped.engine).good_steps == 2
    with Checkpoints(path) as ckpt:
        ckpt.restore_into(stepped)
        ckpt.restore_into(fresh)
    assert loss_scale.visible(stepped.engine) == loss_scale.visible(fresh.engine)
    assert loss_scale.visible(stepped.engine).good_steps == 0
