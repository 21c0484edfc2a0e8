"""A checkpoint's manifest is checked like tensor rows: a changed byte is found by
restore, restore_into and verify; steps saved without a checksum still load."""

import sqlite3
import zlib

import numpy as np
import optax
import pytest

from fnnc.errors import CheckpointError
from fnnc.io import Checkpoints, TensorFile
from fnnc.io.cli import main
from fnnc.models import Dense, Input, Model
from tests.helpers import fetch_rows

X = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
Y = np.arange(8, dtype=np.int32) % 2


def small_model():
    x = Input()
    model = Model(x, Dense(2, name="fc")(x))
    model.compile(X[:4], loss="softmax_crossentropy", minimizer=optax.adam(0.1))
    return model


@pytest.fixture(scope="module")
def trained():
    model = small_model()
    model.train((X, Y), epochs=1, batch_size=4, verbose=False)
    return model


def sql(path, *statements):
    conn = sqlite3.connect(path)
    changed = [conn.execute(*s).rowcount for s in statements]
    conn.commit()
    conn.close()
    return changed


def flip_epoch(path, how):
    """``"epoch":1`` -> ``"epoch":3`` in place: through SQLite, or in the file's bytes."""
    if how == "sql":
        query = (
            """UPDATE fnnc_checkpoints SET manifest=replace(manifest, '"epoch":1', '"epoch":3')"""
        )
        assert sql(path, (query,)) == [1]
    else:
        with open(path, "r+b") as f:
            data = f.read()
            assert data.count(b'"epoch":1') == 1
            f.seek(data.index(b'"epoch":1') + len(b'"epoch":'))
            f.write(b"3")


@pytest.mark.parametrize("how", ["sql", "file bytes"])
def test_a_changed_epoch_is_found_by_restore_into_verify_and_the_cli(
    tmp_path, trained, how, capsys
):
    path = str(tmp_path / "run.ckpt")
    with Checkpoints(path) as ckpt:
        ckpt.save(2, trained)
    flip_epoch(path, how)
    fresh = small_model()
    where = rf"step 2 in {path}: its manifest does not match the checksum saved with it"
    with Checkpoints(path) as ckpt, pytest.raises(CheckpointError, match=where):
        ckpt.restore_into(fresh)
    with pytest.raises(CheckpointError, match=where):
        fresh.train((X, Y), epochs=2, batch_size=4, resume=path, verbose=False)
    assert fresh.train_progress.epoch == 0  # nothing of the damaged step was taken
    report = TensorFile(path, readonly=True).verify()
    assert not report.ok and [n for n, _ in report.damaged] == ["<manifest of checkpoint step 2>"]
    assert "step 2 in" in report.damaged[0][1]
    assert main(["inspect", path, "--verify"]) == 1
    assert "damaged: <manifest of checkpoint step 2>" in capsys.readouterr().out


def test_the_checksum_is_crc32_of_step_created_and_manifest(tmp_path, trained, capsys):
    path = str(tmp_path / "run.ckpt")
    with Checkpoints(path) as ckpt:
        ckpt.save(7, trained)
        ckpt.save(9, {"w": np.ones(3)})
    rows = fetch_rows(path, "SELECT * FROM fnnc_checkpoints")
    for step, created, manifest, checksum in rows:
        text = f"{step!r}\n{created!r}\n".encode() + manifest.encode()
        assert checksum == f"crc32:{zlib.crc32(text):08x}"
    report = TensorFile(path, readonly=True).verify()
    assert report.ok and {
        "<manifest of checkpoint step 7>",
        "<manifest of checkpoint step 9>",
    } <= set(report.checked)
    assert main(["inspect", path, "--verify"]) == 0
    capsys.readouterr()


def test_steps_saved_without_a_checksum_load_unchecked(tmp_path, trained):
    path = str(tmp_path / "old.ckpt")
    with Checkpoints(path) as ckpt:
        ckpt.save(1, trained)
    sql(path, ("ALTER TABLE fnnc_checkpoints DROP COLUMN checksum",))  # as fnnc saved it before
    restored = small_model()
    with Checkpoints(path) as ckpt:
        ckpt.restore_into(restored)
    assert restored.train_progress.epoch == 1
    assert all(np.array_equal(v, restored.parameters()[k]) for k, v in trained.parameters().items())
    report = TensorFile(path, readonly=True).verify()
    assert report.ok and "<manifest of checkpoint step 1>" in report.unchecked
    with Checkpoints(path) as ckpt:  # a save adds the column; the old step stays unchecked
        ckpt.save(2, trained)
    report = TensorFile(path, readonly=True).verify()
    assert "<manifest of checkpoint step 1>" in report.unchecked
    assert "<manifest of checkpoint step 2>" in report.checked
    sql(path, ("UPDATE fnnc_checkpoints SET checksum='crc32:00000000' WHERE step=1",))
    with Checkpoints(path) as ckpt, pytest.raises(CheckpointError, match=r"step 1 in .*checksum"):
        ckpt.restore(1)


def test_deleting_a_step_whose_manifest_changed_keeps_the_other_steps_rows(tmp_path):
    path = str(tmp_path / "run.ckpt")
    with Checkpoints(path) as ckpt:
        ckpt.save(1, {"w": np.zeros(2)})
        ckpt.save(2, {"w": np.ones(2)})
    # step 1's manifest now names step 2's rows: deleting step 1 must not follow it
    sql(path, ("UPDATE fnnc_checkpoints SET manifest=replace(manifest, '__ckpt-1__', "
               "'__ckpt-2__') WHERE step=1",))  # fmt: skip
    with Checkpoints(path) as ckpt:
        ckpt.delete(1)
        assert ckpt.steps() == [2]
        np.testing.assert_array_equal(ckpt.restore(2).state["w"], np.ones(2))
