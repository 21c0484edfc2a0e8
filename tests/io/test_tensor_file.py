"""TensorFile against NNC's byte layout, read directly with sqlite3."""

import gc
import sqlite3
import struct
import threading
import zlib

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from fnnc.errors import DTypeError, FnncError, ShapeError, TensorFileError, TensorNotFoundError
from fnnc.io import Codec, TensorFile, register_codec, unregister_codec
from tests.helpers import fetch_rows

NNC_CODES = {
    np.uint8: 0x1000,
    np.int32: 0x2000,
    np.float32: 0x4000,
    np.int64: 0x8000,
    np.float64: 0x10000,
    np.float16: 0x20000,
    ml_dtypes.bfloat16: 0x80000,
}
SHAPES = [(), (3,), (2, 3), (2, 1, 3), (1, 2, 3, 2), (2, 1, 1, 2, 3), (1,) * 5 + (2,)]
SHAPES += [(2,) * 7, (1, 2, 1, 3, 1, 2, 1, 2)]


def sample(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 200, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def nnc_dim(shape, garbage=0):
    dims = list(shape) + [0] + [garbage] * (11 - len(shape))
    return struct.pack("<12i", *dims[:12])


def raw_insert(path, name, type_, fmt, datatype, dim, data):
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS tensors (name TEXT, type INTEGER, format INTEGER, "
        "datatype INTEGER, dim BLOB, data BLOB, PRIMARY KEY (name))"
    )
    conn.execute(
        "REPLACE INTO tensors VALUES (?, ?, ?, ?, ?, ?)", (name, type_, fmt, datatype, dim, data)
    )
    conn.commit()
    conn.close()


@pytest.mark.parametrize("dtype", list(NNC_CODES), ids=lambda d: np.dtype(d).name)
def test_round_trip_every_dtype_and_rank(tmp_path, dtype):
    path = tmp_path / "t.sqlite"
    arrays = {f"r{len(s)}": sample(s, dtype, seed=len(s)) for s in SHAPES}
    with TensorFile(path) as f:
        for name, a in arrays.items():
            f.write(name, a)
    with TensorFile(path, readonly=True) as f:
        for name, a in arrays.items():
            got = f.read(name, shape=a.shape)
            assert got.dtype == a.dtype and got.shape == a.shape
            assert got.tobytes() == a.tobytes()
            assert got.flags.writeable
            # NNC has no rank 0: a scalar is stored as [1] (its dim blob), and fnnc's
            # side table gives it back as ()
            assert f.info(name).shape == a.shape
            assert f.read(name).shape == a.shape


def test_columns_are_nnc_bytes(tmp_path):
    path = tmp_path / "t.sqlite"
    a = sample((2, 3, 4), np.float32)
    with TensorFile(path) as f:
        f.write("x", a, "NCHW")
        f.write("g", np.arange(3, dtype=np.int64), device="GPU:1")
        f.write("s", np.float16(2.5))
    conn = sqlite3.connect(path)
    schema = conn.execute("SELECT sql FROM sqlite_master WHERE name='tensors'").fetchone()[0]
    assert schema == (
        "CREATE TABLE tensors (name TEXT, type INTEGER, format INTEGER, datatype INTEGER, "
        "dim BLOB, data BLOB, PRIMARY KEY (name))"
    )
    rows = {r[0]: r[1:] for r in conn.execute("SELECT * FROM tensors")}
    assert rows["x"] == (0xFFF01, 1, 0x4000, struct.pack("<12i", 2, 3, 4, *[0] * 9), a.tobytes())
    assert rows["g"][:3] == (0x102, 2, 0x8000)
    assert rows["g"][4] == struct.pack("<3q", 0, 1, 2)
    assert rows["s"][2:] == (0x20000, struct.pack("<12i", 1, *[0] * 11), np.float16(2.5).tobytes())
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()


@pytest.mark.parametrize("dtype", list(NNC_CODES), ids=lambda d: np.dtype(d).name)
def test_reads_file_written_in_nnc_layout(tmp_path, dtype):
    path = str(tmp_path / "nnc.sqlite")
    a = sample((4, 3, 2), dtype)
    data = a.tobytes() + b"\xab" * (-a.nbytes % 64)  # NNC writes its 64-byte padded size
    raw_insert(path, "w", 0xFFF01, 2, NNC_CODES[dtype], nnc_dim(a.shape, garbage=77), data)
    raw_insert(path, "v", 0x1, 1, NNC_CODES[dtype], nnc_dim((24,), garbage=-5), a.tobytes())
    with TensorFile(path, readonly=True) as f:
        assert f.read("w").tobytes() == a.tobytes()
        assert f.read("w").shape == (4, 3, 2)
        info = f.info("v")
        assert (info.shape, info.format, info.device, info.dtype) == (
            (24,),
            "NCHW",
            "CPU:0",
            a.dtype,
        )


def test_old_nnc_dim_of_8_entries(tmp_path):
    path = str(tmp_path / "old.sqlite")
    a = sample((2, 5), np.float32)
    raw_insert(
        path, "w", 0xFFF01, 2, 0x4000, struct.pack("<8i", 2, 5, 0, 9, 9, 9, 9, 9), a.tobytes()
    )
    assert np.array_equal(TensorFile(path).read("w"), a)


def test_float16_file_read_as_float32_and_back(tmp_path):
    path = str(tmp_path / "h.sqlite")
    h = sample((3, 5), np.float16)
    raw_insert(path, "h", 0xFFF01, 2, 0x20000, nnc_dim(h.shape, garbage=3), h.tobytes())
    with TensorFile(path) as f:
        got = f.read("h", dtype=np.float32)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, h.astype(np.float32))
        f.write("f", h.astype(np.float32))
        np.testing.assert_array_equal(f.read("f", dtype=np.float16), h)
        np.testing.assert_array_equal(f.read("f", dtype=jnp.bfloat16), h.astype(jnp.bfloat16))
        with pytest.raises(DTypeError, match=r"'f'"):
            f.read("f", dtype=np.int32)
        with pytest.raises(ShapeError, match=r"'f'.*\[3, 5\]"):
            f.read("f", shape=(4, 4))
        assert f.read("f", shape=(15,)).shape == (15,)


def test_jax_input_and_zero_size(tmp_path):
    with TensorFile(tmp_path / "t.sqlite") as f:
        f.write("j", jnp.arange(6.0).reshape(2, 3))
        f.write("e", np.zeros((0, 3), np.float32))
        assert f.read("j").tolist() == [[0, 1, 2], [3, 4, 5]]
        assert f.info("e").shape == (0, 3)  # NNC's dim cannot hold it: fnnc's side table
        assert f.read("e").shape == (0, 3)
        assert f.read("e", shape=(0, 3)).shape == (0, 3)
        with pytest.raises(DTypeError, match=r"bool"):
            f.write("b", np.ones(3, bool))
        with pytest.raises(ShapeError, match=r"12"):
            f.write("big", np.zeros((1,) * 13, np.float32))


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("data", b"\0" * 10, "truncated data: 10 bytes"),
        ("data", b"\0" * 200, "oversized data: 200 bytes"),
        ("dim", b"\x02\0\0\0" * 5, "dim blob is 20 bytes"),
        ("dim", "text", "dim blob is str"),
        ("datatype", 0x3000, "unknown datatype 0x3000"),
        ("format", 3, "unknown format 0x3"),
        ("datatype", 0x40000, "quantized QX"),
        ("data", None, "expected a BLOB"),
    ],
)
def test_malformed_rows_name_tensor_and_file(tmp_path, column, value, message):
    path = str(tmp_path / "bad.sqlite")
    with TensorFile(path) as f:
        f.write("ok", np.zeros(4, np.float32))
        f.write("w", np.zeros((2, 4), np.float32))
    conn = sqlite3.connect(path)
    conn.execute(f"UPDATE tensors SET {column}=? WHERE name='w'", (value,))
    conn.commit()
    conn.close()
    with TensorFile(path) as f, pytest.raises(TensorFileError) as e:
        f.read("w")
    assert message in str(e.value) and "'w'" in str(e.value) and path in str(e.value)
    assert isinstance(e.value, (FnncError, ValueError))
    assert TensorFile(path).read("ok").shape == (4,)


def test_gpu_rows_may_carry_page_padding(tmp_path):
    path = str(tmp_path / "gpu.sqlite")
    a = sample((10,), np.float32)
    raw_insert(path, "g", 0x2, 2, 0x4000, nnc_dim(a.shape), a.tobytes() + bytes(4096 - 40))
    assert np.array_equal(TensorFile(path).read("g"), a)


def test_nothing_is_unpickled(tmp_path, monkeypatch):
    import pathlib
    import pickle

    def refuse(*args, **kwargs):
        raise AssertionError("fnnc.io unpickled something")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    path = str(tmp_path / "p.sqlite")
    payload = pickle.dumps({"evil": 1})
    raw_insert(path, "p", 0xFFF01, 2, 0x1000, nnc_dim((len(payload),)), payload)
    raw_insert(path, "q", 0xFFF01, 2, 0x4000, nnc_dim((len(payload),)), payload)
    with TensorFile(path) as f:
        assert f.read("p").tobytes() == payload  # bytes stay bytes
        with pytest.raises(TensorFileError, match=r"'q'.*truncated"):
            f.read("q")
    sources = pathlib.Path(__file__).parents[2] / "fnnc" / "io"
    assert not any("import pickle" in p.read_text() for p in sources.glob("*.py"))


def test_transaction_is_all_or_nothing(tmp_path):
    path = tmp_path / "t.sqlite"
    with TensorFile(path) as f:
        f.write("keep", np.ones(2, np.float32))
        with pytest.raises(RuntimeError), f.transaction():
            f.write("a", np.ones(3, np.float32))
            f.write("keep", np.zeros(2, np.float32))
            raise RuntimeError("boom")
        assert f.names() == ["keep"] and f.read("keep").tolist() == [1, 1]
        with f.transaction():
            f.write("a", np.ones(1, np.float32))
            with pytest.raises(KeyError), f.transaction():  # nested: a savepoint
                f.write("b", np.ones(1, np.float32))
                raise KeyError("inner")
        assert f.names() == ["a", "keep"]
    assert TensorFile(path, readonly=True).names() == ["a", "keep"]


def test_listing_delete_and_errors(tmp_path):
    path = tmp_path / "t.sqlite"
    with TensorFile(path) as f:
        f.write("b", np.ones(2, np.uint8))
        f.write("a", np.ones(2, np.uint8))
        assert f.names() == list(f) == ["a", "b"] and len(f) == 2
        assert "a" in f and "zz" not in f and 3 not in f
        f.delete("a")
        with pytest.raises(TensorNotFoundError, match=r"'a'.*1 tensors: 'b'"):
            f.read("a")
        with pytest.raises(KeyError):
            f.delete("a")
    with pytest.raises(TensorFileError, match=r"no such file"):
        TensorFile(tmp_path / "missing.sqlite", readonly=True)
    sqlite3.connect(tmp_path / "empty.db").execute("CREATE TABLE x (a)").connection.close()
    with pytest.raises(TensorFileError, match=r"no tensors table"):
        TensorFile(tmp_path / "empty.db", readonly=True)
    (tmp_path / "junk").write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(TensorFileError, match=r"not an SQLite"):
        TensorFile(tmp_path / "junk")
    with TensorFile(path, readonly=True) as f, pytest.raises(TensorFileError, match=r"readonly"):
        f.write("c", np.ones(1, np.uint8))


def test_codecs(tmp_path):
    path = str(tmp_path / "c.sqlite")
    zlib_codec = Codec(
        0x9ABCDEF0,  # high bit set: NNC's int64 type column goes negative
        encode=lambda data, dtype, shape: zlib.compress(data),
        decode=lambda data, dtype, shape: zlib.decompress(data),
        name="zlib",
    )
    a = np.zeros((64, 64), np.float32)
    with TensorFile(path) as f:
        f.write("z", a, encoder=zlib_codec)
        f.write("declined", a, encoder=lambda data, dtype, shape: None)
        f.write("fn", a, encoder=lambda data, dtype, shape: (7, data[::-1]))
        info = f.info("z")
        assert (info.encoder, info.type) == (0x9ABCDEF0, 0xFFF01)
        assert info.nbytes < a.nbytes and f.info("declined").encoder == 0
        with pytest.raises(TensorFileError, match=r"'z'.*encoder 0x9abcdef0.*register"):
            f.read("z")
        assert np.array_equal(f.read("z", decoder=zlib_codec), a)
        assert np.array_equal(f.read("fn", decoder=lambda i, data, dtype, shape: data[::-1]), a)
        register_codec(zlib_codec)
        try:
            assert np.array_equal(f.read("z"), a)
            f.write("by_id", a, encoder=0x9ABCDEF0)
            assert f.info("by_id").encoder == 0x9ABCDEF0
            with pytest.raises(ValueError, match=r"taken"):
                register_codec(Codec(0x9ABCDEF0, zlib_codec.encode, zlib_codec.decode))
        finally:
            unregister_codec(0x9ABCDEF0)
    stored = fetch_rows(path, "SELECT type FROM tensors WHERE name='z'")[0][0]
    assert stored & 0xFFFFFFFFFFFFFFFF == (0x9ABCDEF0 << 32) | 0xFFF01
    with pytest.raises(ValueError, match=r"identifier"):
        Codec(0, zlib_codec.encode, zlib_codec.decode)


def test_a_file_dropped_without_close_closes_its_connection(tmp_path):
    """``TensorFile(path).names()`` leaves nothing open (Python 3.13 would report a
    connection left to the garbage collector)."""
    path = tmp_path / "w.sqlite"
    with TensorFile(path) as f:
        f.write("w", np.ones(2, np.float32))
    f = TensorFile(path, readonly=True)
    assert f.names() == ["w"]
    conn = f.connection
    del f
    gc.collect()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        conn.execute("SELECT 1")


def test_a_file_made_in_another_thread_is_closed_when_dropped_here(tmp_path):
    """A data loader's per-thread reader is collected in whichever thread drops it."""
    path = tmp_path / "w.sqlite"
    with TensorFile(path) as f:
        f.write("w", np.ones(2, np.float32))
    made = []
    worker = threading.Thread(target=lambda: made.append(TensorFile(path, readonly=True)))
    worker.start()
    worker.join()
    assert made[0].names() == ["w"]
    conn = made[0].connection
    made.clear()
    gc.collect()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        conn.execute("SELECT 1")
