"""Row checksums: NNC's table unchanged, damage detected, NNC-written rows still read."""

import contextlib
import shutil
import sqlite3
import struct
import zlib

import numpy as np
import pytest

from fnnc.errors import TensorFileError
from fnnc.io import TensorFile, integrity
from fnnc.io.cli import main
from tests.helpers import NNC_FILES, fetch_rows, needs_nnc_files

# /work/shared/nnc-files beside the repository: written by libccv (liuliu/ccv c6ce5b1)
# ccv_nnc_tensor_io.c's statement, as NNC creates the table
NNC_CREATE = (
    "CREATE TABLE IF NOT EXISTS tensors (name TEXT, type INTEGER, format INTEGER, "
    "datatype INTEGER, dim BLOB, data BLOB, PRIMARY KEY (name))"
)


@pytest.fixture
def written(tmp_path):
    path = str(tmp_path / "w.sqlite")
    arrays = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.arange(5, dtype=np.int64)}
    with TensorFile(path) as f:
        for name, a in arrays.items():
            f.write(name, a)
    return path, arrays


def test_the_tensors_table_is_nnc_s(written, tmp_path):
    path, _ = written
    nnc = str(tmp_path / "nnc.sqlite")
    sqlite3.connect(nnc).execute(NNC_CREATE).connection.close()
    schema = "SELECT sql FROM sqlite_master WHERE name='tensors'"
    columns = "PRAGMA table_info(tensors)"
    for query in (schema, columns):
        assert fetch_rows(path, query) == fetch_rows(nnc, query)


def test_the_checksum_is_crc32_of_the_stored_row(written):
    path, arrays = written
    for name in arrays:
        query = "SELECT rowid, type, format, datatype, dim, data FROM tensors WHERE name=?"
        ((rowid, type_, fmt, datatype, dim, data),) = fetch_rows(path, query, (name,))
        query = "SELECT row, algo, digest FROM fnnc_checksums WHERE name=?"
        ((row, algo, digest),) = fetch_rows(path, query, (name,))
        head = struct.pack("<3q", type_, fmt, datatype) + dim
        assert (row, algo, digest) == (rowid, "crc32", f"{zlib.crc32(head + data):08x}")


def _damage(path, stored: bytes, changed: bytes) -> None:
    """Changes the bytes ``stored`` in the file itself, as disk damage does: no SQLite
    writer (and so none of its triggers) sees it."""
    with open(path, "rb") as file:
        raw = file.read()
    assert raw.count(stored) == 1
    with open(path, "wb") as file:
        file.write(raw.replace(stored, changed))


@pytest.mark.parametrize("column", ["data", "dim"])
def test_a_flipped_byte_is_detected(written, column, capsys):
    path, arrays = written
    ((stored,),) = fetch_rows(path, f"SELECT {column} FROM tensors WHERE name='a'")
    blob = bytearray(stored)
    blob[0 if column == "dim" else 17] ^= 0x04  # dim [3, 4] -> [7, 4]: same length
    if column == "dim":
        blob[4] = 0  # and [7] alone: 7 of the 12 stored floats still fit the length check
    _damage(path, stored, bytes(blob))
    with TensorFile(path, readonly=True) as f:
        with pytest.raises(TensorFileError, match=r"tensor 'a' in .*w\.sqlite: checksum mismatch"):
            f.read("a")
        np.testing.assert_array_equal(f.read("b"), arrays["b"])  # the rest reads
        report = f.verify()
    assert not report.ok and [name for name, _ in report.damaged] == ["a"]
    assert report.checked == ("b",) and report.unchecked == ()
    with pytest.raises(TensorFileError, match=r"1 damaged\n  damaged: a: .*checksum mismatch"):
        report.raise_if_damaged()
    assert main(["inspect", "--verify", path]) == 1
    out = capsys.readouterr().out
    assert "2 rows: 1 match their checksum, 0 have none, 1 damaged" in out
    assert "damaged: a:" in out


@needs_nnc_files
def test_nnc_written_files_read_without_checksums(tmp_path, capsys):
    files = sorted(NNC_FILES.glob("*.sqlite3"))
    for source in files:
        path = tmp_path / source.name
        shutil.copyfile(source, path)
        with TensorFile(path, readonly=True) as f:
            report = f.verify()
            assert report.ok and report.checked == () and len(report.unchecked) == len(f)
            for name in f.names():
                f.read(name)
        assert main(["inspect", "--verify", str(path)]) == 0
    capsys.readouterr()


def test_a_row_rewritten_by_nnc_reads_as_unchecked(written):
    path, _ = written
    new = np.ones(3, np.float32)
    conn = sqlite3.connect(path)  # NNC's REPLACE knows nothing of fnnc_checksums
    conn.execute(
        "REPLACE INTO tensors (name, type, format, datatype, dim, data) VALUES ('a', 1044225, 2, "
        "16384, ?, ?)",
        (struct.pack("<12i", 3, *[0] * 11), new.tobytes()),
    )
    conn.commit()
    conn.close()
    with TensorFile(path) as f:
        np.testing.assert_array_equal(f.read("a"), new)
        report = f.verify()
        assert report.ok and report.unchecked == ("a",) and report.checked == ("b",)
        f.write("a", new * 2)  # fnnc writes a fresh checksum
        assert f.verify().checked == ("a", "b")


def test_checksums_follow_rows_in_transactions_and_deletes(written):
    path, _ = written
    with TensorFile(path) as f:
        with pytest.raises(RuntimeError), f.transaction():
            f.write("c", np.ones(2, np.float32))
            raise RuntimeError("rolled back")
        f.delete("b")
        f.discard(["a", "nope"])
        f.write("d", np.ones(1, np.float32))
    names = fetch_rows(path, "SELECT name FROM fnnc_checksums")
    assert names == [("d",)]


def _nnc_write(conn, name, array):
    """ccv_nnc_tensor_write's statement (liuliu/ccv lib/nnc/ccv_nnc_tensor_io.c)."""
    conn.execute(
        "REPLACE INTO tensors (name, type, format, datatype, dim, data) VALUES (?, ?, ?, ?, ?, ?)",
        (name, 0xFFF01, 2, 0x4000, struct.pack("<12i", *array.shape, *[0] * 11), array.tobytes()),
    )


def _delete_and_rewrite(path, new):
    """s4nnc's ``store.remove("a")`` then a write of "a": SQLite reuses the freed rowid
    (the largest)."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        (before,) = conn.execute("SELECT rowid FROM tensors WHERE name='a'").fetchone()
        conn.execute("DELETE FROM tensors WHERE name='a'")
        _nnc_write(conn, "a", new)
        (after,) = conn.execute("SELECT rowid FROM tensors WHERE name='a'").fetchone()
        conn.commit()
    return before, after


def test_a_row_deleted_and_rewritten_by_another_writer_reads_as_unchecked(tmp_path):
    path = str(tmp_path / "w.sqlite")
    with TensorFile(path) as f:
        f.write("b", np.zeros(2, np.float32))
        f.write("a", np.zeros(3, np.float32))
    new = np.ones(3, np.float32)
    before, after = _delete_and_rewrite(path, new)
    assert before == after  # the rowid fnnc's checksum names is the new row's
    with TensorFile(path, readonly=True) as f:
        np.testing.assert_array_equal(f.read("a"), new)
        report = f.verify()
    assert report.ok and report.unchecked == ("a",)


def test_a_row_updated_in_place_by_another_writer_reads_as_unchecked(written):
    path, arrays = written
    new = np.full((3, 4), 2.0, np.float32)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("UPDATE tensors SET data=? WHERE name='a'", (new.tobytes(),))
        conn.execute("UPDATE tensors SET name='c' WHERE name='b'")
        conn.commit()
    with TensorFile(path, readonly=True) as f:
        np.testing.assert_array_equal(f.read("a"), new)
        np.testing.assert_array_equal(f.read("c"), arrays["b"])
        report = f.verify()
    assert report.ok and report.unchecked == ("a", "c")
    assert fetch_rows(path, "SELECT name FROM fnnc_checksums") == []


def test_files_from_before_the_triggers_read_and_gain_them_on_the_next_write(tmp_path):
    path = str(tmp_path / "w.sqlite")
    with TensorFile(path) as f:
        f.write("b", np.zeros(2, np.float32))
        f.write("a", np.zeros(3, np.float32))
    with contextlib.closing(sqlite3.connect(path)) as conn:
        for name in integrity.TRIGGER_NAMES:
            conn.execute(f"DROP TRIGGER {name}")  # as an older fnnc wrote it
        conn.commit()
    triggers = "SELECT name FROM sqlite_master WHERE type='trigger' ORDER BY name"
    with TensorFile(path) as f:
        np.testing.assert_array_equal(f.read("a"), np.zeros(3, np.float32))
        assert f.verify().checked == ("a", "b")
    assert fetch_rows(path, triggers) == []  # reading never writes
    _delete_and_rewrite(path, np.ones(3, np.float32))
    with pytest.raises(
        TensorFileError, match=r"another writer .* deleted the row .* predates the triggers"
    ):
        TensorFile(path, readonly=True).read("a")
    with TensorFile(path) as f:
        f.write("a", np.ones(3, np.float32))
    assert fetch_rows(path, triggers) == [(n,) for n in sorted(integrity.TRIGGER_NAMES)]
    _delete_and_rewrite(path, np.full(3, 5.0, np.float32))
    with TensorFile(path, readonly=True) as f:
        np.testing.assert_array_equal(f.read("a"), np.full(3, 5.0, np.float32))
