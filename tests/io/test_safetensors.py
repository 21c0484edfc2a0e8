"""safetensors both ways: bit-exact round trips through NNC tensor files, files the
``safetensors`` library writes and reads, name maps into a model, the command line."""

import contextlib
import hashlib
import json
import os
import sqlite3
import struct

import ml_dtypes
import numpy as np
import optax
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from fnnc.errors import DTypeError, TensorFileError, TensorNotFoundError
from fnnc.io import SafetensorsFile, TensorFile, convert, read_parameters, write_parameters
from fnnc.io.cli import main
from fnnc.models import Dense, Input, Model


def _arrays():
    rng = np.random.default_rng(0)
    bits16 = rng.integers(0, 2**16, 257, dtype=np.uint16)  # every kind of half, NaNs too
    bits32 = rng.integers(0, 2**32, (4, 33), dtype=np.uint32)
    return {
        "f32": bits32.view(np.float32),
        "f16": bits16.view(np.float16),
        "bf16": bits16.view(ml_dtypes.bfloat16).reshape(1, 257),
        "f64": rng.standard_normal((2, 3, 4)),
        "i32": rng.integers(-(2**31), 2**31, 9, dtype=np.int64).astype(np.int32),
        "i64": rng.integers(-(2**62), 2**62, (3, 3), dtype=np.int64),
        "u8": np.arange(256, dtype=np.uint8),
    }


def test_nnc_to_safetensors_to_nnc_is_bit_exact(tmp_path):
    a, s, b = tmp_path / "a.sqlite", tmp_path / "a.safetensors", tmp_path / "b.sqlite"
    with TensorFile(a) as f, f.transaction():
        for i, (name, x) in enumerate(_arrays().items()):
            f.write(name, x, ("NHWC", "NCHW", "CHWN")[i % 3], device=("CPU", "GPU:1")[i % 2])
    assert convert(a, s) == sorted(_arrays())
    assert convert(s, b) == sorted(_arrays())
    with TensorFile(a, readonly=True) as fa, TensorFile(b, readonly=True) as fb:
        for name, x in _arrays().items():
            got = fb.read(name)
            assert got.dtype == x.dtype and got.shape == x.shape
            assert got.tobytes() == x.tobytes()
            ia, ib = fa.info(name), fb.info(name)
            assert (ib.format, ib.device) == (ia.format, ia.device)
    with safe_open(str(s), framework="numpy") as f:  # the facts NNC keeps, in the header
        facts = json.loads(f.metadata()["fnnc"])["tensors"]
    assert facts["f16"] == {"format": "NCHW", "device": "GPU:1"}


def test_the_safetensors_library_reads_what_fnnc_writes(tmp_path):
    path = tmp_path / "w.safetensors"
    with SafetensorsFile(path, metadata={"source": "fnnc test"}) as f, f.transaction():
        for name, x in _arrays().items():
            f.write(name, x)
    loaded = load_file(str(path))
    with safe_open(str(path), framework="numpy") as f:
        assert f.metadata()["source"] == "fnnc test"
        bf16 = f.get_tensor("bf16")
    for name, x in _arrays().items():
        if name != "bf16":
            assert loaded[name].dtype == x.dtype and loaded[name].tobytes() == x.tobytes()
    assert bf16.dtype == ml_dtypes.bfloat16 and bf16.tobytes() == _arrays()["bf16"].tobytes()


def _model():
    x = Input()
    model = Model(x, Dense(3, name="fc")(x))
    model.compile(np.zeros((2, 4), np.float32), loss="mse", minimizer=optax.sgd(0.1))
    return model


def test_a_file_the_safetensors_library_wrote_loads_into_a_model_through_a_name_map(tmp_path):
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((3, 4)).astype(np.float32)
    bias = rng.standard_normal(3).astype(np.float32)
    path = str(tmp_path / "hf.safetensors")
    save_file({"fc.weight": weight, "fc.bias": bias, "extra": np.ones(2, np.int64)}, path)
    model = _model()
    (name_map := tmp_path / "map.json").write_text(
        json.dumps({"fc.weight": "t-fc-0-0", "fc.bias": "t-fc-0-1", "extra": None})
    )
    for rename in (
        {"fc.weight": "t-fc-0-0", "fc.bias": "t-fc-0-1"},
        str(name_map),
        lambda n: {"fc.weight": "t-fc-0-0", "fc.bias": "t-fc-0-1"}.get(n),
    ):
        model.set_parameters({k: np.zeros_like(v) for k, v in model.parameters().items()})
        assert model.read(path, rename=rename) == []
        x = rng.standard_normal((5, 4)).astype(np.float32)
        np.testing.assert_allclose(model.evaluate(x), x @ weight.T + bias, rtol=1e-6, atol=1e-6)


def test_model_write_and_read_safetensors_by_extension_or_argument(tmp_path):
    model = _model()
    model.fit(np.ones((2, 4), np.float32), np.ones((2, 3), np.float32))
    want = model.parameters()
    model.write(tmp_path / "m.safetensors", name="mlp")
    model.write(tmp_path / "m.bin", name="mlp", format="safetensors")
    assert sorted(load_file(str(tmp_path / "m.bin"))) == ["__mlp__[t-fc-0-0]", "__mlp__[t-fc-0-1]"]
    for path in (tmp_path / "m.safetensors", tmp_path / "m.bin"):
        other = _model()
        assert (
            other.read(path, name="mlp", format="safetensors" if path.suffix == ".bin" else None)
            == []
        )
        for k, v in want.items():
            assert np.asarray(other.parameters()[k]).tobytes() == np.asarray(v).tobytes()
    with pytest.raises(TensorFileError, match="not an SQLite database"):
        _model().read(tmp_path / "m.bin", name="mlp")  # an NNC file by default: it is not


def test_parameters_functions_take_safetensors_paths(tmp_path):
    path = tmp_path / "p.safetensors"
    write_parameters(path, {"t-a-0-0": np.eye(2, dtype=np.float32)}, name="n",
                     internals={"r-a-0-0": np.zeros(2, np.float32)})  # fmt: skip
    got = read_parameters(path, name="n")
    assert list(got) == ["t-a-0-0"] and list(got.internals) == ["r-a-0-0"]
    assert sorted(load_file(str(path))) == ["__n__[r-a-0-0(0)]", "__n__[t-a-0-0]"]


def assert_left_empty(path):
    """A new file whose one transaction failed: created, but nothing written (it is not
    removed, as another process may have opened it meanwhile)."""
    assert path.stat().st_size == 0 and not os.path.exists(f"{path}-journal")
    with pytest.raises(TensorFileError, match=r"the file is empty .*no tensors were written"):
        TensorFile(path, readonly=True)


def test_bad_input_is_a_clear_error(tmp_path):
    (garbage := tmp_path / "g.safetensors").write_bytes(b"\xff" * 20)
    with pytest.raises(TensorFileError, match="not a readable safetensors file"):
        SafetensorsFile(garbage)
    with pytest.raises(TensorFileError, match="no such safetensors file"):
        SafetensorsFile(tmp_path / "missing.safetensors", readonly=True)
    save_file(
        {"a": np.ones(2, np.int16), "b": np.ones(2, np.float32)}, str(tmp_path / "i.safetensors")
    )
    with pytest.raises(DTypeError, match=r"tensor 'a'.*NNC has no datatype for int16"):
        convert(tmp_path / "i.safetensors", tmp_path / "i.sqlite")
    assert_left_empty(tmp_path / "i.sqlite")  # one transaction: nothing written
    with pytest.raises(TensorFileError, match="both map to 'x'"):
        convert(tmp_path / "i.safetensors", tmp_path / "j.safetensors", rename=lambda n: "x")
    with pytest.raises(TensorFileError, match="safetensors has no codecs"):
        SafetensorsFile(tmp_path / "k.safetensors").write("a", np.ones(2), encoder="zip")
    (bad_map := tmp_path / "map.json").write_text("[1, 2]")
    with pytest.raises(TensorFileError, match="expected a JSON object"):
        convert(tmp_path / "i.safetensors", tmp_path / "l.safetensors", rename=bad_map)
    with pytest.raises(TensorNotFoundError, match="no tensor 'c'"):
        SafetensorsFile(tmp_path / "i.safetensors").read("c")


def test_command_line_convert_and_inspect(tmp_path, capsys):
    save_file({"fc.weight": np.ones((3, 4), np.float32)}, str(tmp_path / "hf.safetensors"))
    (tmp_path / "map.json").write_text('{"fc.weight": "t-fc-0-0"}')
    args = [str(tmp_path / "hf.safetensors"), str(tmp_path / "out.sqlite")]
    assert main(["convert", *args, "--map", str(tmp_path / "map.json"), "--encoder", "zip"]) == 0
    with TensorFile(tmp_path / "out.sqlite", readonly=True) as f:
        assert f.names() == ["t-fc-0-0"] and f.info("t-fc-0-0").encoder == 0x217
        assert (f.read("t-fc-0-0") == 1).all()
    assert main(["inspect", "--stats", str(tmp_path / "hf.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "fc.weight  float32  [3, 4]  NHWC    48     1    1    1     0" in out
    assert main(["convert", str(tmp_path / "nope.sqlite"), str(tmp_path / "x.safetensors")]) == 1
    assert "python -m fnnc convert: error:" in capsys.readouterr().err


def test_writing_into_a_missing_folder_names_the_path(tmp_path, capsys):
    target = tmp_path / "missing" / "w.safetensors"
    with pytest.raises(TensorFileError) as e:
        SafetensorsFile(target).write("w", np.ones(2, np.float32))
    message = str(e.value)
    assert message.startswith(f"{target}: cannot write: the folder {target.parent} does not")
    assert "tmp" not in message.replace(str(tmp_path), "")  # no temporary file's name
    save_file({"w": np.ones(2, np.float32)}, str(tmp_path / "a.safetensors"))
    assert main(["convert", str(tmp_path / "a.safetensors"), str(target)]) == 1
    err = capsys.readouterr().err
    assert f"error: {target}: cannot write" in err and "Traceback" not in err
    assert not target.parent.exists()


def test_a_failed_convert_leaves_a_new_file_empty_and_an_old_one_unchanged(tmp_path, capsys):
    source = tmp_path / "a.sqlite"
    with TensorFile(source) as f:
        f.write("x", np.arange(4, dtype=np.float32))
        f.write("y", np.arange(3, dtype=np.int32))
    new = tmp_path / "new.sqlite"
    assert main(["convert", str(source), str(new), "--encoder", "nope"]) == 1
    assert "no codec named 'nope'" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["a.sqlite", "new.sqlite"]
    assert_left_empty(new)
    with pytest.raises(TensorFileError, match="no codec named 'nope'"):
        write_parameters(new, {"w": np.ones(2, np.float32)}, encoder="nope")
    assert sorted(os.listdir(tmp_path)) == ["a.sqlite", "new.sqlite"]
    assert_left_empty(new)
    old = tmp_path / "nnc.sqlite"  # as NNC writes it: no fnnc tables
    with contextlib.closing(sqlite3.connect(old)) as conn:
        conn.execute(
            "CREATE TABLE tensors (name TEXT, type INTEGER, format INTEGER, datatype INTEGER, "
            "dim BLOB, data BLOB, PRIMARY KEY (name))"
        )
        dim = struct.pack("<12i", 2, *[0] * 11)
        conn.execute("INSERT INTO tensors VALUES ('x', 1, 2, 16384, ?, ?)", (dim, bytes(8)))
        conn.commit()
    before = hashlib.sha256(old.read_bytes()).hexdigest()
    with pytest.raises(TensorFileError, match="no codec named 'nope'"):
        convert(source, old, encoder="nope")
    assert hashlib.sha256(old.read_bytes()).hexdigest() == before
    assert sorted(os.listdir(tmp_path)) == ["a.sqlite", "new.sqlite", "nnc.sqlite"]


def test_inspect_recognises_safetensors_by_content(tmp_path, capsys):
    x = np.array([1.0, -2.0, np.nan], np.float32)
    for name in ("w.bin", "w"):
        save_file({"a": x}, str(tmp_path / name))
        assert main(["inspect", "--stats", str(tmp_path / name)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0] == f"{tmp_path / name}: 1 tensors, 12 B of data"
        assert out[2].split() == ["a", "float32", "[3]", "NHWC", "12", "-2", "1", "-0.5", "1"]


def test_a_name_map_giving_a_non_str_names_the_tensor(tmp_path):
    save_file({"a": np.ones(2, np.float32)}, str(tmp_path / "a.safetensors"))
    for rename in (lambda name: 5, {"a": 5}):
        with pytest.raises(TensorFileError) as e:
            convert(tmp_path / "a.safetensors", tmp_path / "b.safetensors", rename=rename)
        assert "gives 5 (int) for tensor 'a'; expected a str" in str(e.value)
        assert "both map" not in str(e.value)


def test_bfloat16_reads_where_the_librarys_numpy_reader_has_none(tmp_path, monkeypatch):
    """Older safetensors versions cannot put BF16 into NumPy: fnnc reads their bytes."""
    import safetensors

    path = tmp_path / "b.safetensors"
    x = _arrays()["bf16"]
    save_file({"b": x, "f": np.ones(3, np.float32)}, str(path))
    real = safetensors.safe_open

    class Old:
        def __init__(self, *args, **kwargs):
            self.inner = real(*args, **kwargs)

        def __enter__(self):
            self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def __getattr__(self, attr):
            return getattr(self.inner, attr)

        def get_tensor(self, name):
            if self.inner.get_slice(name).get_dtype() == "BF16":
                raise KeyError("BF16")
            return self.inner.get_tensor(name)

    monkeypatch.setattr("fnnc.io.safetensors_io.safe_open", Old)
    got = SafetensorsFile(path).read("b")
    assert got.dtype == ml_dtypes.bfloat16 and got.tobytes() == x.tobytes()
    assert (SafetensorsFile(path).read("f") == 1).all()


def test_two_writers_of_one_file_keep_each_others_tensors(tmp_path):
    """Each flush merged the pending tensors with the names read when the object was
    opened and replaced the file whole, so of two objects writing one file the later
    flush dropped what the other had written since. Flushes now hold the file's lock and
    re-read its tensors. Threads, as flock conflicts between separate opens in one
    process; oracle: the safetensors library's own load_file."""
    import threading

    path = tmp_path / "shared.safetensors"
    SafetensorsFile(path).write("seed", np.zeros(2, np.float32))
    files = [SafetensorsFile(path), SafetensorsFile(path)]  # both read the header now
    start = threading.Barrier(2)
    errors = []

    def writer(k):
        try:
            start.wait()
            for i in range(8):
                files[k].write(f"w{k}_{i}", np.full(3, 10 * k + i, np.float32))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    got = load_file(path)
    want = {f"w{k}_{i}": np.full(3, 10 * k + i, np.float32) for k in range(2) for i in range(8)}
    assert sorted(got) == sorted([*want, "seed"])
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)
    # this object's overwrite wins over the tensor another object stored under that name
    files[0].write("w1_0", np.ones(1, np.int8))
    np.testing.assert_array_equal(load_file(path)["w1_0"], np.ones(1, np.int8))
    assert len(load_file(path)) == 17
