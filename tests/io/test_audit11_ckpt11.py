"""Audit 11 (checkpoints area): what a journal is opened with is checked before the run
depends on it. The oracle for retention is the rule the docstrings state (the newest
``keep_last`` steps by number, multiples of ``keep_every``, the saved and the newest)."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc.errors import CheckpointError, ParameterError
from fnnc.io import (
    Checkpoints,
    ShardedCheckpoints,
    TensorFile,
    read_parameters,
    write_parameters,
)

KINDS = [(Checkpoints, "run.ckpt"), (ShardedCheckpoints, "run.dir")]


@pytest.mark.parametrize("kind,name", KINDS)
@pytest.mark.parametrize(
    "option", [{"keep_last": 2.0}, {"keep_last": "2"}, {"keep_last": True}, {"keep_every": 2.5}]
)
def test_retention_that_is_no_positive_int_is_refused_when_opened(tmp_path, kind, name, option):
    """keep_last=2.0 raised a raw TypeError at the first save (after the training step,
    the step unsaved), '2' a raw TypeError, keep_every=2.5 deleted every step but the
    newest on each save, True was taken as 1; each is now refused when opened."""
    with pytest.raises(CheckpointError, match=f"{next(iter(option))}=.*positive int"):
        kind(tmp_path / name, **option)
    assert not (tmp_path / name).exists()


@pytest.mark.parametrize("kind,name", KINDS)
def test_a_numpy_int_retention_keeps_what_the_rule_says(tmp_path, kind, name):
    """ShardedCheckpoints refused keep_last=np.int64(2), which Checkpoints took."""
    with kind(tmp_path / name, keep_last=np.int64(2), keep_every=np.int32(3)) as ckpt:
        for step in range(1, 8):
            ckpt.save(step, {"w": np.full(2, step, np.float32)})
        assert ckpt.steps() == [3, 6, 7]
        assert isinstance(ckpt.keep_last, int) and isinstance(ckpt.keep_every, int)
        np.testing.assert_array_equal(np.asarray(ckpt.restore(6).state["w"]), [6, 6])


@pytest.mark.parametrize("kind,name", KINDS)
def test_a_bool_is_no_step(tmp_path, kind, name):
    """save(True, ...) stored step 1 (operator.index(True) is 1); a bool is refused as
    a step in every call that takes one, and nothing is written."""
    with kind(tmp_path / name) as ckpt:
        ckpt.save(0, {"w": np.zeros(2, np.float32)})
        for call in (
            lambda: ckpt.save(True, {"w": np.ones(2, np.float32)}),
            lambda: ckpt.restore(np.bool_(False)),
            lambda: ckpt.delete(False),
        ):
            with pytest.raises(CheckpointError, match=r"is a .*bool.*give an int"):
                call()
        assert ckpt.steps() == [0]
        np.testing.assert_array_equal(np.asarray(ckpt.restore(0).state["w"]), [0, 0])


def test_the_empty_model_name_is_a_name_as_nnc_writes_it(tmp_path):
    """ccv_cnnp_model_write(model, conn, "") names rows "__" "" "__[id]" (its snprintf
    with an empty %s): fnnc wrote and read bare ids for name="", so a file s4nnc wrote
    under the key "" did not read (and listed no model to read it as)."""
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    path = tmp_path / "nnc.sqlite3"
    with TensorFile(path) as f:  # as NNC writes it
        f.write("____[t-fc-0-0]", w)
        f.write("____[r-bn-0-0(0)]", w[0])
    got = read_parameters(path, {"t-fc-0-0": ((2, 3), np.float32)}, name="")
    np.testing.assert_array_equal(got["t-fc-0-0"], w)
    with pytest.raises(ParameterError, match=r"model named '' \(rows ____\[<id>\]\).*name=''"):
        read_parameters(path, {"t-fc-0-0": ((2, 3), np.float32)})
    write_parameters(tmp_path / "b.sqlite3", {"t-fc-0-0": w}, name="", internals={"r-bn-0-0": w[0]})
    assert sorted(TensorFile(tmp_path / "b.sqlite3").names()) == sorted(TensorFile(path).names())


def test_checkpoints_given_a_sharded_directory_name_the_class_that_reads_it(tmp_path):
    """Checkpoints(dir) said 'not a file (a folder or device); give a tensor file' for a
    ShardedCheckpoints directory (ShardedCheckpoints(file) already named Checkpoints);
    it now names ShardedCheckpoints, which restores the step."""
    path = tmp_path / "run.dir"
    with ShardedCheckpoints(path) as ckpt:
        ckpt.save(3, {"w": np.arange(3, dtype=np.float32)})
    with pytest.raises(CheckpointError, match=r"is a directory.*ShardedCheckpoints"):
        Checkpoints(path)
    np.testing.assert_array_equal(ShardedCheckpoints(path).restore(3).state["w"], np.arange(3))
