"""Audit of issue 29 (interop and deployment), checked as the issue states it.

Promises checked:

- safetensors: ``Model.write(..., format="safetensors")`` / ``Model.read`` by extension
  or argument; conversion at the tensor-file level (:func:`fnnc.io.convert`) and
  ``python -m fnnc convert A B [--map FILE]`` between NNC SQLite and safetensors, names
  kept or mapped (a mapping file, a dict or a callable); metadata keeps the dtype and
  NNC's layout facts; fnnc -> safetensors -> fnnc bit-exact for float32 / float16 /
  bfloat16 / int tensors; a file the ``safetensors`` library wrote loads into a model
  through a name map; a file fnnc writes is read by the library. The file NNC itself
  wrote (``shared/nnc-files``) goes through the same paths.
- Export: ``Model.export(path, batch="b")`` writes a ``jax.export`` artifact for
  inference, parameters embedded or passed in, that a fresh process importing only
  ``jax`` and ``numpy`` runs at several batch sizes, matching ``evaluate`` to 1e-6;
  ``python -m fnnc inspect`` shows its signature; several platforms.
- NNC codecs: ``q4p`` .. ``q8p``, ``ezm7``, ``fpzip`` registered by default, written as an
  option of ``TensorFile.write`` / ``Model.write`` (and ``convert``), with s4nnc's
  identifiers in the row's ``type``; palettize round trips; a malformed codec blob is a
  ``TensorFileError`` naming the row.

Oracles: NumPy, the ``safetensors`` library itself, ``sqlite3`` on the raw columns, the
values NNC_FILES/README.md gives, and ``jax.export`` run without fnnc.
"""

from __future__ import annotations

import json
import os
import sqlite3
import struct
import subprocess
import sys
import sysconfig

import ml_dtypes
import numpy as np
import optax
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from fnnc.errors import ModelError, ParameterError, TensorFileError
from fnnc.io import SafetensorsFile, TensorFile, convert, registered_codecs
from fnnc.io.cli import main
from fnnc.models import BatchNorm, Concat, Dense, Input, LayerNorm, Model, ReLU, Sequential
from tests.helpers import (
    ACROSS_PLATFORMS_ATOL,
    NNC_FILES,
    cpu_and_here,
    fetch_rows,
    needs_nnc_files,
    subprocess_env,
)

NNC_TENSORS = NNC_FILES / "tensors.sqlite3"
IDS = {"q4p": 0x8A1E4B, "q5p": 0x8A1E5B, "q6p": 0x8A1E6B, "q7p": 0x8A1E7B, "q8p": 0x8A1E8B}
IDS |= {"ezm7": 0x511, "fpzip": 0xF7217}


def _nnc_values() -> dict[str, np.ndarray]:
    """The tensors NNC_FILES/README.md says ccv_nnc_tensor_write stored."""
    f16 = np.array([0, 1.5, -2.25, 65504, 0], np.float16)
    f16.view(np.uint16)[4] = 0x068D  # NNC's truncating float-to-half of 0.0001
    return {
        "f32": (np.arange(24, dtype=np.float32) * 0.5 - 3).reshape(2, 3, 4),
        "f16": f16,
        "f64": np.array([[1e-300], [3.25], [-7]], np.float64),
        "i32": np.array([1, -2, 3, 2147483647], np.int32),
        "i64": np.array([-1, 2**40], np.int64),
        "f32_any_device_macro": (np.arange(4, dtype=np.float32) + 0.25).reshape(2, 2),
    }


def _python_m_fnnc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fnnc", *args],
        capture_output=True, text=True, env=subprocess_env(), timeout=120,
    )  # fmt: skip


# -- safetensors and the files NNC wrote --------------------------------------------------


@needs_nnc_files
def test_an_nnc_written_file_converts_to_safetensors_the_library_reads(tmp_path):
    """convert(NNC file, .safetensors): the safetensors library reads NNC's values."""
    target = tmp_path / "nnc.safetensors"
    names = convert(NNC_TENSORS, target)
    assert names == sorted(TensorFile(NNC_TENSORS, readonly=True).names())
    loaded = load_file(str(target))
    for name, want in _nnc_values().items():
        assert loaded[name].dtype == want.dtype, name
        assert loaded[name].shape == want.shape, name
        assert loaded[name].tobytes() == want.tobytes(), name
    assert loaded["f32_nchw"].shape == (1, 2, 3, 4)


@needs_nnc_files
def test_safetensors_metadata_keeps_nnc_layout_facts(tmp_path):
    """The NCHW tag and NNC's device field survive in the safetensors header."""
    target = tmp_path / "nnc.safetensors"
    convert(NNC_TENSORS, target)
    with SafetensorsFile(target, readonly=True) as f:
        assert f.info("f32_nchw").format == "NCHW"
        assert f.info("f32").format == "NHWC"
        assert f.info("f32_any_device_macro").device == "CPU"
        assert f.info("f16").dtype == np.float16
    with safe_open(str(target), framework="numpy") as f:
        facts = json.loads(f.metadata()["fnnc"])["tensors"]
    assert facts["f32_nchw"]["format"] == "NCHW"


@needs_nnc_files
def test_nnc_file_to_safetensors_and_back_keeps_nnc_s_columns(tmp_path):
    """NNC -> safetensors -> NNC: type, format, datatype, shape and data bytes as NNC wrote."""
    middle, back = tmp_path / "m.safetensors", tmp_path / "back.sqlite3"
    convert(NNC_TENSORS, middle)
    convert(middle, back)
    query = "SELECT name, type, format, datatype, dim, data FROM tensors ORDER BY name"
    original, again = fetch_rows(NNC_TENSORS, query), fetch_rows(back, query)
    assert [r[0] for r in original] == [r[0] for r in again]
    for a, b in zip(original, again):
        assert a[1:4] == b[1:4], a[0]  # type (device too), format, datatype
        dims_a, dims_b = struct.unpack("<12i", a[4]), struct.unpack("<12i", b[4])
        shape_a = dims_a[: dims_a.index(0)] if 0 in dims_a else dims_a
        shape_b = dims_b[: dims_b.index(0)] if 0 in dims_b else dims_b
        assert shape_a == shape_b, a[0]
        assert a[5] == b[5], a[0]


def _special(dtype) -> np.ndarray:
    """Bit patterns of every kind: NaN payloads, signed zeros, infinities, subnormals."""
    rng = np.random.default_rng(7)
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        edge = np.array([info.min, info.max, 0, 1], dtype)
        return np.concatenate([edge, rng.integers(info.min, info.max, 60, dtype=dtype)])
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize]
    return rng.integers(0, np.iinfo(bits).max, 64, dtype=bits).view(dtype).reshape(4, 16)


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int32, np.int64, np.uint8]
)
def test_fnnc_to_safetensors_to_fnnc_is_bit_exact(tmp_path, dtype):
    """TensorFile -> convert -> .safetensors -> convert -> TensorFile keeps every bit."""
    x = _special(dtype)
    a, s, b = tmp_path / "a.sqlite", tmp_path / "a.safetensors", tmp_path / "b.sqlite"
    with TensorFile(a) as f:
        f.write("x", x, "CHWN")
    convert(a, s)
    convert(s, b)
    with TensorFile(b, readonly=True) as f:
        got = f.read("x")
        assert f.info("x").format == "CHWN"
    assert got.dtype == x.dtype and got.shape == x.shape and got.tobytes() == x.tobytes()
    library = load_file(str(s))["x"] if dtype is not ml_dtypes.bfloat16 else None
    if library is not None:
        assert library.dtype == x.dtype and library.tobytes() == x.tobytes()


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.uint16, np.uint32, np.bool_])
def test_safetensors_file_round_trips_other_int_dtypes(tmp_path, dtype):
    """SafetensorsFile.write / read keep int dtypes safetensors has and NNC lacks."""
    x = (np.arange(12) % 5).astype(dtype).reshape(3, 4)
    path = tmp_path / "i.safetensors"
    with SafetensorsFile(path) as f:
        f.write("x", x)
    got = SafetensorsFile(path).read("x")
    assert got.dtype == x.dtype and got.shape == x.shape and got.tobytes() == x.tobytes()
    assert load_file(str(path))["x"].tobytes() == x.tobytes()


def test_a_scalar_round_trips_through_safetensors_with_its_shape(tmp_path):
    """safetensors holds rank-0 tensors: a scalar written by fnnc reads back as shape ()."""
    path = tmp_path / "s.safetensors"
    with SafetensorsFile(path) as f:
        f.write("step", np.int64(3))
    assert load_file(str(path))["step"].shape == ()
    assert SafetensorsFile(path).read("step").shape == ()


# -- models and safetensors -------------------------------------------------------------


def _mlp(batchnorm: bool = False) -> Model:
    layers = [Dense(6, name="fc1"), ReLU(), Dense(3, name="fc2")]
    if batchnorm:
        layers.insert(1, BatchNorm(name="bn"))
    model = Sequential(layers)
    model.compile([np.zeros((4, 5), np.float32)])
    rng = np.random.default_rng(0)  # weights and statistics unlike the initial ones
    model.set_parameters(
        {
            k: rng.standard_normal(np.shape(v)).astype(np.float32)
            for k, v in model.parameters().items()
        }
    )
    return model


def test_model_write_safetensors_is_read_by_the_library_under_nnc_names(tmp_path):
    """Model.write(x.safetensors): the library reads every parameter and internal, bit-exact."""
    model = _mlp(batchnorm=True)
    params = model.parameters()
    model.write(tmp_path / "m.safetensors")
    loaded = load_file(str(tmp_path / "m.safetensors"))
    internals = {k for k in params if k.startswith("r-")}
    assert internals  # BatchNorm's running statistics
    want_rows = {f"{k}(0)" if k in internals else k for k in params}
    assert set(loaded) == want_rows
    for k, v in params.items():
        row = f"{k}(0)" if k in internals else k
        assert loaded[row].tobytes() == np.asarray(v).tobytes(), k
    model.write(tmp_path / "named.safetensors", name="mlp")
    assert set(load_file(str(tmp_path / "named.safetensors"))) == {
        f"__mlp__[{r}]" for r in want_rows
    }


def test_model_read_takes_format_by_argument_for_any_extension(tmp_path):
    """format="safetensors" on write and read of a path without the extension."""
    model = _mlp()
    model.write(tmp_path / "weights.bin", format="safetensors")
    assert set(load_file(str(tmp_path / "weights.bin"))) == set(model.parameters())
    other = Sequential([Dense(6, name="fc1"), ReLU(), Dense(3, name="fc2")])
    other.compile([np.zeros((4, 5), np.float32)])
    assert other.read(tmp_path / "weights.bin", format="safetensors") == []
    x = np.random.default_rng(1).standard_normal((2, 5)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(other.evaluate([x])), np.asarray(model.evaluate([x])))


def test_a_hugging_face_style_file_loads_through_a_callable_name_map(tmp_path):
    """Torch-layout names ("layers.0.weight") written by the library, mapped by a function."""
    rng = np.random.default_rng(2)
    w1, b1 = (
        rng.standard_normal((6, 5)).astype(np.float32),
        rng.standard_normal(6).astype(np.float32),
    )
    w2, b2 = (
        rng.standard_normal((3, 6)).astype(np.float32),
        rng.standard_normal(3).astype(np.float32),
    )
    path = str(tmp_path / "hf.safetensors")
    extra = {"lm_head.extra": np.zeros(2, np.float32)}
    save_file({"layers.0.weight": w1, "layers.0.bias": b1, "layers.2.weight": w2,
               "layers.2.bias": b2, **extra}, path)  # fmt: skip
    table = {"0": "fc1", "2": "fc2"}

    def rename(name: str) -> str | None:
        parts = name.split(".")
        if parts[0] != "layers":
            return None
        return f"t-{table[parts[1]]}-0-{0 if parts[2] == 'weight' else 1}"

    model = Sequential([Dense(6, name="fc1"), ReLU(), Dense(3, name="fc2")])
    model.compile([np.zeros((2, 5), np.float32)])
    assert model.read(path, rename=rename) == []
    x = rng.standard_normal((4, 5)).astype(np.float32)
    want = np.maximum(x @ w1.T + b1, 0) @ w2.T + b2
    np.testing.assert_allclose(np.asarray(model.evaluate([x])), want, rtol=1e-6, atol=1e-6)


def test_reading_a_foreign_safetensors_file_without_a_map_names_every_missing_id(tmp_path):
    """Without rename=, a file with other names reports each id the model lacks."""
    path = str(tmp_path / "hf.safetensors")
    save_file({"fc.weight": np.ones((3, 5), np.float32)}, path)
    model = Sequential([Dense(3, name="fc")])
    model.compile([np.zeros((2, 5), np.float32)])
    with pytest.raises(ParameterError) as e:
        model.read(path)
    assert "t-fc-0-0" in str(e.value) and "t-fc-0-1" in str(e.value)


def test_convert_maps_with_a_dict_or_callable_and_leaves_out_none(tmp_path):
    """A dict keeps names it does not hold; a callable's None leaves the tensor out."""
    source = tmp_path / "a.safetensors"
    save_file({"a": np.ones(2, np.float32), "b": np.zeros(3, np.int32)}, str(source))
    assert convert(source, tmp_path / "d.sqlite", rename={"a": "t-x-0-0"}) == ["b", "t-x-0-0"]
    assert TensorFile(tmp_path / "d.sqlite", readonly=True).names() == ["b", "t-x-0-0"]
    kept = convert(source, tmp_path / "c.sqlite", rename=lambda n: None if n == "b" else n + "!")
    assert kept == ["a!"]
    assert TensorFile(tmp_path / "c.sqlite", readonly=True).names() == ["a!"]


def test_convert_takes_formats_where_extensions_do_not_say(tmp_path):
    """source_format= / target_format= for files named .bin and .db."""
    with TensorFile(tmp_path / "w.db") as f:
        f.write("w", np.arange(6, dtype=np.float16).reshape(2, 3), "NCHW")
    convert(tmp_path / "w.db", tmp_path / "w.bin", target_format="safetensors")
    assert load_file(str(tmp_path / "w.bin"))["w"].tolist() == [[0, 1, 2], [3, 4, 5]]
    convert(tmp_path / "w.bin", tmp_path / "again.db", source_format="safetensors")
    with TensorFile(tmp_path / "again.db", readonly=True) as f:
        assert f.info("w").format == "NCHW" and f.read("w").dtype == np.float16


def test_convert_command_with_a_map_file_then_model_read(tmp_path):
    """`fnnc convert hf.safetensors out.sqlite --map map.json` feeds Model.read."""
    rng = np.random.default_rng(3)
    w, b = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    save_file({"fc.weight": w, "fc.bias": b, "unused": np.ones(1, np.float32)},
              str(tmp_path / "hf.safetensors"))  # fmt: skip
    (tmp_path / "map.json").write_text(
        json.dumps({"fc.weight": "t-fc-0-0", "fc.bias": "t-fc-0-1", "unused": None})
    )
    out = tmp_path / "out.sqlite"
    args = [str(tmp_path / "hf.safetensors"), str(out), "--map", str(tmp_path / "map.json")]
    assert main(["convert", *args]) == 0
    assert TensorFile(out, readonly=True).names() == ["t-fc-0-0", "t-fc-0-1"]
    model = Sequential([Dense(3, name="fc")])
    model.compile([np.zeros((2, 5), np.float32)])
    assert model.read(out) == []
    x = rng.standard_normal((2, 5)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(model.evaluate([x])), x @ w.T + b, rtol=1e-6, atol=1e-6)


@needs_nnc_files
def test_nnc_model_file_to_safetensors_by_command_line_reproduces_nnc_output(tmp_path):
    """NNC's model.sqlite3 -> `python -m fnnc convert` -> Model.read -> NNC's own output."""
    target = tmp_path / "mlp.safetensors"
    done = _python_m_fnnc("convert", str(NNC_FILES / "model.sqlite3"), str(target))
    assert done.returncode == 0, done.stderr
    model = Sequential([Dense(8), ReLU(), Dense(3)])
    model.compile([np.zeros((2, 4), np.float32)])
    assert model.read(target) == []
    x = np.array([i * 0.1 - 0.4 for i in range(8)], np.float32).reshape(2, 4)
    nnc_out = [[-0.0210937411, -0.219531253, 0.30859375], [0.11328125, -0.291406244, 0.375]]
    np.testing.assert_allclose(np.asarray(model.evaluate([x])), nnc_out, rtol=0, atol=1e-6)


# -- NNC's codecs -------------------------------------------------------------------------


def test_nnc_codecs_are_registered_by_default():
    """q4p..q8p, ezm7 and fpzip read without setup (s4nnc's identifiers)."""
    held = {c.name: i for i, c in registered_codecs().items()}
    for name, identifier in IDS.items():
        assert held.get(name) == identifier, name


@pytest.mark.parametrize(
    ("codec", "dtype", "count", "distinct"),
    [
        ("q4p", np.float32, 1200, 16),
        ("q5p", np.float16, 1200, 32),
        ("q6p", ml_dtypes.bfloat16, 1500, 64),
        ("q7p", np.float16, 600, 128),
        ("q8p", np.float32, 600, 256),
    ],
)
def test_palettized_rows_round_trip_when_the_palette_holds_every_value(
    tmp_path, codec, dtype, count, distinct
):
    """At most 2**bits distinct values per block: palettization is lossless."""
    rng = np.random.default_rng(4)
    levels = rng.permutation(np.linspace(-4, 4, distinct))
    x = levels[np.arange(count) % distinct].astype(dtype)
    path = tmp_path / "p.sqlite"
    with TensorFile(path) as f:
        f.write("x", x, encoder=codec)
        got = f.read("x")
    (type_,) = fetch_rows(path, "SELECT type FROM tensors WHERE name='x'")[0]
    assert (type_ & 0xFFFFFFFFFFFFFFFF) >> 32 == IDS[codec]
    assert got.dtype == x.dtype and got.tobytes() == x.tobytes()


def test_ezm7_keeps_values_with_seven_mantissa_bits_exactly(tmp_path):
    """ezm7 stores sign, exponent and 7 of float16's 10 mantissa bits."""
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 0x7C00, 4000, dtype=np.uint16) & ~np.uint16(0x7)  # 3 low bits 0
    x = (bits | (rng.integers(0, 2, 4000, dtype=np.uint16) << 15)).view(np.float16)
    with TensorFile(tmp_path / "e.sqlite") as f:
        f.write("x", x, encoder="ezm7")
        assert f.info("x").encoder == IDS["ezm7"]
        assert f.read("x").tobytes() == x.tobytes()


def test_fpzip_round_trips_float64_losslessly(tmp_path):
    """fpzip (the maintained Python binding is installed here): float64 bit-exact."""
    x = np.random.default_rng(6).standard_normal((3, 4, 50))
    with TensorFile(tmp_path / "f.sqlite") as f:
        f.write("x", x, encoder="fpzip")
        assert f.info("x").encoder == IDS["fpzip"]
        assert f.read("x").tobytes() == x.tobytes()


def test_model_write_takes_a_codec_and_reads_back(tmp_path):
    """Model.write(..., encoder="q4p"): rows carry q4p's id; 16 levels read back exactly."""
    model = Sequential([Dense(64, name="fc1"), ReLU(), Dense(8, name="fc2")])
    model.compile([np.zeros((2, 32), np.float32)])
    rng = np.random.default_rng(8)
    levels = np.linspace(-1, 1, 16).astype(np.float32)
    values = {k: rng.choice(levels, np.shape(v)) for k, v in model.parameters().items()}
    model.set_parameters(values)
    model.write(tmp_path / "q.sqlite", encoder="q4p")
    rows = dict(fetch_rows(tmp_path / "q.sqlite", "SELECT name, type FROM tensors"))
    assert rows["t-fc1-0-0"] >> 32 == IDS["q4p"]  # large rows are palettized
    other = Sequential([Dense(64, name="fc1"), ReLU(), Dense(8, name="fc2")])
    other.compile([np.zeros((2, 32), np.float32)])
    assert other.read(tmp_path / "q.sqlite") == []
    for k, v in values.items():
        np.testing.assert_array_equal(np.asarray(other.parameters()[k]), v)
    with pytest.raises(TensorFileError, match="codec"):
        model.write(tmp_path / "q.safetensors", encoder="q4p")


def test_convert_decodes_codec_rows_and_encodes_on_request(tmp_path):
    """NNC file with q6p rows -> safetensors holds decoded values; back with encoder="q6p"."""
    levels = np.linspace(-2, 2, 40).astype(np.float32)
    x = levels[np.arange(1024) % 40].reshape(32, 32)
    with TensorFile(tmp_path / "a.sqlite") as f:
        f.write("x", x, encoder="q6p")
    convert(tmp_path / "a.sqlite", tmp_path / "a.safetensors")
    np.testing.assert_array_equal(load_file(str(tmp_path / "a.safetensors"))["x"], x)
    convert(tmp_path / "a.safetensors", tmp_path / "b.sqlite", encoder="q6p")
    (type_,) = fetch_rows(tmp_path / "b.sqlite", "SELECT type FROM tensors")[0]
    assert type_ >> 32 == IDS["q6p"]
    np.testing.assert_array_equal(TensorFile(tmp_path / "b.sqlite", readonly=True).read("x"), x)


def _damage(path: os.PathLike, blob: bytes) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE tensors SET data=? WHERE name='row'", (blob,))
        conn.execute("DROP TABLE IF EXISTS fnnc_checksums")  # as NNC would leave it
    conn.close()


@pytest.mark.parametrize(
    ("codec", "blob"),
    [
        ("q8p", struct.pack("<I", 16384) + bytes(7)),
        ("q7p", struct.pack("<I", 8192) + bytes(300)),
        ("q6p", b"\x01"),
        ("q8p", struct.pack("<I", 3) + bytes(5000)),
    ],
)
def test_a_malformed_codec_blob_is_a_tensor_file_error_naming_the_row(tmp_path, codec, blob):
    """A damaged palettized row raises TensorFileError naming it, also through Model.read."""
    path = tmp_path / "bad.sqlite"
    levels = np.linspace(-1, 1, 8).astype(np.float32)
    with TensorFile(path) as f:
        f.write("row", levels[np.arange(600) % 8], encoder=codec)
        assert f.info("row").encoder == IDS[codec]
    _damage(path, blob)
    with pytest.raises(TensorFileError, match=r"tensor 'row'") as e:
        TensorFile(path, readonly=True).read("row")
    assert codec in str(e.value)
    with pytest.raises(TensorFileError, match=r"tensor 'row'"):
        convert(path, tmp_path / "out.safetensors")


# -- export -------------------------------------------------------------------------------

RUNNER = """
import importlib.abc, sys
sys.path.append(sys.argv[1])
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "fnnc" or name.startswith("fnnc."):
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Hide())
import jax, numpy as np
exported = jax.export.deserialize(bytearray(open(sys.argv[2], "rb").read()))
data = np.load(sys.argv[3])
out = {}
for n in (1, 3, 9):
    got = exported.call(data[f"a{n}"], data[f"b{n}"])
    out[f"y{n}"], out[f"z{n}"] = np.asarray(got[0]), np.asarray(got[1])
np.savez(sys.argv[4], **out)
print("fnnc modules:", sorted(m for m in sys.modules if m.split(".")[0] == "fnnc"))
"""


@pytest.fixture(scope="module")
def two_way():
    """A trained model with two inputs and two outputs (a LayerNorm, a Concat)."""
    a, b = Input(), Input()
    h = LayerNorm(name="ln")(Concat(axis=-1)(Dense(4, name="fa")(a), Dense(4, name="fb")(b)))
    model = Model([a, b], [Dense(2, name="o")(h), ReLU()(h)])
    rng = np.random.default_rng(9)
    xa, xb = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((3, 2))
    model.compile([xa, xb.astype(np.float32)], loss="mse", minimizer=optax.sgd(0.1))
    # loss="mse" compares the first output with one target (the ReLU output is untrained)
    model.fit([xa, xb.astype(np.float32)], np.ones((3, 2), np.float32))
    return model


def _inputs(n: int, seed: int = 10) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + n)
    return [rng.standard_normal((n, 5)).astype(np.float32),
            rng.standard_normal((n, 2)).astype(np.float32)]  # fmt: skip


def test_exported_artifact_runs_without_fnnc_at_several_batch_sizes(two_way, tmp_path):
    """A process where fnnc cannot be imported runs one artifact at batch 1, 3 and 9."""
    artifact = tmp_path / "model.jax"
    two_way.export(artifact, batch="b", platforms=cpu_and_here())
    arrays = {}
    for n in (1, 3, 9):
        arrays[f"a{n}"], arrays[f"b{n}"] = _inputs(n)
    np.savez(tmp_path / "in.npz", **arrays)
    (script := tmp_path / "runner.py").write_text(RUNNER)
    env = {"PATH": os.environ.get("PATH", ""), "JAX_PLATFORMS": "cpu"}
    purelib = sysconfig.get_paths()["purelib"]
    command = [sys.executable, "-I", "-S", str(script), purelib, str(artifact),
               str(tmp_path / "in.npz"), str(tmp_path / "out.npz")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fnnc modules: []" in done.stdout
    got = np.load(tmp_path / "out.npz")
    for n in (1, 3, 9):
        want_y, want_z = two_way.evaluate(_inputs(n))
        np.testing.assert_allclose(got[f"y{n}"], want_y, rtol=0, atol=ACROSS_PLATFORMS_ATOL)
        np.testing.assert_allclose(got[f"z{n}"], want_z, rtol=0, atol=ACROSS_PLATFORMS_ATOL)


def test_exported_with_parameters_passed_in_runs_other_weights(two_way, tmp_path):
    """parameters="argument": one artifact, weights as its first argument (a dict by id)."""
    import jax

    exported = two_way.export(tmp_path / "arg.jax", batch="b", parameters="argument")
    loaded = jax.export.deserialize(bytearray((tmp_path / "arg.jax").read_bytes()))
    params = two_way.parameters()
    scaled = {k: np.asarray(v) * 0.5 for k, v in params.items()}
    x = _inputs(4)
    y, z = loaded.call(scaled, *x)
    h_a, h_b = x[0] @ scaled["t-fa-0-0"].T + scaled["t-fa-0-1"], x[1] @ scaled["t-fb-0-0"].T
    h = np.concatenate([h_a, h_b + scaled["t-fb-0-1"]], -1)
    ln_ids = sorted(k for k in scaled if k.startswith("t-ln"))
    assert len(ln_ids) == 2
    mean, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    normed = (h - mean) / np.sqrt(var + 1e-5) * scaled[ln_ids[0]] + scaled[ln_ids[1]]
    np.testing.assert_allclose(np.asarray(z), np.maximum(normed, 0), rtol=1e-4, atol=1e-5)
    want_y = normed @ scaled["t-o-0-0"].T + scaled["t-o-0-1"]
    np.testing.assert_allclose(np.asarray(y), want_y, rtol=1e-4, atol=1e-5)
    assert str(exported.in_avals[-1].shape[0]) == "b"


def test_export_for_several_platforms_runs_here(two_way, tmp_path):
    """platforms=("cpu", "cuda"): one artifact lowered for both, runnable on the CPU."""
    import jax

    two_way.export(tmp_path / "multi.jax", platforms=("cpu", "cuda"))
    loaded = jax.export.deserialize(bytearray((tmp_path / "multi.jax").read_bytes()))
    assert set(loaded.platforms) == {"cpu", "cuda"}
    x = _inputs(2)
    for got, want in zip(loaded.call(*x), two_way.evaluate(x)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-6)


def test_inspect_shows_the_exported_signature(two_way, tmp_path, capsys):
    """`python -m fnnc inspect model.jax`: inputs and outputs with the symbolic batch."""
    two_way.export(tmp_path / "model.jax", batch="n")
    assert main(["inspect", str(tmp_path / "model.jax")]) == 0
    out = capsys.readouterr().out
    assert "float32[n,5]" in out and "float32[n,2]" in out and "float32[n,8]" in out
    assert "symbolic dimensions: n" in out


def test_exporting_an_uncompiled_model_is_a_clear_error(tmp_path):
    """Model.export before compile raises ModelError saying so."""
    with pytest.raises(ModelError, match="compile"):
        Sequential([Dense(2)]).export(tmp_path / "m.jax")
