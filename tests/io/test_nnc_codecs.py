"""NNC's codecs in tensor files: registered by default, the blobs s4nnc writes (its
identifiers and headers), lossy round trips against their definitions, declines, and
malformed blobs raising a TensorFileError that names the row."""

import struct
import sys
import zlib

import ml_dtypes
import numpy as np
import pytest

from fnnc.errors import TensorFileError
from fnnc.io import TensorFile, registered_codecs
from fnnc.io.nnc_codecs import CODECS
from fnnc.io.palettize import depalettize, palettize

S4NNC_IDS = {"q4p": 0x8A1E4B, "q5p": 0x8A1E5B, "q6p": 0x8A1E6B, "q7p": 0x8A1E7B}
S4NNC_IDS |= {"q8p": 0x8A1E8B, "ezm7": 0x511, "zip": 0x217, "fpzip": 0xF7217}


def test_nnc_codecs_are_registered_by_default_under_s4nnc_identifiers():
    held = registered_codecs()
    for name, identifier in S4NNC_IDS.items():
        assert held[identifier].name == name


def _raw_deflate(data):
    packer = zlib.compressobj(-1, zlib.DEFLATED, -15, 9)
    return packer.compress(data) + packer.flush()


def _write_row(path, name, dtype_code, shape, identifier, blob):
    """A row as NNC writes one with an encoder: no checksum, the id in type's high bits."""
    import sqlite3

    with TensorFile(path) as f:
        f.write("other", np.zeros(1, np.float32))  # creates NNC's table
    conn = sqlite3.connect(path)
    dim = struct.pack("<12i", *shape, *[0] * (12 - len(shape)))
    type_ = (identifier << 32) | (0xFFF << 8) | 1
    conn.execute(
        "REPLACE INTO tensors VALUES (?, ?, 2, ?, ?, ?)", (name, type_, dtype_code, dim, blob)
    )
    conn.commit()
    conn.close()


def test_reads_a_q4p_row_as_s4nnc_writes_it(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 400)).astype(np.float16)
    blob = struct.pack("<I", 512) + palettize(x, 4, 512)  # s4nnc: block size, then NNC's
    path = str(tmp_path / "s4nnc.sqlite")
    _write_row(path, "w", 0x20000, x.shape, 0x8A1E4B, blob)
    with TensorFile(path, readonly=True) as f:
        got = f.read("w")
        assert f.info("w").encoder == 0x8A1E4B
    assert got.shape == (3, 400)
    assert got.tobytes() == depalettize(blob[4:], np.float16, x.size, 4, 512).tobytes()


def test_reads_an_ezm7_row_built_from_its_definition(tmp_path):
    h = np.array([0x3C00, 0xBC01, 0x7BFF, 0x0001, 0x8000, 0x3555], np.uint16)
    exponents = bytes(int((v >> 10) & 31) for v in h)
    rest = bytes(int(((v >> 15) << 7) | ((v & 0x3FF) >> 3)) for v in h)
    zipped = _raw_deflate(exponents)
    blob = struct.pack("<i", len(zipped)) + zipped + rest
    path = str(tmp_path / "e.sqlite")
    _write_row(path, "h", 0x20000, (6,), 0x511, blob)
    got = TensorFile(path, readonly=True).read("h").view(np.uint16)
    want = [((v >> 15) << 15) | (((v >> 10) & 31) << 10) | (((v & 0x3FF) >> 3) << 3) for v in h]
    assert got.tolist() == [int(w) for w in want]


def _truncated_bits(number, bit_count=3):
    """s4nnc's truncatedBits (Store.swift), one value at a time."""
    discard = number & ((1 << bit_count) - 1)
    threshold = 1 << (bit_count - 1)
    shifted = number >> bit_count
    if discard > threshold or (discard == threshold and shifted & 1):
        shifted += 1
    return shifted


def test_ezm7_encodes_every_float16_as_s4nnc_does(tmp_path):
    h = np.arange(65536, dtype=np.uint16)
    expected = []
    for v in h.tolist():
        m = _truncated_bits(v & 0x3FF)
        m = (v & 0x3FF) >> 3 if m & 0x80 else m
        expected.append((v & 0xFC00) | (m << 3))
    with TensorFile(str(tmp_path / "e.sqlite")) as f:
        f.write("h", h.view(np.float16), encoder="ezm7")
        _, blob, _ = f.load_row("h", decode=False)
        got = f.read("h").view(np.uint16)
    assert got.tolist() == expected
    (size,) = struct.unpack_from("<i", blob)
    assert blob[4 : 4 + size] == _raw_deflate(((h >> 10) & 31).astype(np.uint8).tobytes())


@pytest.mark.parametrize("codec", ["q4p", "q6p", "zip"])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_write_with_a_codec_option_and_read_back(tmp_path, codec, dtype):
    rng = np.random.default_rng(1)
    x = np.repeat(rng.standard_normal(40), 30).astype(dtype)  # 40 distinct values
    with TensorFile(str(tmp_path / "c.sqlite")) as f:
        f.write("x", x, encoder=codec)
        assert f.info("x").encoder == S4NNC_IDS[codec]
        _, blob, _ = f.load_row("x", decode=False)
        got = f.read("x")
    if codec == "zip":
        assert got.tobytes() == x.tobytes() and len(blob) < x.nbytes
    else:
        block = struct.unpack_from("<I", blob)[0]
        assert block == {"q4p": 512, "q6p": 4096}[codec]
        if codec == "q6p":  # 40 values, 64 entries: lossless
            assert got.tobytes() == x.tobytes()
        assert np.abs(got.astype(np.float32) - x.astype(np.float32)).max() < 0.2


def test_codecs_decline_as_nnc_does(tmp_path):
    with TensorFile(str(tmp_path / "d.sqlite")) as f:
        f.write("small", np.ones(8, np.float32), encoder="q4p")  # palette > raw bytes
        f.write("ints", np.arange(5000, dtype=np.int32), encoder="q8p")
        f.write("f32", np.ones(5000, np.float32), encoder="ezm7")  # float16 only
        for name in ("small", "ints", "f32"):
            assert f.info(name).encoder == 0
        assert (f.read("ints") == np.arange(5000)).all()


def _damaged(tmp_path, codec, blob, dtype=np.float32, shape=(600,)):
    path = str(tmp_path / f"bad-{codec}.sqlite")
    with TensorFile(path) as f:
        f.write("row", (np.arange(shape[0]) % 7).astype(dtype), encoder=codec)
        assert f.info("row").encoder == S4NNC_IDS[codec]
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("UPDATE tensors SET data=? WHERE name='row'", (blob,))
    conn.execute("DROP TABLE fnnc_checksums")  # as if NNC had written it
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize(
    ("codec", "blob", "why"),
    [
        ("q4p", b"\x00\x02", "too short"),
        ("q4p", struct.pack("<I", 512) + bytes(100), "bytes needed"),
        ("q4p", struct.pack("<I", 0) + bytes(10000), "block size 0"),
        ("q5p", struct.pack("<I", 12) + bytes(10000), "multiple of 8"),
        ("zip", b"not deflate", "Error"),
        ("zip", _raw_deflate(bytes(10)), "not 2400"),
        ("ezm7", struct.pack("<i", 10**9) + bytes(20), "cannot hold"),
        ("ezm7", struct.pack("<i", 4) + b"\xff\xff\xff\xff" + bytes(5000), "Error"),
    ],
)
def test_malformed_codec_blobs_raise_naming_the_row(tmp_path, codec, blob, why):
    dtype = np.float16 if codec == "ezm7" else np.float32
    path = _damaged(tmp_path, codec, blob, dtype)
    with TensorFile(path, readonly=True) as f, pytest.raises(TensorFileError) as e:
        f.read("row")
    assert "tensor 'row'" in str(e.value) and f"decoder {codec}" in str(e.value)
    assert why in str(e.value)


def test_unknown_codec_name_is_a_clear_error(tmp_path):
    with TensorFile(str(tmp_path / "u.sqlite")) as f, pytest.raises(TensorFileError) as e:
        f.write("x", np.ones(4, np.float32), encoder="q3p")
    assert "no codec named 'q3p'" in str(e.value) and "q8p" in str(e.value)


def test_fpzip_without_its_package_names_the_codec(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "fpzip", None)  # import fpzip raises ImportError
    with TensorFile(str(tmp_path / "f.sqlite")) as f, pytest.raises(TensorFileError) as e:
        f.write("x", np.ones(4000, np.float32), encoder="fpzip")
    assert "fpzip codec (0xf7217)" in str(e.value) and "pip install fpzip" in str(e.value)
    path = str(tmp_path / "g.sqlite")
    _write_row(path, "w", 0x4000, (4,), 0xF7217, bytes(40))
    with pytest.raises(TensorFileError, match=r"tensor 'w'.*fpzip codec \(0xf7217\)"):
        TensorFile(path, readonly=True).read("w")


def test_fpzip_round_trip_where_the_package_is_installed(tmp_path):
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5, 6)).astype(np.float32)
    with TensorFile(str(tmp_path / "f.sqlite")) as f:
        f.write("x", x, encoder=CODECS["fpzip"])
        assert f.info("x").encoder == 0xF7217
        assert f.read("x").tobytes() == x.tobytes()  # precision 32: lossless


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_palettized_codecs_store_a_row_with_non_finite_values_raw(tmp_path, dtype, bad):
    x = np.linspace(-1, 1, 512).astype(dtype)
    x[100] = bad
    nnc = depalettize(palettize(x, 4, 512), dtype, x.size, 4, 512)  # what NNC's codec keeps
    assert (~np.isfinite(nnc)).sum() >= 1 and not np.array_equal(nnc, x, equal_nan=True)
    with TensorFile(str(tmp_path / "n.sqlite")) as f:
        f.write("x", x, encoder="q4p")
        f.write("clean", np.linspace(-1, 1, 512).astype(dtype), encoder="q4p")
        assert f.info("x").encoder == 0 and f.info("clean").encoder == 0x8A1E4B
        assert f.read("x").tobytes() == x.tobytes()
