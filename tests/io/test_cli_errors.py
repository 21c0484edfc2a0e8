"""python -m fnnc inspect, in-process: one line and status 1 for a bad file, never a traceback."""

import contextlib
import sqlite3
import struct

import numpy as np
import pytest

from fnnc.io import TensorFile
from fnnc.io.cli import main


def damaged_page(path):
    with TensorFile(path) as f:
        f.write("w", np.ones(4, np.float32))
    with open(path, "r+b") as raw:
        raw.seek(65536)  # page 2: the tensors table
        raw.write(b"\xff" * 100)


def other_columns(path):
    sqlite3.connect(path).execute("CREATE TABLE tensors (a, b)").connection.close()


def unrelated(path):
    sqlite3.connect(path).execute("CREATE TABLE t (a)").connection.close()


def junk(path):
    with open(path, "wb") as f:
        f.write(b"\0junk" * 100)


def empty(path):
    open(path, "wb").close()


def truncated(path):
    with TensorFile(path) as f:
        f.write("w", np.ones(40_000, np.float32))
    with open(path, "r+b") as raw:
        raw.truncate(70_000)


CASES = {
    "missing": (lambda path: None, "no such file"),
    "damaged page": (damaged_page, "malformed"),
    "other columns": (other_columns, "its tensors table has columns (a, b)"),
    "unrelated database": (unrelated, "no tensors table"),
    "not SQLite": (junk, "not a database"),
    "empty file": (empty, "no tensors table"),
    "truncated": (truncated, "cannot open: database disk image is malformed"),
}


@pytest.mark.parametrize("verify", [False, True], ids=["plain", "verify"])
@pytest.mark.parametrize("case", list(CASES))
def test_bad_files_print_one_line(tmp_path, capsys, case, verify):
    path = str(tmp_path / "f.sqlite")
    make, message = CASES[case]
    make(path)
    status = main(["inspect", "--stats", *(["--verify"] if verify else []), path])
    out, err = capsys.readouterr()
    assert status == 1 and "Traceback" not in out + err
    assert err.count("\n") == 1 and err.startswith("python -m fnnc inspect: error: ")
    assert path in err and message in out + err
    if case == "damaged page":  # the file opens; the page that holds the rows is damaged
        assert "1 rows cannot be read" in err
        assert not verify or "damaged: <file>" in out  # the report lists what is damaged
    else:  # the file cannot be opened as a tensor file at all
        assert out == ""


def test_a_good_file_verifies(tmp_path, capsys):
    path = str(tmp_path / "ok.sqlite")
    with TensorFile(path) as f:
        f.write("w", np.arange(3, dtype=np.float32))
    assert main(["inspect", "--verify", path]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.splitlines()[-1].endswith(
        "1 rows: 1 match their checksum, 0 have none, 0 damaged"
    )


@pytest.mark.parametrize(
    ("bad", "shown", "kind"), [(None, "<NULL>", "NULL"), (b"n", "b'n'", "a BLOB")]
)
def test_a_row_whose_name_is_not_text_is_listed_as_unreadable(tmp_path, capsys, bad, shown, kind):
    path = str(tmp_path / "f.sqlite")
    with TensorFile(path) as f:
        f.write("w", np.ones(2, np.float32))
    with contextlib.closing(sqlite3.connect(path)) as conn:  # a foreign writer's row
        row = (bad, 0xFFF01, 2, 0x4000, struct.pack("<12i", 2, *[0] * 11), bytes(8))
        conn.execute("INSERT INTO tensors VALUES (?, ?, ?, ?, ?, ?)", row)
        conn.commit()
    status = main(["inspect", "--stats", "--verify", path])
    out, err = capsys.readouterr()
    assert status == 1 and "Traceback" not in out + err
    assert err.count("\n") == 1 and f"{path}: 1 rows cannot be read" in err
    listing = out.splitlines()
    assert listing[2].startswith("w ") and listing[3].startswith(f"{shown}  ?")
    assert f"has {kind} name ({shown}), not TEXT" in listing[3]
    with TensorFile(path, readonly=True) as f:
        report = f.verify()
    assert report.checked == ("w",) and [n for n, _ in report.damaged] == [shown]
    assert report.damaged[0][1].startswith(f"a row in {path} has {kind} name")
