"""Audit 9 (left-alone defects): a sharded restore sees exactly one save of its step."""

from __future__ import annotations

import threading

import numpy as np

from fnnc.io import ShardedCheckpoints


def _tree(k: float) -> tuple[dict, dict, dict]:
    return (
        {"w": np.full(4, k, np.float32), "b": np.arange(3, dtype=np.float32) + k},
        {"m": np.full(2, k, np.float32)},
        {"v": k},
    )


def _as_saved(restored, k: float) -> bool:
    state, opt, meta = _tree(k)
    got = (restored.state, restored.optimizer_state, restored.metadata)
    return (
        got[2] == meta
        and all(np.array_equal(np.asarray(got[0][n]), state[n]) for n in state)
        and np.array_equal(np.asarray(got[1]["m"]), opt["m"])
    )


def test_a_restore_racing_a_resave_of_its_step_sees_one_save_whole(tmp_path):
    """restore read the manifest, then the state, then the optimizer state in separate
    Orbax calls; a re-save of the step that landed between them gave the old metadata
    with the new arrays. Here the re-save (another thread, its own ShardedCheckpoints,
    as another process would) is started right after the reader has the manifest, and
    the reader waits up to 1 s for it: it must block on the reader's shared lock, and
    the restore equal save 1 exactly (oracle: the saved trees); the next restore save 2.
    """
    path = tmp_path / "run"
    with ShardedCheckpoints(path) as first:
        first.save(1, *_tree(1.0)[:2], metadata=_tree(1.0)[2])
    saved = threading.Event()
    errors: list[BaseException] = []

    def resave() -> None:
        try:
            with ShardedCheckpoints(path) as other:
                other.save(1, *_tree(2.0)[:2], metadata=_tree(2.0)[2])
        except BaseException as e:  # reported by the test below
            errors.append(e)
        saved.set()

    reader = ShardedCheckpoints(path)
    read_arrays = reader.read_arrays
    writer = threading.Thread(target=resave)

    def racing_read(*args, **kwargs):
        if not writer.is_alive() and not saved.is_set():
            writer.start()
            saved.wait(timeout=1.0)  # a save not held off by the reader lands here
        return read_arrays(*args, **kwargs)

    reader.read_arrays = racing_read
    try:
        got = reader.restore(1)
        writer.join(timeout=30)
        assert not errors and saved.is_set()
        assert _as_saved(got, 1.0), (got.metadata, got.state, got.optimizer_state)
        reader.read_arrays = read_arrays
        assert _as_saved(reader.restore(1), 2.0)
    finally:
        reader.close()
