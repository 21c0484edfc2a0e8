"""Audit 9 (review fixes): a sharded restore holds one lock, never a nested one."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import optax
import pytest

import fnnc.io.sharded_checkpoints as sharded
from fnnc.io import ShardedCheckpoints


@pytest.fixture
def posix_locks(monkeypatch):
    """``folder_locked`` with NFS's semantics (flock emulated by per-process POSIX
    locks): closing any of the process's lock descriptors drops the lock. Returns the
    list of (shared, held-at-read) events: each lock taken, and each array read with
    whether a lock was held then."""
    state = {"held": False}
    events: list = []

    @contextlib.contextmanager
    def fake(folder, *, shared=False):
        events.append(("lock", shared))
        state["held"] = True
        try:
            yield
        finally:
            state["held"] = False  # one close drops the process's lock, nested or not

    real_read = ShardedCheckpoints.read_arrays

    def read(self, *args, **kwargs):
        events.append(("read", state["held"]))
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(sharded, "folder_locked", fake)
    monkeypatch.setattr(ShardedCheckpoints, "read_arrays", read)
    return events


def test_a_restore_inside_reading_keeps_the_one_lock(tmp_path, posix_locks):
    """``with ck.reading(): ck.manifest(); ck.restore()`` took three locks on three
    descriptors; the inner ones' close dropped the outer one on NFS, so the array reads
    ran unlocked. Now one lock, held at every read (oracle: the emulated POSIX locks)."""
    with ShardedCheckpoints(tmp_path / "run") as ck:
        ck.save(1, {"w": np.arange(3, dtype=np.float32)}, {"m": np.ones(2, np.float32)})
        posix_locks.clear()
        with ck.reading():
            assert ck.manifest()["source"] == "pytree"
            got = ck.restore()
            with ck.reading():  # nested again: still the one lock
                ck.restore()
    assert [e for e in posix_locks if e[0] == "lock"] == [("lock", True)]
    assert [e for e in posix_locks if e[0] == "read"] == [("read", True)] * 4
    np.testing.assert_array_equal(got.state["w"], np.arange(3, dtype=np.float32))


def test_each_thread_takes_its_own_lock(tmp_path):
    """The nesting count is per thread: a thread inside ``reading`` does not let another
    thread's ``reading`` skip its lock (oracle: the count of locks taken)."""
    taken: list = []
    with ShardedCheckpoints(tmp_path / "run") as ck:
        ck.save(1, {"w": np.zeros(2, np.float32)})
        real = sharded.folder_locked

        @contextlib.contextmanager
        def counting(folder, *, shared=False):
            taken.append(shared)
            with real(folder, shared=shared):
                yield

        sharded.folder_locked = counting
        try:
            with ck.reading():
                other = threading.Thread(target=lambda: ck.manifest(1))
                other.start()
                other.join()
        finally:
            sharded.folder_locked = real
    assert taken == [True, True]


def test_restore_into_a_model_reads_under_one_lock(tmp_path, posix_locks):
    """``restore_into`` held ``reading()`` and called the public ``manifest``, which took
    a second lock and dropped the first on NFS before the arrays were read."""
    from fnnc.models import Dense, Input, Model

    def mlp():
        x = Input()
        model = Model(x, Dense(2, name="fc")(x))
        model.compile(np.zeros((2, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
        return model

    a, b = mlp(), mlp()
    with ShardedCheckpoints(tmp_path / "run") as ck:
        ck.save(1, a)
        posix_locks.clear()
        ck.restore_into(b)
    assert [e for e in posix_locks if e[0] == "lock"] == [("lock", True)]
    reads = [e for e in posix_locks if e[0] == "read"]
    assert reads and all(held for _, held in reads)
    np.testing.assert_array_equal(b.parameters()["t-fc-0-0"], a.parameters()["t-fc-0-0"])
