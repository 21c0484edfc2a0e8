"""Audit 8 (sharding): sharded checkpoints give every leaf back where it was saved, and a
save Orbax would refuse is refused before it touches the saved step."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import optax
import pytest

from fnnc.errors import CheckpointError
from fnnc.io import Checkpoints, ShardedCheckpoints


def test_int_keys_past_nine_restore_to_their_own_leaves(tmp_path):
    """Orbax saves int keys as strings, which sort otherwise ("10" < "2"): the leaves
    came back in the string order, so key 2 held key 10's array (same shapes, no error).
    Oracle: the saved tree itself, and the SQLite Checkpoints restoring the same tree."""
    state = {k: np.full(3, float(k), np.float32) for k in (1, 2, 10, 11)}
    nested = {"layers": {k: np.full(2, 100.0 + k, np.float32) for k in range(12)}}
    params = {10: np.ones((2, 2), np.float32), 9: np.zeros((2, 2), np.float32)}
    opt = optax.MultiSteps(optax.adam(0.1), 3).init(params)
    opt = jax.tree.map(lambda a: a + np.arange(a.size).reshape(a.shape).astype(a.dtype), opt)
    with ShardedCheckpoints(tmp_path / "s") as ckpt:
        ckpt.save(1, state, optimizer_state=nested)
        ckpt.save(2, params, optimizer_state=opt)
        got = [ckpt.restore(1), ckpt.restore(1, like=state, optimizer_like=nested)]
        got += [ckpt.restore(2), ckpt.restore(2, like=params, optimizer_like=opt)]
    sqlite = Checkpoints(tmp_path / "s.ckpt")
    sqlite.save(1, state, optimizer_state=nested)
    sqlite.save(2, params, optimizer_state=opt)
    wants = [(state, nested)] * 2 + [(params, opt)] * 2
    oracles = [sqlite.restore(1)] * 2 + [sqlite.restore(2)] * 2
    for restored, (tree, opt_tree), oracle in zip(got, wants, oracles):
        for saved, back, other in (
            (tree, restored.state, oracle.state),
            (opt_tree, restored.optimizer_state, oracle.optimizer_state),
        ):
            assert jax.tree.structure(back) == jax.tree.structure(saved)
            for (path, a), b, c in zip(
                jax.tree_util.tree_leaves_with_path(saved),
                jax.tree.leaves(back),
                jax.tree.leaves(other),
            ):
                where = jax.tree_util.keystr(path)
                np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=where)
                np.testing.assert_array_equal(np.asarray(b), np.asarray(c), err_msg=where)


# Orbax's refusal leaves TensorStore reads in flight (see test_sharded_checkpoints.py)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize(
    "leaf",
    ["abc", b"abc", 1 + 2j, np.array(["a", "b"]), np.array([object()]),
     np.array(["2020-01-01"], "datetime64[D]")],
    ids=["str", "bytes", "complex", "strings", "objects", "dates"],
)  # fmt: skip
def test_a_resave_orbax_refuses_keeps_the_saved_step(tmp_path, leaf):
    """Re-saving a step deletes it first; a leaf Orbax then refused (a str, a string
    array...) left no step at all. It is refused before anything on disk changes,
    naming the leaf; the step keeps the values first saved (the oracle)."""
    saved = {"w": np.arange(3, dtype=np.float32)}
    with ShardedCheckpoints(tmp_path / "s") as ckpt:
        ckpt.save(5, saved)
        with pytest.raises(CheckpointError, match=r"state leaf \['bad'\] is a .*Orbax cannot"):
            ckpt.save(5, {"w": np.ones(3, np.float32), "bad": leaf})
        assert ckpt.steps() == [5]
        np.testing.assert_array_equal(ckpt.restore(5).state["w"], saved["w"])


def test_numbers_of_every_kind_still_save(tmp_path):
    """What the refusal lets through: Orbax stores each, restored equal."""
    tree = {
        "b": True, "i": 3, "f": 2.5, "bools": np.array([True, False]),
        "c64": np.array([1 + 2j], np.complex64), "u8": np.array([3], np.uint8),
        "bf16": np.array([1.5], ml_dtypes.bfloat16), "int4": np.array([1], ml_dtypes.int4),
        "f16": jax.numpy.ones(2, jax.numpy.float16),
    }  # fmt: skip
    with ShardedCheckpoints(tmp_path / "n") as ckpt:
        ckpt.save(1, tree)
        got = ckpt.restore(1, like=tree).state
    for k, v in tree.items():
        assert np.asarray(got[k]).dtype == np.asarray(v).dtype, k
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(v), err_msg=k)
