"""Audit 10 of NNC file interop: tensor files as NNC writes them (rows without fnnc's
checksums, through the ``sqlite3`` module as ``ccv_nnc_tensor_write`` does), damaged
the way files are damaged in transit, and the row names fnnc writes for NNC."""

from __future__ import annotations

import contextlib
import os
import sqlite3

import numpy as np
import pytest
from safetensors.numpy import load_file

from fnnc.errors import ParameterError, TensorFileError
from fnnc.io import TensorFile, read_parameters, write_parameters
from fnnc.io import format as fmt
from fnnc.io.cli import inspect_lines, main

_CREATE = (
    "CREATE TABLE tensors (name TEXT, type INTEGER, format INTEGER, datatype INTEGER, "
    "dim BLOB, data BLOB, PRIMARY KEY (name))"
)


def _nnc_file(path, rows, page_size=1024):
    """A tensor file as NNC writes it: its table, its rows, no checksums."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(f"PRAGMA page_size={page_size}")
        conn.execute(_CREATE)
        for name, x in rows.items():
            dtype = fmt.CODES[x.dtype]
            conn.execute(
                "REPLACE INTO tensors VALUES (?, 1, 2, ?, ?, ?)",
                (name, dtype, fmt.pack_dim(x.shape), x.tobytes()),
            )
        conn.commit()


def test_a_file_cut_short_inside_its_last_page_is_refused_not_read_as_zeros(tmp_path, capsys):
    """A copy stopped part way through the last page: SQLite reads the missing bytes as
    zeros, so the tail of the tensor stored there read back as 0 with no error (NNC's
    rows carry no checksum), and ``inspect --verify`` called the file sound."""
    w = np.arange(1, 3001, dtype=np.float32)
    whole = tmp_path / "whole.sqlite3"
    _nnc_file(whole, {"b": np.ones(3, np.float32), "w": w})
    blob = whole.read_bytes()
    assert len(blob) % 1024 == 0
    with TensorFile(whole, readonly=True) as f:  # the oracle: the file as written
        np.testing.assert_array_equal(f.read("w"), w)
    for cut in (1, 100, 1000):
        short = tmp_path / f"short{cut}.sqlite3"
        short.write_bytes(blob[:-cut])
        pages = r"short of its \d+ pages of 1024 bytes"
        with pytest.raises(TensorFileError, match=pages), TensorFile(short, readonly=True) as f:
            f.read("w")
        with pytest.raises(TensorFileError, match=r"cut short"):
            TensorFile(short).write("x", np.zeros(2, np.float32))
        assert short.read_bytes() == blob[:-cut]  # a write leaves it as it was
        assert main(["inspect", "--verify", str(short)]) == 1
        assert "cut short" in capsys.readouterr().err
    longer = tmp_path / "longer.sqlite3"  # bytes after the last page: SQLite ignores them
    longer.write_bytes(blob + b"\x01" * 100)
    with TensorFile(longer, readonly=True) as f:
        np.testing.assert_array_equal(f.read("w"), w)


@pytest.mark.parametrize("reserved", [7, 0x80000001])
def test_the_high_32_bits_of_datatype_are_nncs_reserved_field_and_ignored(tmp_path, reserved):
    """NNC writes ``reserved << 32 | datatype`` and its reader takes ``datatype_mix &
    0xffffffff`` (ccv_nnc_tensor_io.c), so a 32F row with anything in ``reserved`` is a
    32F row; fnnc called it an unknown datatype and refused the row."""
    path = tmp_path / "reserved.sqlite3"
    w = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    _nnc_file(path, {"w": w})
    mixed = (reserved << 32) | 0x4000
    mixed = mixed - 2**64 if mixed >= 2**63 else mixed  # an int64 column, as NNC binds it
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("UPDATE tensors SET datatype=? WHERE name='w'", (mixed,))
    with TensorFile(path, readonly=True) as f:
        assert (f.info("w").dtype, f.info("w").shape) == (np.float32, (2, 3))
        np.testing.assert_array_equal(f.read("w"), w)
        assert f.verify().ok


def test_inspect_stats_print_an_integer_tensors_extremes_exactly(tmp_path):
    """``--stats`` printed every statistic with %.6g: NNC's i32 row holding 2147483647
    listed its max as 2.14748e+09, and int64 values past 2**53 were not even the nearest
    float. Oracle: Python's own ints."""
    path = tmp_path / "ints.sqlite3"
    rows = {
        "i32": np.array([1, -2, 3, 2**31 - 1], np.int32),
        "i64": np.array([-(2**62) - 1, 2**53 + 1], np.int64),
        "u8": np.array([7, 255], np.uint8),
    }
    _nnc_file(path, rows)
    lines = inspect_lines(path, stats=True)
    cells = {line.split()[0]: line.split() for line in lines[2:]}
    for name, x in rows.items():
        assert cells[name][5:7] == [str(int(x.min())), str(int(x.max()))], lines
    assert cells["i32"][7] == f"{float(rows['i32'].mean()):.6g}"


def test_an_empty_tensor_as_nnc_writes_it_with_a_null_blob_reads(tmp_path, capsys):
    """ccv_nnc_tensor_new gives a tensor of no elements a NULL data pointer, and
    ccv_nnc_tensor_write binds it with sqlite3_bind_blob, which stores NULL for a NULL
    pointer; NNC reads it back as no bytes. fnnc called the row damaged ('data is
    NoneType, expected a BLOB'), so read, read_parameters, verify and convert failed
    on the whole file."""
    path = tmp_path / "empty.sqlite3"
    w = np.array([1.5, -2.0], np.float32)
    _nnc_file(path, {"w": w})
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("INSERT INTO tensors VALUES ('e', 1, 2, 16384, ?, NULL)", (bytes(48),))
    with TensorFile(path, readonly=True) as f:
        e = f.read("e")
        assert (e.dtype, e.shape) == (np.float32, (0,))
        assert f.read("e", shape=(0, 3)).shape == (0, 3)
        report = f.verify()
        assert report.ok and sorted(report.unchecked) == ["e", "w"]
    got = read_parameters(path)
    assert got["e"].shape == (0,) and got["e"].dtype == np.float32
    np.testing.assert_array_equal(got["w"], w)
    assert main(["convert", str(path), str(tmp_path / "out.safetensors")]) == 0
    assert load_file(str(tmp_path / "out.safetensors"))["e"].shape == (0,)
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:  # a NULL holding elements
        conn.execute("UPDATE tensors SET data=NULL WHERE name='w'")
    with pytest.raises(TensorFileError, match="expected a BLOB"), TensorFile(path) as f:
        f.read("w")


def test_a_name_nnc_cannot_read_back_is_refused(tmp_path):
    """ccv_nnc_tensor_write / _read bind the name with sqlite3_bind_text(name, -1): a C
    string, cut at its first NUL. fnnc stored 'a\\x00b' whole, a row NNC can never ask
    for (it looks up 'a', here another tensor's row)."""
    path = tmp_path / "names.sqlite3"
    with TensorFile(path) as f:
        f.write("a", np.ones(2, np.float32))
        with pytest.raises(TensorFileError, match=r"C strings.*look up 'a'"):
            f.write("a\x00b", np.zeros(2, np.float32))
        assert f.names() == ["a"]
        np.testing.assert_array_equal(f.read("a"), np.ones(2, np.float32))
        f.write("", np.zeros(1, np.float32))  # NNC can write and read an empty name
        assert f.names() == ["", "a"]


def test_write_parameters_refuses_two_ids_stored_as_one_row(tmp_path):
    """Parameter 'w(0)' and internal 'w' (device 0) are both NNC's row 'w(0)': the
    internal silently replaced the parameter in the file. Oracle: ccv_cnnp_model_write's
    row names ('%s' and '%s(%d)')."""
    path = tmp_path / "p.sqlite3"
    with pytest.raises(ParameterError, match=r"'w\(0\)' and 'internal w' are both stored as"):
        write_parameters(path, {"w(0)": np.ones(2, np.float32)}, internals={"w": np.zeros(3)})
    assert not path.exists() or path.stat().st_size == 0
    write_parameters(path, {"w": np.ones(2, np.float32)}, internals={"w": np.zeros(3)})
    with TensorFile(path, readonly=True) as f:
        assert f.names() == ["w", "w(0)"]


def test_an_nnc_symbolic_graph_file_is_named_as_such(tmp_path, capsys):
    """ccv_nnc_symbolic_graph_write makes tensor_symbol, graph_exec_symbol, graph and
    tensor_bind and no tensors table; fnnc said 'not an NNC tensor file', for a file
    NNC wrote, without saying what it is or that fnnc cannot read that format."""
    path = tmp_path / "graph.db"
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        for table in ("tensor_symbol", "graph_exec_symbol", "graph", "tensor_bind"):
            conn.execute(f"CREATE TABLE {table} (id INTEGER, graph INTEGER, name TEXT)")
    with pytest.raises(TensorFileError, match=r"NNC symbolic graph file .*does not read"):
        TensorFile(path, readonly=True)
    assert main(["inspect", str(path)]) == 1
    assert "ccv_nnc_symbolic_graph_write" in capsys.readouterr().err


def _cantopen() -> sqlite3.Error:
    """A real SQLITE_CANTOPEN, as SQLite raises it for a journal it cannot create."""
    try:
        sqlite3.connect("file:/nonexistent-folder/x.sqlite3?mode=rwc", uri=True)
    except sqlite3.Error as e:
        return e
    raise AssertionError("SQLite opened a file in a missing folder")


def test_a_write_in_a_folder_it_cannot_write_names_the_folder(tmp_path, monkeypatch):
    """Every write makes SQLite's journal beside the file; in a folder the process may
    not write that fails as SQLITE_CANTOPEN, which said 'check that the path is a file
    and its folder exists' while both exist. The translation now names the folder."""
    from fnnc.io import sqlite_errors

    assert getattr(_cantopen(), "sqlite_errorname", "SQLITE_CANTOPEN") == "SQLITE_CANTOPEN"
    path = tmp_path / "w.sqlite3"
    monkeypatch.setattr(sqlite_errors.os, "access", lambda p, mode: p != str(tmp_path))
    error = sqlite_errors.translate(_cantopen(), str(path), "write")
    assert f"its folder {tmp_path} is not writable" in str(error)
    assert "w.sqlite3-journal" in str(error)


def test_a_read_only_folder_end_to_end(tmp_path):
    """The same through TensorFile, where the OS refuses the write (not for root)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    _nnc_file(folder / "w.sqlite3", {"w": np.ones(2, np.float32)})
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("this process may write a 0o555 folder (root)")
        with TensorFile(folder / "w.sqlite3") as f:
            np.testing.assert_array_equal(f.read("w"), np.ones(2, np.float32))
            with pytest.raises(TensorFileError, match=r"its folder .* is not writable"):
                f.write("x", np.zeros(2, np.float32))
    finally:
        folder.chmod(0o755)


def test_a_gpu_row_names_its_device_as_nnc_requires(tmp_path):
    """device="GPU" was written as 0xfff02, NNC's any-device GPU: ccv_nnc_tensor_new
    asserts that a GPU tensor names its device (CCV_COMPUTE_DEVICE_ANY is refused), so
    ccv_nnc_tensor_read of the row fails in NNC; ccv_cnnp_model_read takes such a
    parameter as device 0, which is what it now is. Oracle: NNC's type layout,
    memory | device << 8, and the row NNC wrote for a CPU tensor of device 0 (0x1)."""
    path = tmp_path / "gpu.sqlite3"
    with TensorFile(path) as f:
        for device in ("GPU", "GPU:0", "GPU:3", "CPU", "CPU:0"):
            f.write(device, np.ones(2, np.float32), device=device)
    want = {"GPU": 0x002, "GPU:0": 0x002, "GPU:3": 0x302, "CPU": 0xFFF01, "CPU:0": 0x001}
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert dict(conn.execute("SELECT name, type FROM tensors")) == want
    with TensorFile(path, readonly=True) as f:
        assert [f.info(n).device for n in ("GPU", "GPU:3", "CPU")] == ["GPU:0", "GPU:3", "CPU"]


def test_a_zero_size_parameter_reads_back_into_its_shape(tmp_path):
    """NNC's dim cannot hold a zero-size axis, so a (0, 4) parameter is stored with an
    all-zero dim (fnnc's side table keeps (0, 4)); read_parameters matched a scalar's [1]
    to () but called the empty one 'stored float32[0], expected float32[0, 4]'."""
    path = tmp_path / "z.sqlite3"
    write_parameters(path, {"w": np.zeros((0, 4), np.float32), "s": np.float32(3)})
    got = read_parameters(path, {"w": ((0, 4), np.float32), "s": ((), np.float32)})
    assert (got["w"].shape, got["w"].dtype) == ((0, 4), np.float32)
    assert got["s"].shape == () and got["s"] == 3
    got = read_parameters(path, {"w": ((3, 4), np.float32)}, strict=False)
    assert [str(m) for m in got.mismatched] == ["w: stored float32[0, 4], expected float32[3, 4]"]


@pytest.mark.parametrize("writing_first", [False, True])
def test_a_write_inside_a_snapshot_is_refused_clearly(tmp_path, writing_first):
    """snapshot() holds a read transaction; a write inside it closed that connection
    (a read-only one) and the block's end then raised a raw sqlite3.ProgrammingError
    ('Cannot operate on a closed database'), or, on a connection already open for
    writing, 'cannot start a transaction within a transaction; the file may be
    damaged'. The write is now refused before it starts, and the file keeps its rows."""
    path = tmp_path / "s.sqlite3"
    w = np.arange(3, dtype=np.float32)
    _nnc_file(path, {"w": w})
    with TensorFile(path) as f:
        if writing_first:
            f.write("v", w)
        with f.snapshot():
            np.testing.assert_array_equal(f.read("w"), w)
            with pytest.raises(TensorFileError, match=r"cannot write inside snapshot\(\)"):
                f.write("x", np.ones(2, np.float32))
            np.testing.assert_array_equal(f.read("w"), w)
        with f.transaction():  # reads and writes together
            f.write("x", f.read("w") + 1)
        np.testing.assert_array_equal(f.read("x"), w + 1)
        assert "x" in f.names()


def test_a_bool_is_no_layout(tmp_path):
    """format=True was taken as the int 1 and stored as NCHW without a word."""
    with TensorFile(tmp_path / "f.sqlite3") as f:
        for flag in (True, False):
            with pytest.raises(TensorFileError, match=f"format {flag}"):
                f.write("w", np.ones(2, np.float32), flag)
        f.write("w", np.ones(2, np.float32), 1)  # NNC's code for NCHW
        assert f.info("w").format == "NCHW"
