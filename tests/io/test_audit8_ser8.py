"""Audit 8 of the io tools: safetensors interop, checked against the ``safetensors``
library's own bytes."""

import json
import struct

import jax
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from fnnc.errors import DTypeError
from fnnc.io import SafetensorsFile, TensorFile, convert
from fnnc.io.cli import main

FLOAT8 = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"]


def _library_bytes(path, name):
    """The tensor's dtype code, shape and bytes, read from the file's header by hand."""
    blob = path.read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    entry = json.loads(blob[8 : 8 + length])[name]
    start, end = entry["data_offsets"]
    return entry["dtype"], entry["shape"], blob[8 + length + start : 8 + length + end]


@pytest.mark.parametrize("kind", FLOAT8)
def test_float8_tensors_read_and_the_file_stays_writable(tmp_path, kind):
    """The library's NumPy reader has no float8: a file the library (or fnnc itself)
    wrote with an F8 tensor read as 'cannot read it into NumPy', inspect called it
    damaged, and every later write to the file failed the same way."""
    dtype = np.dtype(getattr(ml_dtypes, kind))
    x = np.array([[0.5, -1.0, 2.0], [0.25, 4.0, -0.125]]).astype(dtype)
    if kind == "float8_e8m0fnu":
        x = np.abs(x.astype(np.float32)).astype(dtype)  # no sign bit
    path = tmp_path / "fp8.safetensors"
    save_file({"w": x, "b": np.ones(2, np.float32)}, str(path))
    code, shape, raw = _library_bytes(path, "w")
    with SafetensorsFile(path) as f:
        got = f.read("w")
        assert (got.dtype, list(got.shape), got.tobytes()) == (dtype, shape, raw)
        assert f.info("w").dtype == dtype and f.info("w").shape == (2, 3)
        f.write("c", np.zeros(1, np.float32))  # rewrites the file, the F8 tensor with it
    assert _library_bytes(path, "w") == (code, shape, raw)
    assert main(["inspect", "--stats", str(path)]) == 0


def test_float8_to_an_nnc_file_is_a_dtype_error_naming_the_tensor(tmp_path):
    path = tmp_path / "fp8.safetensors"
    save_file({"w": np.ones(2, ml_dtypes.float8_e4m3fn)}, str(path))
    with pytest.raises(DTypeError, match=r"tensor 'w'.*float8_e4m3fn"):
        convert(path, tmp_path / "out.sqlite")


def test_verify_checks_a_safetensors_file_and_an_exported_artifact(tmp_path, capsys):
    """``inspect --verify`` opened every file as SQLite: a sound safetensors file or
    jax.export artifact got 'not an SQLite database' and exit status 1."""
    good = tmp_path / "w.bin"  # recognised by its contents, as inspect does
    save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(good))
    assert main(["inspect", "--verify", str(good)]) == 0
    out, err = capsys.readouterr()
    assert "1 tensors: 1 read, 0 damaged" in out and not err
    blob = bytearray(good.read_bytes())
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(bytes(blob[:-4]))  # the data ends before its header says
    assert main(["inspect", "--verify", str(bad)]) == 1
    assert "Traceback" not in capsys.readouterr().err

    exported = jax.export.export(jax.jit(lambda x: 2 * x))(jax.ShapeDtypeStruct((3,), np.float32))
    artifact = tmp_path / "double.jax"
    artifact.write_bytes(exported.serialize())
    assert main(["inspect", "--verify", str(artifact)]) == 0
    out, err = capsys.readouterr()
    assert "its module reads" in out and not err


def test_a_safetensors_file_of_another_name_is_named_as_such(tmp_path, capsys):
    """inspect recognised ``w.bin`` as safetensors by its contents; convert (which goes
    by the extension) said only 'not an SQLite database ... check the path'."""
    source = tmp_path / "w.bin"
    tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([7], np.int64)}
    save_file(tensors, str(source))
    target = str(tmp_path / "w.sqlite")
    assert main(["convert", str(source), target]) == 1
    assert "holds a safetensors file" in capsys.readouterr().err
    assert main(["convert", "--from", "safetensors", str(source), target]) == 0
    with TensorFile(target, readonly=True) as f:
        for name, value in load_file(str(source)).items():
            got = f.read(name)
            assert got.dtype == value.dtype and np.array_equal(got, value)


def test_info_comes_from_the_header_without_reading_the_data(tmp_path, monkeypatch):
    """info() read each whole tensor for its dtype and shape, so listing a checkpoint
    (inspect without --stats) read every byte of it."""
    tensors = {
        "f32": np.ones((2, 3), np.float32),
        "i8": np.arange(4, dtype=np.int8),
        "bool": np.array([True]),
        "bf16": np.ones(3, ml_dtypes.bfloat16),
        "f8": np.ones((1, 2), ml_dtypes.float8_e5m2),
        "scalar": np.array(1.5, np.float64),
        "empty": np.zeros((0, 4), np.float16),
    }
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    f = SafetensorsFile(path, readonly=True)

    def no_data(name):
        raise AssertionError(f"read the data of {name}")

    monkeypatch.setattr(f, "_raw", no_data)
    for name, value in tensors.items():
        info = f.info(name)
        _, shape, raw = _library_bytes(path, name)
        assert (info.dtype, list(info.shape), info.nbytes) == (value.dtype, shape, len(raw))
