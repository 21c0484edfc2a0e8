"""Rank 0 in NNC tensor files (issue 6: "round trips for every dtype and for shapes of 0
to 8 dimensions"). NNC cannot store rank 0, so a scalar's row stays NNC's ``[1]`` (its
``dim`` blob, checked here with sqlite3 directly); fnnc notes the rank 0 in its side
table (``fnnc_checksums.shape``) and reads it back as ``()``. A row any other SQLite
writer replaced reads as NNC's ``[1]``; files written before the note (no column) read
as before and still restore checkpoints and models exactly."""

import contextlib
import sqlite3
import struct

import jax
import ml_dtypes
import numpy as np
import optax
import pytest
from safetensors.numpy import load_file

from fnnc.io import Checkpoints, TensorFile, convert, read_parameters, write_parameters
from fnnc.io.cli import inspect_lines
from fnnc.models import Dense, Input, Model, Mul, Parameter

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int32, np.int64, np.uint8]
SHAPES = [(2, 1, 3, 1, 2, 1, 1, 2)[:rank] for rank in range(9)]


def _dim(shape):
    """NNC's dim blob: int32[12], little-endian (the oracle for what NNC sees)."""
    return struct.pack("<12i", *shape, *[0] * (12 - len(shape)))


def _sql(path, query, params=()):
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        return conn.execute(query, params).fetchall()


def _drop_shape_column(path):
    """The file as fnnc wrote it before the note: fnnc_checksums without ``shape``."""
    _sql(path, "ALTER TABLE fnnc_checksums DROP COLUMN shape")


def test_every_dtype_at_ranks_0_to_8_round_trips_and_nnc_sees_its_dim(tmp_path):
    path = tmp_path / "t.sqlite3"
    arrays = {
        f"{np.dtype(t).name}-{len(s)}": (np.arange(int(np.prod(s))) % 7 - 2).astype(t).reshape(s)
        for t in DTYPES
        for s in SHAPES
    }
    with TensorFile(path) as f, f.transaction():
        for name, a in arrays.items():
            f.write(name, a)
    with TensorFile(path, readonly=True) as f:
        infos = {i.name: i for i in f.infos()}
        for name, a in arrays.items():
            got = f.read(name)
            assert (got.dtype, got.shape, got.tobytes()) == (a.dtype, a.shape, a.tobytes())
            assert f.info(name).shape == infos[name].shape == a.shape, name
        assert f.verify().ok and not f.verify().unchecked
    rows = dict(_sql(path, "SELECT name, dim FROM tensors"))
    for name, a in arrays.items():
        assert rows[name] == _dim(a.shape or (1,)), name  # NNC has no rank 0: [1]
    assert sorted(_sql(path, "SELECT name FROM fnnc_checksums WHERE shape IS NOT NULL")) == [
        (name,) for name in sorted(arrays) if name.endswith("-0")
    ]


def test_shape_keeps_its_meaning_and_one_element_vectors_stay_vectors(tmp_path):
    path = tmp_path / "s.sqlite3"
    with TensorFile(path) as f:
        f.write("s", np.float16(1.5))
        f.write("v", np.array([2.5], np.float32))
        f.write("e", np.float32(4.0), encoder="zip")  # a codec sees NNC's [1]
        assert f.read("s", shape=(1,)).shape == (1,) and f.read("s", shape=()).shape == ()
        assert f.read("v").shape == (1,) and f.read("v", shape=()) == 2.5
        assert f.read("s", dtype=np.float32).shape == () and f.read("s") == 1.5
        assert f.read("e").shape == () and f.read("e") == 4.0


def test_a_scalar_read_as_float16_stays_a_scalar(tmp_path):
    """Reading float32 as float16 goes through NNC's truncating conversion, which made
    a 0-d array [1] (np.ascontiguousarray), also for shape=(); the oracle is the
    truncated bits NNC gives 0.0001 (0x068D, where rounding gives 0x068E)."""
    path = tmp_path / "h.sqlite3"
    with TensorFile(path) as f:
        f.write("s", np.float32(0.0001))
        f.write("v", np.array([0.0001], np.float32))
        for got in (f.read("s", dtype=np.float16), f.read("v", shape=(), dtype=np.float16)):
            assert got.shape == () and got.dtype == np.float16 and got.view(np.uint16) == 0x068D
        assert f.read("v", dtype=np.float16).view(np.uint16).tolist() == [0x068D]


@pytest.mark.parametrize(
    "change",
    [
        "REPLACE INTO tensors (name, type, format, datatype, dim, data) "
        "SELECT name, type, format, datatype, dim, data FROM tensors WHERE name='s'",
        "UPDATE tensors SET data=data WHERE name='s'",
        "DELETE FROM tensors WHERE name='s'; INSERT INTO tensors "
        "VALUES ('s', 1048321, 2, 16384, x'{dim}', x'00002040')",
    ],
    ids=["replace", "update", "delete-insert"],
)
def test_a_scalar_row_another_writer_changed_reads_as_nncs_one_element(tmp_path, change):
    path = tmp_path / "n.sqlite3"
    with TensorFile(path) as f:
        f.write("s", np.float32(2.5))
        f.write("t", np.float32(1.0))
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.executescript(change.format(dim=_dim((1,)).hex()))
    with TensorFile(path, readonly=True) as f:
        assert f.info("s").shape == (1,) and f.read("s").tolist() == [2.5]
        assert f.read("t").shape == ()  # untouched rows keep theirs
        assert f.verify().ok and f.verify().unchecked == ("s",)


def test_a_file_without_the_shape_column_reads_as_before_and_gets_it_on_write(tmp_path):
    path = tmp_path / "old.sqlite3"
    write_parameters(path, {"w": np.ones((2, 2), np.float32), "s": np.float32(3)})
    _drop_shape_column(path)
    with TensorFile(path, readonly=True) as f:
        assert f.info("s").shape == (1,) and f.read("s").tolist() == [3.0]
        assert f.verify().ok and not f.verify().unchecked  # checksums still match
    got = read_parameters(path, {"s": ((), np.float32), "w": ((2, 2), np.float32)})
    assert got["s"].shape == () and got["s"] == 3
    with TensorFile(path) as f:
        f.write("t", np.int64(-4))
        assert f.read("t").shape == () and f.read("s").shape == (1,)
    columns = [c[1] for c in _sql(path, "PRAGMA table_info(fnnc_checksums)")]
    assert columns == ["name", "row", "algo", "digest", "shape"]


def test_read_parameters_matches_a_scalar_row_to_a_one_element_parameter(tmp_path):
    """NNC reads a scalar fnnc wrote as [1], so a [1] parameter takes it, as () takes
    NNC's [1]."""
    path = tmp_path / "p.sqlite3"
    write_parameters(path, {"a": np.float32(1.25), "b": np.array([2.5], np.float32)})
    got = read_parameters(path, {"a": ((1,), np.float32), "b": ((), np.float32)})
    assert got["a"].shape == (1,) and got["a"].tolist() == [1.25]
    assert got["b"].shape == () and got["b"] == 2.5


def test_safetensors_conversion_keeps_rank_0_both_ways(tmp_path):
    nnc, st, back = tmp_path / "a.sqlite3", tmp_path / "b.safetensors", tmp_path / "c.sqlite3"
    with TensorFile(nnc) as f:
        f.write("step", np.int32(7))
        f.write("w", np.ones((1,), np.float32))
    convert(nnc, st)
    loaded = load_file(str(st))
    assert loaded["step"].shape == () and loaded["step"] == 7 and loaded["w"].shape == (1,)
    convert(st, back)
    with TensorFile(back, readonly=True) as f:
        assert f.read("step").shape == () and f.read("w").shape == (1,)
    assert dict(_sql(back, "SELECT name, dim FROM tensors"))["step"] == _dim((1,))
    assert "step  int32    []" in "\n".join(inspect_lines(back))


# -- models and checkpoints -----------------------------------------------------------


def _build():
    x = Input()
    scale = Parameter((), init=0.5, name="s")()
    model = Model(x, Mul()(Dense(2, name="fc")(x), scale))
    model.compile(np.zeros((3, 3), np.float32), loss="mse", minimizer=optax.adam(0.1))
    return model


@pytest.fixture(scope="module")
def trained():
    model = _build()
    rng = np.random.default_rng(0)
    xs, ys = rng.standard_normal((3, 3)).astype(np.float32), np.ones((3, 2), np.float32)
    model.fit([xs], [ys])
    model.fit([xs], [ys])
    return model


def _same_model(a, b):
    pa, pb = a.parameters(), b.parameters()
    assert sorted(pa) == sorted(pb)
    for k in pa:
        assert np.shape(pa[k]) == np.shape(pb[k]) and np.array_equal(pa[k], pb[k]), k
    for k in pa:  # Adam's mu, nu and its 0-d count, exactly, with their shapes
        la = jax.tree.leaves(a.engine.optimizer_state(k))
        lb = jax.tree.leaves(b.engine.optimizer_state(k))
        assert len(la) == len(lb) == 3 and any(np.ndim(x) == 0 for x in la)
        for x, y in zip(la, lb, strict=True):
            assert np.shape(x) == np.shape(y) and np.array_equal(x, y), k


@pytest.mark.parametrize("old", [False, True], ids=["new", "old-format"])
def test_model_and_checkpoint_with_0d_parameter_and_adam_count_restore_exactly(
    tmp_path, trained, old
):
    model_path, ckpt_path = tmp_path / "m.sqlite3", tmp_path / "run.ckpt"
    trained.write(model_path)
    Checkpoints(ckpt_path).save(2, trained)
    if old:
        _drop_shape_column(model_path)
        _drop_shape_column(ckpt_path)
    with TensorFile(ckpt_path, readonly=True) as f:
        count = f.info("__ckpt-2__[t-s-0-0/count]")
        assert count.shape == ((1,) if old else ())
        assert f.info("__ckpt-2__[t-s-0-0]").shape == ((1,) if old else ())
    assert dict(_sql(model_path, "SELECT name, dim FROM tensors"))["t-s-0-0"] == _dim((1,))
    fresh = _build()
    fresh.read(model_path)
    assert fresh.parameters()["t-s-0-0"].shape == ()
    np.testing.assert_array_equal(fresh.parameters()["t-s-0-0"], trained.parameters()["t-s-0-0"])
    restored = _build()
    Checkpoints(ckpt_path).restore_into(restored)
    _same_model(trained, restored)
    counts = Checkpoints(ckpt_path).restore().optimizer_state["t-s-0-0"]
    assert any(np.shape(x) == () for x in jax.tree.leaves(counts))


def test_zero_size_arrays_keep_every_axis(tmp_path):
    """NNC's dim is read up to its first 0, so a (0, 4) array read back as (0,); fnnc
    records the shape beside the row as it does for rank 0 (NNC's view unchanged)."""
    path = tmp_path / "z.sqlite3"
    with TensorFile(path) as f:
        for shape in [(0,), (0, 4), (2, 0, 3)]:
            f.write(str(shape), np.zeros(shape, np.float16))
    with TensorFile(path, readonly=True) as f:
        for shape in [(0,), (0, 4), (2, 0, 3)]:
            got = f.read(str(shape))
            assert got.shape == shape and got.dtype == np.float16
            assert f.info(str(shape)).shape == shape
