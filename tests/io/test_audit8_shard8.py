"""Audit 8 (sharding): sharded checkpoints give every leaf back where it was saved."""

from __future__ import annotations

import jax
import numpy as np
import optax

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
