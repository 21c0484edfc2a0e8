"""Audit 8 (checkpoints area): a re-save of a sharded step never leaves no step.

The oracle is the array first saved at the step: after a re-save that fails (an Orbax
error, a full disk, a failed rename) or is killed at any point, the step restores
bitwise as that array (or, once the swap happened, as the new one)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from fnnc.errors import CheckpointError
from fnnc.io import ShardedCheckpoints, dir_swap
from fnnc.io.sharded_checkpoints import STAGING
from tests.helpers import subprocess_env

OLD, NEW = np.arange(6, dtype=np.float32), -np.arange(6, dtype=np.float32)


def _saved(path):
    ckpt = ShardedCheckpoints(path)
    ckpt.save(1, {"w": jnp.ones(2)})
    ckpt.save(2, {"w": jnp.asarray(OLD)}, metadata={"v": "old"})
    return ckpt


def _check(path, want, meta):
    with ShardedCheckpoints(path) as ckpt:
        assert ckpt.steps() == [1, 2]
        got = ckpt.restore(2)
        np.testing.assert_array_equal(np.asarray(got.state["w"]), want)
        assert got.metadata == {"v": meta}


def test_an_orbax_failure_in_a_resave_keeps_the_old_step(tmp_path, monkeypatch):
    path = tmp_path / "run"
    ckpt = _saved(path)
    save = ocp.CheckpointManager.save

    def full_disk(self, *args, **kwargs):
        if STAGING in str(self.directory):
            raise OSError(28, "No space left on device")
        return save(self, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", full_disk)
    with pytest.raises(CheckpointError, match=r"step 2 .*cannot be saved.*No space left"):
        ckpt.save(2, {"w": jnp.asarray(NEW)}, metadata={"v": "new"})
    assert sorted(os.listdir(path)) == ["1", "2"]  # no staging directory left
    _check(path, OLD, "old")
    monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    ckpt.save(2, {"w": jnp.asarray(NEW)}, metadata={"v": "new"})  # then it replaces it
    ckpt.close()
    _check(path, NEW, "new")


def test_a_failed_rename_without_exchange_puts_the_old_step_back(tmp_path, monkeypatch):
    path = tmp_path / "run"
    ckpt = _saved(path)
    monkeypatch.setattr(dir_swap, "exchange", lambda a, b: False)
    rename, calls = os.rename, []

    def second_fails(a, b):
        calls.append((a, b))
        if len(calls) == 2:
            raise OSError(5, "Input/output error")
        rename(a, b)

    monkeypatch.setattr(os, "rename", second_fails)
    with pytest.raises(CheckpointError, match="Input/output error"):
        ckpt.save(2, {"w": jnp.asarray(NEW)}, metadata={"v": "new"})
    monkeypatch.setattr(os, "rename", rename)
    ckpt.close()
    _check(path, OLD, "old")


KILLED = textwrap.dedent(
    """
    import os, signal, sys
    import jax.numpy as jnp, numpy as np, orbax.checkpoint as ocp
    from fnnc.io import ShardedCheckpoints, dir_swap
    path, mode = sys.argv[1], sys.argv[2]
    die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    if mode == "writing":  # Orbax has begun the staged step: its temporary folder exists
        def save(self, step, **kw):
            os.makedirs(os.path.join(str(self.directory), f"{step}.orbax-checkpoint-tmp-1"))
            die()
        ocp.CheckpointManager.save = save
    elif mode == "staged":  # the new step is complete, the swap not begun
        dir_swap.swap_in = die
    else:  # between the two renames of a system without an atomic exchange
        dir_swap.exchange = lambda a, b: False
        rename, calls = os.rename, []
        def second(a, b):
            calls.append(a)
            die() if len(calls) == 2 else rename(a, b)
        os.rename = second
    new = {"w": -jnp.arange(6, dtype=jnp.float32)}
    ShardedCheckpoints(path).save(2, new, metadata={"v": "new"})
    """
)


@pytest.mark.parametrize("mode", ["writing", "staged", "renaming"])
def test_a_resave_killed_at_any_point_leaves_the_old_step(tmp_path, mode):
    path = tmp_path / "run"
    _saved(path).close()
    done = subprocess.run(
        [sys.executable, "-c", KILLED, str(path), mode],
        env=subprocess_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == -9, done.stderr[-3000:]
    if mode != "renaming":  # the old step was never moved: readers see it at once
        _check(path, OLD, "old")
    with ShardedCheckpoints(path) as ckpt:  # the next save puts a moved step back
        ckpt.save(3, {"w": jnp.ones(1)})
        assert ckpt.steps() == [1, 2, 3] and sorted(os.listdir(path)) == ["1", "2", "3"]
        np.testing.assert_array_equal(np.asarray(ckpt.restore(2).state["w"]), OLD)
