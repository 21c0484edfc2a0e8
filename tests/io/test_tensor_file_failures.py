"""TensorFile when a write cannot start, on files other tools made, and under contention:
a failed write keeps nothing, releases the file and leaves the TensorFile usable."""

import os
import pathlib
import shutil
import sqlite3
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fnnc.errors import TensorFileError
from fnnc.io import TensorFile, connections

# NNC's own schema (ccv_nnc_tensor_write), without fnnc's checksum table
NNC_SCHEMA = (
    "CREATE TABLE tensors (name TEXT, type INTEGER, format INTEGER, datatype INTEGER, "
    "dim BLOB, data BLOB, PRIMARY KEY (name))"
)
F32 = 0x4000


def nnc_row(name, values):
    dim = struct.pack("<12i", len(values), *[0] * 11)
    return (name, 0xFFF01, 2, F32, dim, np.float32(values).tobytes())


def make_db(path, *statements, rows=()):
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    for row in rows:
        conn.execute("INSERT INTO tensors VALUES (?, ?, ?, ?, ?, ?)", row)
    conn.commit()
    conn.close()


def lock_is_free(path):
    """Whether another connection can take the write lock at once."""
    other = sqlite3.connect(path, timeout=0)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        other.close()


def limit_pages(monkeypatch, extra):
    """Writers see a disk with room for ``extra`` more pages (SQLite's max_page_count)."""
    opened = connections.open_writer

    def full(path):
        conn = opened(path)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count={max(pages + extra, 1)}")
        return conn

    monkeypatch.setattr(connections, "open_writer", full)


def free_space(f):
    f.connection.execute("PRAGMA max_page_count=1073741823")


def test_a_full_disk_while_creating_tables_rolls_back_and_a_retry_works(tmp_path, monkeypatch):
    """The disk fills while fnnc makes its tables (before the batch body runs): the batch
    is rolled back, the lock released, and the same TensorFile writes once space is freed
    (it said "cannot start a transaction within a transaction" forever)."""
    path = str(tmp_path / "nnc.sqlite")
    make_db(path, NNC_SCHEMA, rows=[nnc_row("old", [1, 2])])
    monkeypatch.setattr(connections, "TIMEOUT", 0.1)
    limit_pages(monkeypatch, 0)  # fnnc's checksum table needs a page: none is left
    f = TensorFile(path)
    want = np.arange(6, dtype=np.float32)
    for _ in range(2):  # the same error each time, not a stuck transaction
        with pytest.raises(TensorFileError, match=r"nnc\.sqlite: cannot write.*disk is full"):
            f.write("w", want)
        assert not f.connection.in_transaction and lock_is_free(path)
    assert f.names() == ["old"] and not f.has_table("fnnc_checksums")
    free_space(f)
    f.write("w", want)
    np.testing.assert_array_equal(f.read("w"), want)
    f.close()
    with TensorFile(path, readonly=True) as g:
        assert g.names() == ["old", "w"] and g.verify().ok
        np.testing.assert_array_equal(g.read("old"), np.float32([1, 2]))


def test_a_tensors_view_fails_the_write_and_releases_the_file(tmp_path):
    """A `tensors` VIEW: fnnc cannot put its checksum triggers on it. The write fails, and
    the file is not left locked by a transaction that never ends."""
    path = str(tmp_path / "v.db")
    make_db(
        path,
        "CREATE TABLE t (name TEXT, type INTEGER, format INTEGER, datatype INTEGER, "
        "dim BLOB, data BLOB)",
        "CREATE VIEW tensors AS SELECT * FROM t",
        "CREATE TABLE unrelated (x)",
    )
    with TensorFile(path) as f:
        for _ in range(2):
            with pytest.raises(TensorFileError, match=r"v\.db: cannot write tensor 'w'.*view"):
                f.write("w", np.ones(2, np.float32))
            assert not f.connection.in_transaction and lock_is_free(path)
        other = sqlite3.connect(path, timeout=0)
        other.execute("INSERT INTO unrelated VALUES (1)")
        other.commit()
        other.close()


def test_tables_made_by_a_failed_batch_are_not_taken_to_exist_after_it(tmp_path):
    """fnnc's checksum table, made by a batch that fails, is gone after the rollback:
    reads must not look for it."""
    path = str(tmp_path / "nnc.sqlite")
    make_db(path, NNC_SCHEMA, rows=[nnc_row("old", [1, 2])])
    with TensorFile(path) as f:
        with pytest.raises(RuntimeError), f.transaction():
            f.write("w", np.ones(2, np.float32))
            assert f.read("w").tolist() == [1, 1] and f.has_table("fnnc_checksums")
            raise RuntimeError
        assert not f.has_table("fnnc_checksums")
        assert f.names() == ["old"] and f.read("old").tolist() == [1, 2]


COLUMNS = "name TEXT, type INTEGER, format INTEGER, datatype INTEGER, dim BLOB, data BLOB"


@pytest.mark.parametrize(
    "schema, what",
    [
        (f"CREATE TABLE tensors ({COLUMNS})", "name is not its PRIMARY KEY"),
        (f"CREATE TABLE tensors ({COLUMNS}, PRIMARY KEY (name, type))", "name is not its"),
        (
            f"CREATE TABLE tensors ({COLUMNS}, PRIMARY KEY (name)) WITHOUT ROWID",
            "it is a WITHOUT ROWID",
        ),
    ],
    ids=["no key", "name and type", "without rowid"],
)
def test_a_tensors_table_without_nncs_key_is_refused(tmp_path, schema, what):
    """Without a unique name, REPLACE INTO added a second 'w' and read() returned the old
    one; without rowids fnnc cannot keep checksums. Both are refused, the file untouched."""
    path = str(tmp_path / "t.db")
    make_db(path, schema, rows=[nnc_row("w", [1, 2])])
    before = pathlib.Path(path).read_bytes()
    for readonly in (False, True):
        with pytest.raises(
            TensorFileError, match=rf"t\.db: its tensors table is not NNC's: {what}"
        ):
            TensorFile(path, readonly=readonly)
    with pytest.raises(TensorFileError, match=r"PRIMARY KEY \(name\)\)\. It was not written"):
        TensorFile(path).write("w", np.float32([5, 6]))
    assert pathlib.Path(path).read_bytes() == before


@pytest.mark.parametrize(
    "schema",
    [
        f"CREATE TABLE tensors ({COLUMNS.replace('name TEXT', 'name TEXT PRIMARY KEY')})",
        f"CREATE TABLE tensors ({COLUMNS}, UNIQUE (name))",
    ],
    ids=["column primary key", "unique"],
)
def test_a_unique_name_is_nncs_key(tmp_path, schema):
    path = str(tmp_path / "t.db")
    make_db(path, schema, rows=[nnc_row("w", [1, 2])])
    with TensorFile(path) as f:
        f.write("w", np.float32([5, 6]))
        assert f.names() == ["w"] and f.read("w").tolist() == [5, 6] and f.verify().ok


EMPTY = r"no tensors table: the file is empty \(no tables at all\): no tensors were written"


def assert_left_empty(path):
    """Nothing of a failed first batch is in the file: 0 bytes, no journal, and reading it
    says so (not "not an NNC tensor file")."""
    with pytest.raises(TensorFileError, match=EMPTY):
        TensorFile(path, readonly=True)
    with pytest.raises(TensorFileError, match=EMPTY):
        TensorFile(path).read("w")
    assert os.path.getsize(path) == 0 and not os.path.exists(f"{path}-journal")


def test_a_full_disk_on_a_new_file_leaves_it_empty_and_a_retry_works(tmp_path, monkeypatch):
    path = str(tmp_path / "new.sqlite")
    limit_pages(monkeypatch, 1)  # room for page 1 only: the tables do not fit
    f = TensorFile(path)
    with pytest.raises(TensorFileError, match=r"new\.sqlite: cannot write.*disk is full"):
        f.write("w", np.ones(2, np.float32))
    assert not f.connection.in_transaction and lock_is_free(path)
    assert_left_empty(path)
    with pytest.raises(TensorFileError, match=EMPTY):
        f.names()
    free_space(f)
    f.write("w", np.float32([3, 4]))
    f.close()
    with TensorFile(path, readonly=True) as g:
        assert g.names() == ["w"] and g.read("w").tolist() == [3, 4] and g.verify().ok


# Another process (NNC, say: plain SQLite) opens and reads the new file while fnnc's first
# batch holds it, then writes its own tensor once told to.
OTHER = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], timeout=10)
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    print("opened", flush=True)
    sys.stdin.readline()
    try:
        conn.execute(sys.argv[2])
        conn.execute("INSERT INTO tensors VALUES (?, ?, ?, ?, ?, ?)", eval(sys.argv[3]))
        conn.commit()
        print("wrote", flush=True)
    except sqlite3.Error as e:
        print("failed:", e, flush=True)
    """
)


def test_a_failed_first_batch_keeps_the_file_another_process_opened(tmp_path):
    """fnnc's first batch fails after another process opened the new file: the file stays
    (it was unlinked, and the other process's write failed with "disk I/O error")."""
    path = str(tmp_path / "shared.sqlite")
    row = nnc_row("a", [0, 1, 2])
    f = TensorFile(path)
    with pytest.raises(RuntimeError, match="the batch fails"), f.transaction():
        f.write("b", np.ones(2, np.float32))
        other = subprocess.Popen(
            [sys.executable, "-c", OTHER, path, NNC_SCHEMA, repr(row)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert other.stdout.readline().strip() == "opened"
        raise RuntimeError("the batch fails")
    assert_left_empty(path)
    out, _ = other.communicate("go\n", timeout=30)
    assert out.strip() == "wrote"
    with TensorFile(path, readonly=True) as g:  # what the other process wrote, no more
        assert g.names() == ["a"] and g.read("a").tolist() == [0, 1, 2]
    f.write("b", np.ones(2, np.float32))  # the TensorFile that failed still writes
    assert f.names() == ["a", "b"]
    f.close()


def test_a_first_write_killed_midway_reads_as_an_empty_file(tmp_path):
    """The files a SIGKILL during the first write of a new file leaves (the file and its
    hot journal): the reader rolls the journal back and says the file is empty."""
    path = str(tmp_path / "new.sqlite")
    crashed = str(tmp_path / "crashed.sqlite")
    f = TensorFile(path)
    with pytest.raises(RuntimeError), f.transaction():
        f.connection.execute("PRAGMA cache_size=1")  # spill the pages to the file
        f.write("w", np.ones(50_000, np.float32))
        shutil.copyfile(path, crashed)
        shutil.copyfile(path + "-journal", crashed + "-journal")
        raise RuntimeError("the copy is taken")
    f.close()
    assert os.path.getsize(crashed) > 0
    assert_left_empty(crashed)
    other = str(tmp_path / "other.db")  # a file with other tables keeps its message
    make_db(other, "CREATE TABLE users (id INTEGER)")
    with pytest.raises(TensorFileError, match=r"other\.db: no tensors table \(not an NNC"):
        TensorFile(other, readonly=True)
