"""Checkpoint journal: steps, restore, retention, optimizer state, metadata."""

import contextlib
import sqlite3
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.errors import CheckpointError
from fnnc.io import Checkpoints, TensorFile


def params(seed):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {
        "dense": {"w": jax.random.normal(k1, (8, 4)), "b": jnp.zeros(8)},
        "emb": jax.random.normal(k2, (5, 3)).astype(jnp.bfloat16),
    }


def assert_same(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert type(g) is type(w), (type(g), type(w))
        if isinstance(w, (np.ndarray, np.generic, jax.Array)):
            assert g.dtype == w.dtype and np.shape(g) == np.shape(w)
            assert np.asarray(g).tobytes() == np.asarray(w).tobytes()
            assert getattr(g, "weak_type", False) == getattr(w, "weak_type", False)
        else:
            assert g == w


def test_steps_restore_latest_and_earlier(tmp_path):
    with Checkpoints(tmp_path / "c.sqlite") as ckpt:
        assert ckpt.steps() == [] and ckpt.latest is None
        with pytest.raises(CheckpointError, match=r"no checkpoints"):
            ckpt.restore()
        for step in (1, 5, 3):
            ckpt.save(step, params(step), metadata={"loss": 1.0 / step, "tags": ["a", step]})
        assert ckpt.steps() == [1, 3, 5] and ckpt.latest == 5
        latest = ckpt.restore()
        assert latest.step == 5 and latest.metadata == {"loss": 0.2, "tags": ["a", 5]}
        assert_same(latest.state, params(5))
        assert_same(ckpt.restore(1).state, params(1))
        with pytest.raises(CheckpointError, match=r"no step 2 .*\[1, 3, 5\]"):
            ckpt.restore(2)
        ckpt.save(3, {"x": np.ones(2)})  # a step saved again replaces the earlier save
        assert_same(ckpt.restore(3).state, {"x": np.ones(2)})
        ckpt.delete(1)
        assert ckpt.steps() == [3, 5]
    names = TensorFile(tmp_path / "c.sqlite", readonly=True).names()
    assert names and all(n.startswith(("__ckpt-3__[", "__ckpt-5__[")) for n in names)


def test_optimizer_state_round_trips_exactly(tmp_path):
    p = params(0)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    state = opt.init(p)
    grads = jax.tree.map(jnp.ones_like, p)
    for _ in range(3):
        updates, state = opt.update(grads, state, p)
        p = optax.apply_updates(p, updates)
    with Checkpoints(tmp_path / "c.sqlite") as ckpt:
        ckpt.save(3, p, optimizer_state=state)
        got = ckpt.restore()
        assert_same(got.optimizer_state, state)
        assert_same(got.state, p)
        again, _ = opt.update(grads, got.optimizer_state, got.state)
        want, _ = opt.update(grads, state, p)
        assert_same(again, want)
        by_template = ckpt.restore(optimizer_like=opt.init(params(0)))
        assert_same(by_template.optimizer_state, state)


class Local(NamedTuple):
    a: np.ndarray
    b: int


def test_standard_containers_and_leaves(tmp_path):
    tree = {
        "tuple": (np.arange(3, dtype=np.int64), None, [1, 2.5, "s", True]),
        "local": Local(np.zeros((2, 0), np.float32), 7),  # a zero-size array
        "ints": {3: np.ones(1), 1: np.zeros(1)},  # int keys, unsorted
        "scalars": [np.float32(1.5), np.int32(-2), jnp.asarray(2.0), jnp.int32(4)],
        "odd": [np.array([True, False]), np.arange(4, dtype=np.int8), np.float64("nan")],
        "big_endian": np.arange(3, dtype=">f4"),
        "inf": float("inf"),
    }
    with Checkpoints(tmp_path / "c.sqlite") as ckpt:
        ckpt.save(0, tree)
        got = ckpt.restore().state
    assert list(got) == list(tree)
    assert got["local"].b == 7 and type(got["local"]) is Local
    assert got["local"].a.shape == (2, 0) and list(got["ints"]) == [3, 1]
    assert got["tuple"][2] == [1, 2.5, "s", True] and got["inf"] == float("inf")
    assert got["scalars"][2].weak_type and not got["scalars"][3].weak_type
    assert got["big_endian"].tolist() == [0, 1, 2]
    tree["big_endian"] = got["big_endian"]
    assert_same(got, tree)


def test_model_with_parameters_uses_nnc_ids(tmp_path):
    class Model:
        def parameters(self):
            return {
                "t-linear-0-0": np.ones((2, 2), np.float32),
                "t-linear-0-1": np.zeros(2, np.float32),
            }

    path = tmp_path / "c.sqlite"
    with Checkpoints(path) as ckpt:
        ckpt.save(7, Model())
        assert_same(ckpt.restore().state, Model().parameters())
    names = TensorFile(path, readonly=True).names()
    assert names == ["__ckpt-7__[t-linear-0-0]", "__ckpt-7__[t-linear-0-1]"]


def test_retention_never_drops_the_newest(tmp_path):
    with Checkpoints(tmp_path / "a.sqlite", keep_last=2, keep_every=4) as ckpt:
        for step in range(1, 11):
            ckpt.save(step, {"w": np.full(3, step)})
        assert ckpt.steps() == [4, 8, 9, 10]
        ckpt.save(6, {"w": np.zeros(3)})  # an older step number: kept, as are the last 2
        assert ckpt.steps() == [4, 6, 8, 9, 10]
    with Checkpoints(tmp_path / "b.sqlite", keep_last=1) as ckpt:
        for step in range(5):
            ckpt.save(step, {"w": np.full(1000, step, np.float32)})
            assert ckpt.steps() == [step]
        assert ckpt.restore().state["w"][0] == 4
        assert len(ckpt.file) == 1  # the dropped steps' rows are gone too
    with pytest.raises(ValueError, match=r"keep_last=0"):
        Checkpoints(tmp_path / "c.sqlite", keep_last=0)


def test_failed_save_leaves_everything(tmp_path):
    class Weird:
        pass

    path = tmp_path / "c.sqlite"
    with Checkpoints(path, keep_last=1) as ckpt:
        ckpt.save(1, {"w": np.ones(2)})
        with pytest.raises(CheckpointError, match=r"\['bad'\] is a Weird"):
            ckpt.save(2, {"w": np.ones(2), "bad": Weird()})
        with pytest.raises(CheckpointError, match=r"metadata .* not JSON"):
            ckpt.save(2, {"w": np.ones(2)}, metadata={"x": object()})
        with pytest.raises(CheckpointError, match=r"PRNG key"):
            ckpt.save(2, {"k": jax.random.key(0)})
        with pytest.raises(CheckpointError, match=r"tuple key"):
            ckpt.save(2, {(1, 2): np.ones(1)})
        assert ckpt.steps() == [1]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_unimported_namedtuple_needs_a_template(tmp_path):
    path = tmp_path / "c.sqlite"
    with Checkpoints(path) as ckpt:
        ckpt.save(1, {"s": Local(np.ones(2), 3)})
    conn = sqlite3.connect(path)
    text = conn.execute("SELECT manifest FROM fnnc_checkpoints").fetchone()[0]
    conn.execute(  # as a program whose module is not imported now saved it (unchecked)
        "UPDATE fnnc_checkpoints SET manifest=?, checksum=NULL",
        (text.replace("test_checkpoints", "nowhere_module"),),
    )
    conn.commit()
    conn.close()
    with Checkpoints(path) as ckpt:
        with pytest.raises(CheckpointError, match=r"nowhere_module.* is not imported.*like="):
            ckpt.restore()
        got = ckpt.restore(like={"s": Local(np.zeros(2), 0)}).state
        assert type(got["s"]) is Local and got["s"].b == 3
        with pytest.raises(CheckpointError, match=r"2 leaves.*3"):
            ckpt.restore(like={"s": Local(np.zeros(2), 0), "t": 1})
