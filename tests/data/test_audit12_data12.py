"""Audit 12 of fnnc.data: regressions found by probing against independent oracles."""

import numpy as np

from fnnc.data import DataFrame


def _bump(a):
    a += 1  # in place: allowed on a function's fresh rows
    return a


def test_function_rows_are_read_anew_for_every_element():
    # A from_function row was cached per thread past its element: a map writing into it
    # changed what the next epoch, a wrapped repeat and even a fresh iterator read
    # (1 row, 3 epochs gave 1, 2, 3; a fresh iterator then 4), and fn ran once in all.
    calls = []

    def fn(i):
        calls.append(i)
        return np.full(2, float(i)), i

    one = DataFrame.from_function(fn, 1, ["a", "i"]).map(_bump, "a", "b")
    got = [b.tolist() for b in one.iterator("b", threads=0, epochs=3)]
    assert got == [[1.0, 1.0]] * 3  # oracle: fn(0) + 1, every time
    assert calls == [0, 0, 0]  # NNC's data_enum: one call per element read
    assert one[0]["b"].tolist() == [1.0, 1.0]

    frame = DataFrame.from_function(fn, 7, ["a", "i"]).map(_bump, "a", "b")
    last = list(frame.batch(3, wrap=True).iterator(("b", "i"), threads=0))[-1]
    np.testing.assert_array_equal(last[0], np.full((3, 2), 7.0))  # row 6 three times
    assert last[1].tolist() == [6, 6, 6]


def _center(x):
    x -= x.mean(axis=0)  # in place, on the batch (a copy of the rows)
    return x


def test_tensor_slice_batches_are_writable_copies_in_any_order(tmp_path):
    # A run of consecutive rows came back as np.frombuffer of the blob, read-only, while
    # shuffled rows were a writable copy: a batch map writing into its input failed on
    # unshuffled batches only (from_arrays batches are writable either way).
    from fnnc.io import TensorFile

    images = np.arange(8 * 3, dtype=np.float32).reshape(8, 3) ** 1.5
    path = tmp_path / "d.sqlite"
    with TensorFile(path) as f:
        f.write("images", images)
        f.write("labels", np.arange(8, dtype=np.int64))
    base = DataFrame.from_tensor_slices(path, x="images", i="labels")
    for df in (base, base.shuffle()):
        for x, i in df.batch(4).map(_center, "x", "x").iterator(("x", "i"), threads=0):
            np.testing.assert_allclose(x, images[i] - images[i].mean(axis=0), rtol=1e-6)
    np.testing.assert_array_equal(next(iter(base.batch(3)))["x"], images[:3])
