"""Reading never creates or changes a file; a missing file is an error naming its path."""

import hashlib
import os
import pathlib
import shutil
import sqlite3

import numpy as np
import pytest

import fnnc.graph
from fnnc.errors import CheckpointError, FnncError, GraphFormatError, TensorFileError
from fnnc.io import Checkpoints, TensorFile, connections, graph_names, load_from, read_parameters
from fnnc.io.cli import main
from tests.helpers import fetch_rows


def digest(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def test_reading_a_missing_file_names_it_and_creates_nothing(tmp_path, capsys):
    path = str(tmp_path / "typo.sqlite3")
    calls = [
        lambda: TensorFile(path).read("w"),
        lambda: TensorFile(path).names(),
        lambda: TensorFile(path, readonly=True),
        lambda: read_parameters(path),
        lambda: graph_names(path),
        lambda: load_from(path, "g"),
        lambda: fnnc.graph.load(path, name="g"),
    ]
    for call in calls:
        with pytest.raises(TensorFileError, match=r"typo\.sqlite3: no such file.*check the path"):
            call()
    with pytest.raises(GraphFormatError, match=r"cannot read .*typo\.sqlite3.*check the path"):
        fnnc.graph.load(path)
    with pytest.raises(
        CheckpointError, match=r"typo\.sqlite3 holds no checkpoints.*does not exist"
    ):
        Checkpoints(path).restore()
    with pytest.raises(CheckpointError, match=r"no step 3 in .*typo\.sqlite3"):
        Checkpoints(path).restore(3)
    # an empty journal, not an error: train(resume=path) starts a new run on a new path
    assert Checkpoints(path).steps() == [] and Checkpoints(path).latest is None
    assert main(["inspect", path]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "typo.sqlite3: no such file" in err
    assert os.listdir(tmp_path) == []


def test_opening_for_writing_creates_the_file_only_when_it_writes(tmp_path):
    path = tmp_path / "new ?#%20.sqlite"  # URI characters in the name stay a name
    with TensorFile(path) as f:
        assert not path.exists() and not f.exists()
        f.write("w", np.ones(2, np.float32))
        assert path.exists() and f.names() == ["w"]
    with Checkpoints(tmp_path / "run.ckpt"):
        pass
    assert TensorFile(path, readonly=True).read("w").tolist() == [1, 1]
    assert sorted(os.listdir(tmp_path)) == ["new ?#%20.sqlite"]


def test_an_unrelated_database_is_left_as_it_is(tmp_path):
    path = str(tmp_path / "other.db")
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    conn.execute("INSERT INTO users VALUES (1, 'a')")
    conn.commit()
    conn.close()
    before = digest(path)
    with pytest.raises(CheckpointError, match=r"other\.db holds no checkpoints"):
        Checkpoints(path).restore()
    assert Checkpoints(path).steps() == []
    for call in (lambda: TensorFile(path).read("w"), lambda: read_parameters(path)):
        with pytest.raises(TensorFileError, match=r"other\.db: no tensors table"):
            call()
    assert digest(path) == before and os.listdir(tmp_path) == ["other.db"]
    tables = fetch_rows(path, "SELECT name FROM sqlite_master")
    assert tables == [("users",)]


def test_reads_never_open_the_file_for_writing(tmp_path, monkeypatch):
    """Restoring from a read-only file works: no read path needs write access."""
    path = str(tmp_path / "run.ckpt")
    with Checkpoints(path) as ckpt:
        ckpt.save(1, {"w": np.arange(3.0)})
    with TensorFile(path) as f:
        f.write("x", np.ones(2, np.float32))
    before = digest(path)

    def refuse(path):
        raise AssertionError("a read opened the file for writing")

    monkeypatch.setattr(connections, "open_writer", refuse)
    os.chmod(path, 0o444)
    os.chmod(tmp_path, 0o555)
    try:
        with Checkpoints(path) as ckpt:
            assert ckpt.steps() == [1] and ckpt.latest == 1
            np.testing.assert_array_equal(ckpt.restore().state["w"], np.arange(3.0))
        assert read_parameters(path, {"x": ((2,), np.float32)})["x"].tolist() == [1, 1]
        with TensorFile(path) as f:
            assert f.verify().ok and len(f) == 2
            with pytest.raises(AssertionError, match="opened the file for writing"):
                f.write("y", np.ones(1, np.float32))  # the monkeypatch is what stops it
    finally:
        os.chmod(tmp_path, 0o755)
        os.chmod(path, 0o644)
    assert digest(path) == before


def test_a_reader_rolls_back_a_killed_writer_and_sees_the_last_commit(tmp_path):
    """A hot journal (a writer killed mid-transaction) is rolled back by the first
    reader, which then reads the last committed state, as NNC's SQLite would."""
    live = str(tmp_path / "live.sqlite")
    with TensorFile(live) as f:
        f.write("w", np.zeros(50_000, np.float32))
    writer = TensorFile(live)
    with pytest.raises(RuntimeError), writer.transaction():
        writer.connection.execute("PRAGMA cache_size=1")  # spill changed pages to the file
        writer.write("w", np.ones(50_000, np.float32))
        writer.write("v", np.ones(50_000, np.float32))
        crashed = str(tmp_path / "crashed.sqlite")  # the files as a SIGKILL would leave them
        shutil.copyfile(live, crashed)
        shutil.copyfile(live + "-journal", crashed + "-journal")
        raise RuntimeError("the copy is taken")
    writer.close()
    assert digest(crashed) != digest(live)  # half a transaction is in the copy
    with TensorFile(crashed, readonly=True) as f:
        assert f.names() == ["w"] and not f.read("w").any()
        assert f.verify().ok
    assert not os.path.exists(crashed + "-journal")


def test_reading_a_folder_or_a_missing_folder(tmp_path):
    with pytest.raises(TensorFileError, match=r"not a file"):
        TensorFile(tmp_path, readonly=True)
    with pytest.raises(FnncError, match=r"no such file \(the folder .* does not exist"):
        TensorFile(tmp_path / "nope" / "x.sqlite").read("w")
