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


TWO = textwrap.dedent(
    """
    import json, os, sys
    import jax, numpy as np
    rank, coordinator, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=2, process_id=rank)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from fnnc.io import ShardedCheckpoints
    sh = NamedSharding(Mesh(np.array(jax.devices()), ("d",)), P("d"))
    base = np.arange(8.0, dtype=np.float32)
    arr = lambda v: jax.make_array_from_callback((8,), sh, lambda i: base[i] * v)
    ckpt = ShardedCheckpoints(out + "/ck")
    ckpt.save(1, {"w": arr(1)})
    ckpt.save(2, {"w": arr(2)})
    ckpt.save(2, {"w": arr(5)}, metadata={"v": 5})  # every process writes its shards again
    got = ckpt.restore(2, like={"w": jax.ShapeDtypeStruct((8,), np.float32, sharding=sh)})
    shards = {str(s.index): np.asarray(s.data).tolist() for s in got.state["w"].addressable_shards}
    with open(out + f"/r{rank}.json", "w") as f:
        json.dump({"steps": ckpt.steps(), "meta": got.metadata, "shards": shards}, f)
    jax.distributed.shutdown()
    """
)


def test_two_processes_resave_a_step_of_sharded_arrays(tmp_path):
    import json
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=2")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TWO, str(r), f"localhost:{port}", str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    try:
        logs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-2000:] for log in logs)
    want = np.arange(8.0) * 5  # the oracle: the re-saved array, each process its quarter
    for r in range(2):
        report = json.loads((tmp_path / f"r{r}.json").read_text())
        assert report["steps"] == [1, 2] and report["meta"] == {"v": 5}
        assert len(report["shards"]) == 2
        for index, data in report["shards"].items():
            start = int(index.split("slice(")[1].split(",")[0])
            np.testing.assert_array_equal(data, want[start : start + 2])
    assert sorted(os.listdir(tmp_path / "ck")) == ["1", "2"]


def test_a_restore_sees_one_state_while_another_writer_drops_its_step(tmp_path, monkeypatch):
    """Checkpoints.restore read the manifest and then each row in statements of their
    own: a save committed in between (its keep_last dropping the step being read) made
    the reader report a damaged checkpoint. The reads now share one read transaction."""
    import threading

    from fnnc.io import Checkpoints

    path = tmp_path / "run.ckpt"
    with Checkpoints(path) as ckpt:
        ckpt.save(1, {"w": OLD, "b": np.int32(7)})
    writer = Checkpoints(path, keep_last=1)
    done = threading.Event()

    def save_step_2():
        writer.save(2, {"w": NEW, "b": np.int32(8)})
        done.set()

    thread = threading.Thread(target=save_step_2)
    row = Checkpoints._row

    def row_then_race(self, *args):
        if not thread.is_alive() and not done.is_set():  # once, after the manifest
            thread.start()
            done.wait(0.5)  # the save's commit waits for this read to end
        return row(self, *args)

    monkeypatch.setattr(Checkpoints, "_row", row_then_race)
    with Checkpoints(path) as reader:
        got = reader.restore(1)
    thread.join(60)
    np.testing.assert_array_equal(got.state["w"], OLD)
    assert int(got.state["b"]) == 7
    assert done.is_set() and writer.steps() == [2]
    np.testing.assert_array_equal(writer.restore().state["w"], NEW)
    writer.close()


@pytest.mark.parametrize(("keep_last", "keep_every"), [(2, None), (1, 4), (2, 3), (None, 3)])
def test_sharded_retention_keeps_what_checkpoints_keeps(tmp_path, keep_last, keep_every):
    """Orbax's max_to_keep counts steps by save time: saving an older step (a run
    resumed from it) deleted the newest one. The oracle is Checkpoints' retention."""
    from fnnc.io import Checkpoints

    kw = {"keep_last": keep_last, "keep_every": keep_every}
    with Checkpoints(tmp_path / "a.ckpt", **kw) as a, ShardedCheckpoints(tmp_path / "b", **kw) as b:
        for step in [*range(1, 11), 5, 7]:
            a.save(step, {"w": np.full(2, step, np.float32)})
            b.save(step, {"w": jnp.full(2, step, jnp.float32)})
            assert b.steps() == a.steps(), step
        assert b.latest == 10
        np.testing.assert_array_equal(np.asarray(b.restore().state["w"]), [10, 10])
