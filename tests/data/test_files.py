"""Columns that read files: tensor-file rows and slices, memory maps larger than memory."""

import pickle

import numpy as np
import pytest

from fnnc.data import DataError, DataFrame
from fnnc.data.sources import ArrayColumn
from fnnc.io import TensorFile


@pytest.fixture
def tensor_file(tmp_path):
    path = tmp_path / "data.sqlite"
    rng = np.random.default_rng(0)
    images = rng.standard_normal((30, 4, 3)).astype(np.float32)
    with TensorFile(path) as f, f.transaction():
        for i in range(12):  # x-0 .. x-11: lexical order would put x-10 before x-2
            f.write(f"x-{i}", np.full((2, 2), i, np.float32))
            f.write(f"y-{i}", np.int32(i % 3))
        f.write("images", images)
        f.write("labels", np.arange(30, dtype=np.int32))
    return path, images


def test_rows_of_a_tensor_file_by_pattern_in_numeric_order(tensor_file):
    path, _ = tensor_file
    df = DataFrame.from_tensor_file(path, "x-{}", column="x")
    assert len(df) == 12
    assert [float(r[0, 0]) for r in df.iterator("x")] == [float(i) for i in range(12)]
    batches = list(df.batch(5).iterator("x"))
    assert [b.shape for b in batches] == [(5, 2, 2), (5, 2, 2), (2, 2, 2)]


def test_rows_of_a_tensor_file_several_columns_shuffled_with_threads(tensor_file):
    path, _ = tensor_file
    df = DataFrame.from_tensor_file(path, columns={"x": "x-{}", "y": "y-{}"}).shuffle()
    rows = list(df.iterator(("x", "y"), threads=3))
    assert sorted(int(x[0, 0]) for x, _ in rows) == list(range(12))
    # y-<i> were written as np.int32 scalars: they read back as () (NNC sees [1])
    assert all(y.shape == () and int(y) == int(x[0, 0]) % 3 for x, y in rows)


def test_tensor_file_names_list_and_errors(tensor_file):
    path, _ = tensor_file
    df = DataFrame.from_tensor_file(path, ["x-3", "x-1"])
    assert [float(r[0, 0]) for r in df.iterator("tensor")] == [3.0, 1.0]
    with pytest.raises(DataError, match="not in"):
        DataFrame.from_tensor_file(path, ["x-3", "nope"])
    with pytest.raises(DataError, match=r"no tensor .* matches 'z-\{\}'"):
        DataFrame.from_tensor_file(path, "z-{}")


def test_tensor_file_is_only_read(tensor_file):
    path, _ = tensor_file
    before = path.read_bytes()
    list(DataFrame.from_tensor_file(path, "y-{}").shuffle().iterator(threads=2))
    assert path.read_bytes() == before


def test_slices_of_one_tensor_stream_without_loading_it(tensor_file):
    path, images = tensor_file
    df = DataFrame.from_tensor_slices(path, x="images", y="labels")
    assert len(df) == 30
    ordered = np.concatenate([b["x"] for b in df.batch(7)])
    np.testing.assert_array_equal(ordered, images)
    for batch in df.shuffle().batch(8).iterator(threads=2):
        np.testing.assert_array_equal(batch["x"], images[batch["y"]])
    with pytest.raises(DataError, match=r"no tensor 'missing'"):
        DataFrame.from_tensor_slices(path, x="missing")


def test_a_memmap_larger_than_a_batch_streams_every_row(tmp_path):
    rows, width = 5000, 16
    mm = np.memmap(tmp_path / "big.dat", np.float32, "w+", shape=(rows, width))
    mm[:] = np.arange(rows * width, dtype=np.float32).reshape(rows, width)
    mm.flush()
    data = np.memmap(tmp_path / "big.dat", np.float32, "r", shape=(rows, width))
    df = DataFrame.from_arrays(x=data, i=np.arange(rows)).shuffle().batch(64)
    seen = []
    for batch in df.iterator(threads=2, prefetch=4):
        np.testing.assert_array_equal(batch["x"][:, 0], batch["i"] * width)
        seen.extend(batch["i"].tolist())
    assert sorted(seen) == list(range(rows))


def test_a_memmap_column_pickles_as_its_file_not_its_data(tmp_path):
    mm = np.memmap(tmp_path / "m.dat", np.float64, "w+", shape=(1000, 8))
    mm[:] = np.arange(8000).reshape(1000, 8)
    mm.flush()
    view = np.memmap(tmp_path / "m.dat", np.float64, "r", shape=(1000, 8))[100:900:2, 1:5]
    column = ArrayColumn(view)
    blob = pickle.dumps(column)
    assert len(blob) < 2000  # 32 KB of rows would not fit
    again = pickle.loads(blob)
    np.testing.assert_array_equal(again.array, view)
    assert again.in_memory is False and ArrayColumn(np.zeros(3)).in_memory
