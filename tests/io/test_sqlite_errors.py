"""Every SQLite failure is a TensorFileError naming the file, the operation and the fix."""

import sqlite3
import struct

import numpy as np
import pytest

from fnnc.errors import CheckpointError, TensorFileError
from fnnc.io import Checkpoints, TensorFile
from tests.helpers import fetch_rows

NNC_CREATE = (
    "CREATE TABLE IF NOT EXISTS tensors (name TEXT, type INTEGER, format INTEGER, "
    "datatype INTEGER, dim BLOB, data BLOB, PRIMARY KEY (name))"
)


def sql(path, *statements):
    conn = sqlite3.connect(path)
    for statement, *args in statements:
        conn.execute(statement, *args)
    conn.commit()
    conn.close()


def dim(*shape):
    return struct.pack("<12i", *shape, *[0] * (12 - len(shape)))


def test_a_corrupted_btree_page(tmp_path):
    path = str(tmp_path / "bad.sqlite")
    with TensorFile(path) as f:
        f.write("w", np.ones(4, np.float32))
    root = fetch_rows(path, "SELECT rootpage FROM sqlite_master WHERE name='tensors'")[0][0]
    with open(path, "r+b") as raw:  # garbage over the tensors table's root page header
        raw.seek((root - 1) * 65536)
        raw.write(b"\x07" * 64)
    with TensorFile(path, readonly=True) as f:
        with pytest.raises(TensorFileError) as e:
            f.read("w")
        report = f.verify()
    message = str(e.value)
    assert path in message and "cannot read tensor 'w'" in message
    assert "malformed" in message and "restore it from a copy" in message
    assert not report.ok and report.damaged[0][0] == "<file>"


def test_not_an_sqlite_file(tmp_path):
    path = str(tmp_path / "weights.npy")
    np.save(path, np.ones(3))
    for call in (lambda: TensorFile(path), lambda: Checkpoints(path)):
        with pytest.raises(
            TensorFileError,
            match=r"weights\.npy: cannot open: file is not a "
            r"database; it is not an SQLite database",
        ):
            call()


def test_a_tensors_table_with_other_columns(tmp_path):
    path = str(tmp_path / "other.sqlite")
    sql(path, ("CREATE TABLE tensors (name TEXT, payload BLOB)",))
    for call in (
        lambda: TensorFile(path, readonly=True),
        lambda: TensorFile(path).write("w", np.ones(1, np.float32)),
        lambda: Checkpoints(path).restore(),
    ):
        with pytest.raises(
            TensorFileError,
            match=r"other\.sqlite: its tensors table has "
            r"columns \(name, payload\), not NNC's .*lacking type, format",
        ):
            call()


def test_a_text_data_column(tmp_path):
    path = str(tmp_path / "text.sqlite")
    sql(
        path,
        (NNC_CREATE.replace("data BLOB", "data TEXT"),),
        ("INSERT INTO tensors VALUES ('t', 1044225, 2, 16384, ?, 'abcdefgh')", (dim(2),)),
    )
    with TensorFile(path) as f:
        with pytest.raises(TensorFileError, match=r"'t' in .*text\.sqlite: data is str, "):
            f.read("t")
        f.write("w", np.arange(3, dtype=np.float32))  # a BLOB stays a BLOB in a TEXT column
        assert f.read("w").tolist() == [0, 1, 2]


def test_writing_through_a_read_only_connection(tmp_path):
    path = str(tmp_path / "ro.sqlite")
    with TensorFile(path) as f:
        f.write("w", np.ones(1, np.float32))
    with TensorFile(path, readonly=True) as f:
        with pytest.raises(TensorFileError, match=r"ro\.sqlite is open with readonly=True"):
            f.write("x", np.ones(1, np.float32))
        with pytest.raises(TensorFileError) as e, f.operation("delete rows"):
            f.connection.execute("DELETE FROM tensors")  # SQLite's own refusal, translated
        assert f.read("w").tolist() == [1]
    assert "ro.sqlite: cannot delete rows: attempt to write a readonly database" in str(e.value)
    assert "the file or its folder is read-only" in str(e.value)


def test_a_full_disk_keeps_what_was_saved(tmp_path):
    path = str(tmp_path / "full.ckpt")
    with Checkpoints(path) as ckpt:
        ckpt.save(1, {"w": np.ones(4, np.float32)})
        conn = ckpt.file.connection
        conn.execute(f"PRAGMA max_page_count={conn.execute('PRAGMA page_count').fetchone()[0]}")
        with pytest.raises(TensorFileError) as e:
            ckpt.save(2, {"w": np.ones(100_000, np.float32)})
        with pytest.raises(TensorFileError, match=r"cannot write tensor 'big'.*disk is full"):
            ckpt.file.write("big", np.ones(100_000, np.float32))
        assert ckpt.steps() == [1] and ckpt.restore().state["w"].tolist() == [1] * 4
        assert "big" not in ckpt.file
    message = str(e.value)
    assert "full.ckpt: cannot save checkpoint step 2: database or disk is full" in message
    assert "free space and retry" in message


@pytest.mark.parametrize(
    "shape",
    [(65536, 65536, 65536, 65536), (2**31 - 1,) * 3, (2**31 - 1,) * 12],
    ids=["65536^4", "3x(2^31-1)", "12x(2^31-1)"],
)
def test_absurd_dims_are_counted_exactly_and_allocate_nothing(tmp_path, shape):
    path = str(tmp_path / "dims.sqlite")
    sql(
        path,
        (NNC_CREATE,),
        ("INSERT INTO tensors VALUES ('d', 1044225, 2, 16384, ?, x'')", (dim(*shape),)),
    )
    with TensorFile(path) as f:
        assert f.info("d").shape == shape
        with pytest.raises(TensorFileError, match=r"'d' in .*truncated data: 0 bytes for float32"):
            f.read("d")


def test_a_damaged_manifest_table_and_step_range(tmp_path):
    path = str(tmp_path / "c.ckpt")
    with Checkpoints(path) as ckpt:
        ckpt.save(1, {"w": np.ones(1)})
        for step in (2**63, -(2**63) - 1, 1.5, "3"):
            with pytest.raises(CheckpointError, match=r"step .* for .*c\.ckpt"):
                ckpt.restore(step)
        with pytest.raises(CheckpointError, match=r"outside SQLite's int64 range"):
            ckpt.save(2**64, {"w": np.ones(1)})
        with pytest.raises(CheckpointError, match=r"step -1 for .*c\.ckpt: .* an int >= 0"):
            ckpt.save(-1, {"w": np.ones(1)})
        assert ckpt.steps() == [1]  # nothing written
    sql(path, ("ALTER TABLE fnnc_checkpoints DROP COLUMN created",))
    with pytest.raises(
        TensorFileError,
        match=r"c\.ckpt: cannot restore checkpoint step 1: no "
        r"such column: created; the file's tables are not NNC's layout",
    ):
        Checkpoints(path).restore(1)


def test_a_file_locked_by_this_process_says_to_pass_the_open_tensor_file(tmp_path, monkeypatch):
    """Two TensorFiles on one path in one process: the second waits for the first one's
    open transaction, then said "another process holds the file locked". The message now
    names this process too and what to do; the first batch still commits."""
    from fnnc.io import connections, write_parameters

    monkeypatch.setattr(connections, "TIMEOUT", 0.05)
    path = str(tmp_path / "s.sqlite")
    with TensorFile(path) as f:
        f.write("x", np.ones(2, np.float32))
        with f.transaction():
            f.write("a", np.ones(2, np.float32))
            with pytest.raises(TensorFileError) as e:
                write_parameters(path, {"w": np.ones(2, np.float32)})  # by path: a new file
            write_parameters(f, {"w": np.zeros(2, np.float32)})  # the open one: joins the batch
    message = str(e.value)
    assert message.startswith(f"{path}: cannot write") and "database is locked" in message
    assert "another connection holds the file locked" in message
    assert "in this process, pass the open TensorFile instead of the path" in message
    with TensorFile(path, readonly=True) as g:
        (row,) = set(g.names()) - {"a", "x"}  # write_parameters' row of "w"
        assert g.read("a").tolist() == [1, 1] and g.read(row).tolist() == [0, 0]
