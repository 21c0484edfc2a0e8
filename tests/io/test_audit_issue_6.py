"""Audit of issue 6 (persistence), checked as the issue states it.

Promises checked:

- ``fnnc.io.TensorFile(path)``: NNC's ``tensors`` table (schema, ``type`` / ``format`` /
  ``datatype`` codes, int32[12] ``dim`` blob) for float32, float16, bfloat16, float64,
  int32, int64, uint8 and shapes of 0 to 8 dimensions, checked with ``sqlite3`` against
  DESIGN.md section 6; ``write(name, array, format=)``, ``read(name)``, ``names()``,
  metadata without data, reading into a given shape / dtype as NNC does (float16 <->
  float32), encoder / decoder hooks with an identifier, all-or-nothing transactions;
  files NNC itself wrote (shared/nnc-files) read with its values.
- ``Model.write(path_or_file, name=None)`` / ``Model.read``: NNC's row names (``<id>``,
  ``__<name>__[<id>]``, internals ``<id>(<device>)``) in one transaction; a file with
  missing or mis-shaped parameters says exactly which.
- ``fnnc.io.Checkpoints(path)``: ``save(step, model or pytree, optimizer state,
  metadata)``, ``steps()``, ``restore(step=None)``, retention that never deletes the
  newest, an interrupted save leaving earlier steps intact, optimizer state exact.
- ``fnnc.graph.save/load`` in the same SQLite file as the tensors.
- ``python -m fnnc inspect FILE [--stats]``.
- Nothing is unpickled; malicious or truncated blobs, wrong dim blob lengths and unknown
  datatypes raise a clear ``FnncError`` naming the tensor.
"""

from __future__ import annotations

import pickle
import sqlite3
import struct
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

import fnnc
from fnnc import ops
from fnnc.errors import CheckpointError, DTypeError, FnncError, ParameterError, TensorFileError
from fnnc.io import Checkpoints, Codec, TensorFile, register_codec, unregister_codec
from fnnc.io.cli import main
from fnnc.models import BatchNorm, Dense, ReLU, Sequential
from tests.helpers import NNC_FILES, fetch_rows, needs_nnc_files, subprocess_env

# DESIGN.md section 6: datatype codes, format codes, CPU memory with "any device".
DATATYPES = {
    np.dtype(np.uint8): 0x1000,
    np.dtype(np.int32): 0x2000,
    np.dtype(np.float32): 0x4000,
    np.dtype(np.int64): 0x8000,
    np.dtype(np.float64): 0x10000,
    np.dtype(np.float16): 0x20000,
    np.dtype(ml_dtypes.bfloat16): 0x80000,
}
FORMATS = {"NCHW": 1, "NHWC": 2, "CHWN": 4}
NNC_CREATE = (
    "CREATE TABLE IF NOT EXISTS tensors (name TEXT, type INTEGER, format INTEGER, "
    "datatype INTEGER, dim BLOB, data BLOB, PRIMARY KEY (name))"
)


def _row(path, name):
    query = "SELECT type, format, datatype, dim, data FROM tensors WHERE name=?"
    return fetch_rows(path, query, (name,))[0]


def _dim(shape):
    return struct.pack("<12i", *shape, *[0] * (12 - len(shape)))


# -- TensorFile --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(DATATYPES), ids=lambda d: d.name)
def test_every_dtype_and_rank_0_to_8_round_trips_with_nnc_columns(tmp_path, dtype):
    """write/read of ranks 0..8; the raw columns are the codes DESIGN.md lists."""
    path = tmp_path / "t.sqlite"
    with TensorFile(path) as f:
        for rank in range(9):
            shape = (2, 1, 3, 1, 2, 1, 1, 2)[:rank]
            x = (np.arange(int(np.prod(shape))) % 97 - 40).astype(dtype).reshape(shape)
            name = f"r{rank}"
            f.write(name, x, "NHWC")
            got = f.read(name, shape=shape) if rank == 0 else f.read(name)
            assert got.dtype == x.dtype and got.shape == x.shape, name
            assert got.tobytes() == x.tobytes(), name
            type_, format_, datatype, dim, data = _row(path, name)
            assert type_ == 0xFFF01 and format_ == 2 and datatype == DATATYPES[np.dtype(dtype)]
            assert dim == _dim(shape or (1,))  # NNC has no rank 0: a scalar is [1]
            assert data == x.tobytes()


def test_format_and_device_columns(tmp_path):
    """format= and device= land in NNC's format and type columns; info() reports them."""
    path = tmp_path / "f.sqlite"
    x = np.ones((1, 2, 2, 3), np.float32)
    with TensorFile(path) as f:
        for layout in FORMATS:
            f.write(layout, x, layout)
        f.write("gpu", x, device="GPU:1")
        for layout, code in FORMATS.items():
            assert _row(path, layout)[1] == code
            assert f.info(layout).format == layout
        assert _row(path, "gpu")[0] == (1 << 8) | 0x2
        assert f.info("gpu").device == "GPU:1"


def test_names_and_metadata_without_data(tmp_path):
    """names() sorted; info() gives dtype, shape, format and stored size, not the data."""
    path = tmp_path / "m.sqlite"
    with TensorFile(path) as f:
        f.write("zeta", np.zeros((4, 5), np.float16), "NCHW")
        f.write("alpha", np.zeros(3, np.int64))
        assert f.names() == ["alpha", "zeta"]
        info = f.info("zeta")
        assert (info.dtype, info.shape, info.format) == (np.float16, (4, 5), "NCHW")
        assert info.nbytes == 40
        assert "zeta" in f and "beta" not in f and len(f) == 2


def test_read_into_a_shape_and_a_dtype_as_nnc_does(tmp_path):
    """float16 <-> float32 conversions on read; a given shape of the same count reshapes."""
    path = tmp_path / "c.sqlite"
    x = np.array([0.5, -1.25, 2.0, 1e-4, 3.0, -7.5], np.float16)
    with TensorFile(path) as f:
        f.write("h", x)
        f.write("s", np.array([0.0001, 1.5, -2.25], np.float32))
        widened = f.read("h", dtype=np.float32)
        assert widened.dtype == np.float32
        np.testing.assert_array_equal(widened, x.astype(np.float32))
        np.testing.assert_array_equal(f.read("h", shape=(2, 3)), x.reshape(2, 3))
        narrowed = f.read("s", dtype=np.float16)
        assert narrowed.dtype == np.float16
        # NNC's float-to-half truncates (shared/nnc-files/README.md: 0.0001 is 0x068D)
        assert narrowed.view(np.uint16).tolist() == [0x068D, 0x3E00, 0xC080]
        with pytest.raises(DTypeError):
            f.read("s", dtype=np.int32)


@needs_nnc_files
def test_reads_the_tensors_nnc_wrote():
    """Each row of NNC's tensors.sqlite3 reads as the README says it was written."""
    with TensorFile(NNC_FILES / "tensors.sqlite3", readonly=True) as f:
        f32 = f.read("f32")
        np.testing.assert_array_equal(f32, (np.arange(24) * 0.5 - 3).reshape(2, 3, 4))
        assert f32.dtype == np.float32
        f16 = f.read("f16")
        assert f16.dtype == np.float16
        assert f16.view(np.uint16).tolist()[4] == 0x068D
        np.testing.assert_array_equal(f16[:4], np.float16([0, 1.5, -2.25, 65504]))
        np.testing.assert_array_equal(f.read("f64"), [[1e-300], [3.25], [-7]])
        np.testing.assert_array_equal(f.read("i32"), [1, -2, 3, 2147483647])
        assert f.read("i64").tolist() == [-1, 2**40] and f.read("i64").dtype == np.int64
        assert f.info("f32_nchw").format == "NCHW" and f.info("f32_nchw").shape == (1, 2, 3, 4)
        np.testing.assert_array_equal(f.read("f32_any_device_macro"), [[0.25, 1.25], [2.25, 3.25]])


def test_encoder_and_decoder_hooks_with_an_identifier(tmp_path):
    """A registered Codec, a function encoder (identifier, bytes), a function decoder."""
    path = tmp_path / "h.sqlite"
    flip = lambda data, dtype, shape: bytes(b ^ 0x5A for b in data)
    codec = Codec(0x1F00D, encode=flip, decode=flip, name="audit-xor")
    register_codec(codec)
    x = np.arange(10, dtype=np.float32)
    try:
        with TensorFile(path) as f:
            f.write("a", x, encoder=codec)
            f.write("b", x, encoder=lambda data, dtype, shape: (0x2BAD, data[::-1]))
            assert f.read("a").tobytes() == x.tobytes()  # found by its identifier
            assert f.info("a").encoder == 0x1F00D
        assert _row(path, "a")[0] >> 32 == 0x1F00D
        assert _row(path, "a")[4] == flip(x.tobytes(), None, None)
        with TensorFile(path, readonly=True) as f:
            with pytest.raises(TensorFileError, match=r"tensor 'b'.*0x2bad"):
                f.read("b")  # nothing registered under 0x2bad
            seen = []

            def decoder(identifier, data, dtype, shape):
                seen.append((identifier, dtype, shape))
                return data[::-1]

            assert f.read("b", decoder=decoder).tobytes() == x.tobytes()
            assert seen == [(0x2BAD, np.float32, (10,))]
    finally:
        unregister_codec(0x1F00D)


def test_a_transaction_is_all_or_nothing(tmp_path):
    """An exception inside transaction() leaves none of its writes; earlier rows stay."""
    path = tmp_path / "t.sqlite"
    with TensorFile(path) as f:
        f.write("kept", np.ones(2, np.float32))
        with pytest.raises(RuntimeError), f.transaction():
            f.write("a", np.ones(3, np.float32))
            f.write("kept", np.zeros(2, np.float32))
            raise RuntimeError("interrupted")
        assert f.names() == ["kept"]
        np.testing.assert_array_equal(f.read("kept"), [1, 1])
        with f.transaction():
            f.write("a", np.ones(3, np.float32))
            f.write("b", np.ones(3, np.float32))
    assert TensorFile(path, readonly=True).names() == ["a", "b", "kept"]


# -- bad input ---------------------------------------------------------------------------


def _nnc_file(path, rows):
    with sqlite3.connect(path) as conn:
        conn.execute(NNC_CREATE)
        conn.executemany("INSERT INTO tensors VALUES (?, ?, ?, ?, ?, ?)", rows)
    conn.close()


@pytest.mark.parametrize(
    ("row", "says"),
    [
        (("trunc", 0xFFF01, 2, 0x4000, _dim((4, 4)), bytes(12)), "truncated"),
        (("dim7", 0xFFF01, 2, 0x4000, struct.pack("<7i", 2, 0, 0, 0, 0, 0, 0), bytes(8)), "dim"),
        (("dtype", 0xFFF01, 2, 0x12345, _dim((2,)), bytes(8)), "datatype"),
        (("fmt", 0xFFF01, 9, 0x4000, _dim((2,)), bytes(8)), "format"),
        (("text", 0xFFF01, 2, 0x4000, _dim((2,)), "not a blob"), "BLOB"),
    ],
    ids=lambda v: v[0] if isinstance(v, tuple) else None,
)
def test_malformed_rows_raise_an_fnnc_error_naming_the_tensor(tmp_path, row, says):
    """Truncated data, a wrong dim length, unknown datatype or format, a TEXT blob."""
    path = tmp_path / "bad.sqlite"
    _nnc_file(path, [row])
    with TensorFile(path, readonly=True) as f, pytest.raises(FnncError) as e:
        f.read(row[0])
    assert f"'{row[0]}'" in str(e.value) and says in str(e.value)


def test_a_pickle_blob_is_bytes_never_unpickled(tmp_path):
    """A row holding a malicious pickle reads as its raw bytes; nothing runs."""
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    blob = pickle.dumps(Evil())
    path = tmp_path / "p.sqlite"
    _nnc_file(path, [("evil", 0xFFF01, 2, 0x1000, _dim((len(blob),)), blob)])
    got = TensorFile(path, readonly=True).read("evil")
    assert got.tobytes() == blob and not marker.exists()


# -- models ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained() -> Sequential:
    """Dense, BatchNorm (internals r-1-0, r-1-1), ReLU, Dense: one Adam step taken."""
    model = Sequential([Dense(6), BatchNorm(), ReLU(), Dense(3)])
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    model.compile([x], loss="mse", minimizer=optax.adam(0.01))
    model.fit([x], [np.ones((4, 3), np.float32)])
    return model


def test_model_write_rows_are_nnc_names_in_a_path_or_an_open_file(tmp_path, trained):
    """Model.write(path) and Model.write(TensorFile, name=...): <id>, __<name>__[<id>], <id>(0)."""
    model = trained
    ids = sorted(model.parameters())
    plain = sorted(f"{i}(0)" if i.startswith("r-") else i for i in ids)
    model.write(tmp_path / "plain.sqlite")
    assert TensorFile(tmp_path / "plain.sqlite", readonly=True).names() == plain
    with TensorFile(tmp_path / "named.sqlite") as f:
        model.write(f, name="mlp")
        assert f.names() == sorted(f"__mlp__[{r}]" for r in plain)
    assert any(r.startswith("r-") for r in plain)  # BatchNorm's running statistics
    other = Sequential([Dense(6), BatchNorm(), ReLU(), Dense(3)])
    other.compile([np.zeros((4, 5), np.float32)])
    assert other.read(tmp_path / "named.sqlite", name="mlp") == []
    for k, v in model.parameters().items():
        assert np.asarray(other.parameters()[k]).tobytes() == np.asarray(v).tobytes(), k


def test_model_write_takes_the_name_as_its_second_argument(tmp_path, trained):
    """The issue's signature Model.write(path_or_file, name=None), name given positionally."""
    trained.write(tmp_path / "m.sqlite", "mlp")
    assert all(r.startswith("__mlp__[") for r in TensorFile(tmp_path / "m.sqlite").names())


def test_model_write_is_one_transaction(tmp_path, monkeypatch, trained):
    """A write that fails on its third row leaves no row of the model in the file."""
    model = trained
    path = tmp_path / "m.sqlite"
    with TensorFile(path) as f:
        f.write("before", np.ones(1, np.float32))
    real, calls = TensorFile.write, []

    def failing(self, name, *args, **kwargs):
        calls.append(name)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(TensorFile, "write", failing)
    with pytest.raises(OSError, match="disk full"):
        model.write(path)
    monkeypatch.setattr(TensorFile, "write", real)
    assert len(calls) == 3
    assert TensorFile(path, readonly=True).names() == ["before"]


def test_reading_a_file_with_missing_and_misshaped_parameters_says_exactly_which(tmp_path, trained):
    """One ParameterError names each missing id and each wrong shape, nothing else."""
    trained.write(tmp_path / "m.sqlite")
    bigger = Sequential([Dense(6), BatchNorm(), ReLU(), Dense(4), Dense(2)])
    bigger.compile([np.zeros((4, 5), np.float32)])
    with pytest.raises(ParameterError) as e:
        bigger.read(tmp_path / "m.sqlite")
    text = str(e.value)
    assert "t-2-0: stored float32[3, 6], expected float32[4, 6]" in text
    assert "t-2-1: stored float32[3], expected float32[4]" in text
    assert "t-3-0" in text and "t-3-1" in text
    for fine in ("t-0-0", "t-0-1", "t-1-0", "t-1-1", "r-1-0"):
        assert fine not in text, fine
    assert sorted(bigger.read(tmp_path / "m.sqlite", strict=False)) == [
        "t-2-0: stored float32[3, 6], expected float32[4, 6]",
        "t-2-1: stored float32[3], expected float32[4]",
        "t-3-0",
        "t-3-1",
    ]


# -- checkpoints -------------------------------------------------------------------------


def _adam_after_steps(params, steps=2):
    opt = optax.adam(0.1)
    state = opt.init(params)
    for _ in range(steps):
        grads = jax.tree.map(lambda p: jnp.ones_like(p) * 0.3, params)
        updates, state = opt.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


def _same(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        assert np.shape(x) == np.shape(y)
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_checkpoints_save_steps_and_restore_latest_or_any(tmp_path):
    """Generations per step; restore() is the newest, restore(step) an earlier one."""
    with Checkpoints(tmp_path / "run.ckpt") as ckpt:
        for step in (10, 20, 30):
            ckpt.save(step, {"w": np.full((2, 2), step, np.float32)}, metadata={"epoch": step})
        assert ckpt.steps() == [10, 20, 30]
        newest = ckpt.restore()
        assert newest.step == 30 and newest.metadata == {"epoch": 30}
        np.testing.assert_array_equal(newest.state["w"], np.full((2, 2), 30))
        assert ckpt.restore(step=10).metadata == {"epoch": 10}
        with pytest.raises(CheckpointError, match="15"):
            ckpt.restore(15)


def test_optimizer_state_round_trips_exactly(tmp_path):
    """Adam's state (int32 count, float32 and bfloat16 moments) restores bit for bit."""
    params = {"w": jnp.linspace(-1, 1, 6).reshape(2, 3), "e": jnp.ones(4, jnp.bfloat16)}
    params, state = _adam_after_steps(params)
    with Checkpoints(tmp_path / "o.ckpt") as ckpt:
        ckpt.save(2, params, optimizer_state=state, metadata={"lr": 0.1})
        got = ckpt.restore(2)
    _same(got.state, params)
    _same(got.optimizer_state, state)
    # the restored state continues as the original does
    opt, grads = optax.adam(0.1), jax.tree.map(jnp.ones_like, params)
    want, _ = opt.update(grads, state, params)
    again, _ = opt.update(grads, got.optimizer_state, got.state)
    _same(again, want)


def test_checkpoints_save_takes_the_issue_s_positional_arguments(tmp_path):
    """save(step, state, optimizer_state, metadata) in the order the issue lists them."""
    params, state = _adam_after_steps({"w": jnp.ones(3)})
    with Checkpoints(tmp_path / "p.ckpt") as ckpt:
        ckpt.save(1, params, state, {"loss": 0.5})
        assert ckpt.restore().metadata == {"loss": 0.5}


def test_retention_never_deletes_the_newest(tmp_path):
    """keep_last=1 keeps the newest even when an older step number is saved after it."""
    with Checkpoints(tmp_path / "r.ckpt", keep_last=1) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, {"w": np.full(2, step, np.float32)})
        assert ckpt.steps() == [3]
        ckpt.save(2, {"w": np.zeros(2, np.float32)})  # resumed from an earlier point
        assert 3 in ckpt.steps()
        np.testing.assert_array_equal(ckpt.restore().state["w"], [3, 3])
    with Checkpoints(tmp_path / "e.ckpt", keep_last=2, keep_every=10) as ckpt:
        for step in range(5, 45, 5):
            ckpt.save(step, {"s": np.int32(step)})
        assert ckpt.steps() == [10, 20, 30, 35, 40]


def test_an_interrupted_save_leaves_earlier_checkpoints_intact(tmp_path, monkeypatch):
    """A save failing half-way (third row) changes nothing: steps and values as before."""
    path = tmp_path / "i.ckpt"
    with Checkpoints(path) as ckpt:
        ckpt.save(1, {"a": np.ones(3, np.float32), "b": np.arange(4)})
    real, calls = TensorFile.write, []

    def failing(self, name, *args, **kwargs):
        calls.append(name)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(TensorFile, "write", failing)
    with Checkpoints(path) as ckpt, pytest.raises(KeyboardInterrupt):
        ckpt.save(2, {"a": np.zeros(3, np.float32), "b": np.arange(4), "c": np.ones(2)})
    monkeypatch.setattr(TensorFile, "write", real)
    with Checkpoints(path) as ckpt:
        assert ckpt.steps() == [1]
        got = ckpt.restore()
        np.testing.assert_array_equal(got.state["a"], np.ones(3))
        np.testing.assert_array_equal(got.state["b"], np.arange(4))
    assert not [n for n in TensorFile(path, readonly=True).names() if "ckpt-2" in n]
    assert fetch_rows(path, "PRAGMA integrity_check") == [("ok",)]


def test_a_model_checkpoint_restores_into_a_fresh_model(tmp_path, trained):
    """save(step, model); restore_into a fresh model: parameters bit-equal."""
    model = trained
    with Checkpoints(tmp_path / "m.ckpt") as ckpt:
        ckpt.save(7, model, metadata={"note": "after one step"})
        fresh = Sequential([Dense(6), BatchNorm(), ReLU(), Dense(3)])
        fresh.compile([np.zeros((4, 5), np.float32)], loss="mse", minimizer=optax.adam(0.01))
        got = ckpt.restore_into(fresh)
    assert got.step == 7
    for k, v in model.parameters().items():
        assert np.asarray(fresh.parameters()[k]).tobytes() == np.asarray(v).tobytes(), k


# -- graphs in the same file -------------------------------------------------------------


def test_graphs_are_stored_in_the_tensor_file_when_asked(tmp_path):
    """fnnc.graph.save(g, path, name=) beside the weights; load gives the same graph."""
    b = fnnc.graph.GraphBuilder()
    x, w = b.input((2, 3), name="x"), b.input((4, 3), name="w")
    g = b.build([b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w))])
    path = tmp_path / "model.sqlite"
    wv = (np.arange(12, dtype=np.float32) - 6).reshape(4, 3)
    with TensorFile(path) as f:
        f.write("w", wv)
    fnnc.graph.save(g, path, name="forward")
    back = fnnc.graph.load(path, name="forward")
    assert back == g
    xv = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(
        np.asarray(fnnc.graph.interpret(back, xv, TensorFile(path).read("w"))),
        np.maximum(xv @ wv.T, 0),
        rtol=1e-6,
    )
    assert TensorFile(path, readonly=True).names() == ["w"]  # NNC's table holds tensors only


# -- the command line --------------------------------------------------------------------


def _inspect(*args):
    return subprocess.run(
        [sys.executable, "-m", "fnnc", "inspect", *args],
        capture_output=True, text=True, env=subprocess_env(), timeout=120,
    )  # fmt: skip


def test_inspect_lists_name_dtype_shape_and_size_with_stats(tmp_path, capsys):
    """`python -m fnnc inspect F --stats`: min, max, mean (NaN left out) and NaN count."""
    path = tmp_path / "w.sqlite"
    x = np.array([[1.5, np.nan, -2.0], [4.0, np.nan, 0.25]], np.float32)
    with TensorFile(path) as f:
        f.write("weights", x)
        f.write("counts", np.array([3, 9, -4], np.int64))
    done = _inspect(str(path))
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()[2:]}
    assert rows["weights"][1:5] == ["float32", "[2,", "3]", "NHWC"]
    assert rows["weights"][5] == str(x.nbytes) and rows["counts"][1] == "int64"
    assert main(["inspect", str(path), "--stats"]) == 0
    header, *lines = capsys.readouterr().out.splitlines()[1:]
    assert header.split()[-4:] == ["min", "max", "mean", "nan"]
    cells = {line.split()[0]: line.split()[-4:] for line in lines}
    finite = x[~np.isnan(x)]
    want = [float(finite.min()), float(finite.max()), float(finite.mean())]
    assert [float(c) for c in cells["weights"][:3]] == pytest.approx(want)
    assert cells["weights"][3] == "2"
    assert [float(c) for c in cells["counts"]] == pytest.approx([-4, 9, 8 / 3, 0], rel=1e-5)


@needs_nnc_files
def test_inspect_lists_a_file_nnc_wrote(capsys):
    """inspect on NNC's own tensors.sqlite3 lists its seven rows."""
    assert main(["inspect", str(NNC_FILES / "tensors.sqlite3")]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:] if line}
    assert rows["f16"][1:3] == ["float16", "[5]"]
    assert rows["f32_nchw"][1] == "float32" and "NCHW" in rows["f32_nchw"]
    assert rows["i64"][1] == "int64" and len(rows) == 7


def test_inspect_of_a_damaged_file_is_one_error_line(tmp_path, capsys):
    """A non-SQLite file: status 1 and one error line naming it, no traceback."""
    (path := tmp_path / "junk.sqlite").write_bytes(b"not sqlite at all" * 10)
    assert main(["inspect", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error" in err[0] and "junk.sqlite" in err[0]
