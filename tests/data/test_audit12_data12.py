"""Audit 12 of fnnc.data: regressions found by probing against independent oracles."""

import numpy as np
import pytest

from fnnc.data import Column, DataError, DataFrame


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


def _flagged(df, csv, value, option):
    """The step that takes ``option`` as a flag, given ``value``."""
    if option == "random":
        return df.map(
            lambda v, rng=None: v + (rng.integers(9) if rng else 0), "x", "y", random=value
        )
    if option == "header":
        return DataFrame.from_csv(csv, header=value)
    if option == "variable_size":
        return df.batch(2).one_squared("n", 4, variable_size=value)
    return df.map(lambda v: np.zeros((2, 3, 3), np.uint8), "x", "img").image_random_jitter(
        "img", size=1, **{option: value}
    )


@pytest.mark.parametrize("option", ["random", "header", "variable_size", "symmetric"])
def test_flags_take_a_bool_or_nnc_01_and_refuse_anything_else(tmp_path, option):
    # map(random=), from_csv(header=), one_squared(variable_size=) and the jitter's
    # center_crop/symmetric read any truthy value as True (header='no' kept the header,
    # random='no' passed rng= to a function without it), as batch/shard no longer do.
    csv = tmp_path / "f.csv"
    csv.write_text("a,b\n1,2\n")
    df = DataFrame.from_arrays(x=np.arange(4), n=np.array([1, 2, 1, 1]))
    for nnc, meant in ((1, True), (0, False), (np.bool_(True), True)):
        got, want = _flagged(df, csv, nnc, option), _flagged(df, csv, meant, option)
        assert repr(got) == repr(want)
        a, b = got.iterator(seed=3), want.iterator(seed=3)
        for x, y in zip(a, b):
            assert x.keys() == y.keys()
            for k in x:
                np.testing.assert_array_equal(x[k], y[k])
    with pytest.raises(DataError, match=f"{option} must be True or False .*got 'no'"):
        _flagged(df, csv, "no", option)


def test_from_csv_reads_other_encodings_and_says_which_it_expected(tmp_path):
    # A latin-1 file raised the codec's raw UnicodeDecodeError naming neither the file
    # nor a way to read it (NNC reads bytes); from_csv takes encoding= now.
    path = tmp_path / "latin.csv"
    path.write_bytes("name,n\ncaf\xe9,1\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin\.csv is not utf-8 text.*encoding='latin-1'"):
        DataFrame.from_csv(path)
    df = DataFrame.from_csv(path, encoding="latin-1")
    assert [(r["name"], r["n"]) for r in df] == [("café", "1")]
    bom = tmp_path / "bom.csv"
    bom.write_bytes("\ufeffa,b\n1,2\n".encode())
    assert DataFrame.from_csv(bom, encoding="utf-8-sig").columns == ("a", "b")


def test_dataframe_of_a_non_mapping_says_what_it_takes():
    # DataFrame([array]) raised "'list' object has no attribute 'items'".
    with pytest.raises(DataError, match=r"expected a mapping \{name: column\}, got list"):
        DataFrame([np.arange(3)])
    assert DataFrame({"x": np.arange(3)})[2]["x"] == 2


def test_an_object_array_column_batches_as_its_rows_stacked():
    # An object array (rows that are arrays, e.g. a ragged data set) was gathered as is:
    # batch gave an object array of arrays, shape (B,), where a list of the same rows
    # stacks to [B, n] and ragged rows are a DataError naming the rows.
    rows = [np.full(2, float(i)) for i in range(5)]
    column = np.empty(5, dtype=object)
    column[:] = rows
    got = [b.tolist() for b in DataFrame.from_arrays(x=column).batch(2).iterator("x")]
    want = [np.stack(rows[i : i + 2]).tolist() for i in range(0, 5, 2)]
    assert got == want
    ragged = np.empty(3, dtype=object)
    ragged[:] = [np.zeros(2), np.zeros(3), np.zeros(1)]
    frame = DataFrame.from_arrays(x=ragged)
    with pytest.raises(DataError, match=r"column 'x' changes shape.*row 1 has shape \(3,\)"):
        next(iter(frame.batch(2)))
    sampled = next(iter(frame.sample(3).iterator("x")))
    assert [v.shape for v in sampled] == [(2,), (3,), (1,)]


@pytest.mark.parametrize("read", [dict(threads=2), dict(threads=0, prefetch=2)])
def test_none_values_of_one_column_are_kept_by_reading_threads(tmp_path, read):
    # Grain's iterators drop None elements (its filter): iterator("b") of a CSV column
    # with missing fields, or of a map that forgot its return, lost those rows with
    # threads or prefetch (threads=0 kept them), so the stream depended on threads.
    csv = tmp_path / "f.csv"
    csv.write_text("a,b\n1,2\n3\n5,6\n7\n")
    df = DataFrame.from_csv(csv)
    want = ["2", None, "6", None]  # oracle: the file, field by field
    assert list(df.iterator("b", threads=0)) == want
    it = df.iterator("b", epochs=2, **read)
    assert [next(it) for _ in range(5)] == want + want[:1]
    resumed = df.iterator("b", **read)
    resumed.set_state(it.get_state())
    assert list(resumed) == want[1:]
    assert list(df.map(lambda v: None, "a", "c").iterator("c", **read)) == [None] * 4


class _Runs(Column):
    """Gathers runs of consecutive rows only; None asks for the rows one by one."""

    def __len__(self):
        return 6

    def read(self, row):
        return np.full(2, row)

    def gather(self, rows):
        if np.array_equal(rows, np.arange(rows[0], rows[0] + rows.size)):
            return np.stack([self.read(r) for r in rows])
        return None


def test_a_column_gather_may_answer_none_as_documented():
    # Column.gather says "or None to read them one by one"; the reader used the None as
    # the batch, and Grain then dropped that element: a shuffled epoch of 3 batches gave
    # 1, and sample raised a raw TypeError.
    df = DataFrame({"x": _Runs(), "i": np.arange(6)}).shuffle()
    batches = list(df.batch(2).iterator(("x", "i"), seed=1))
    assert len(batches) == 3
    for x, i in batches:
        np.testing.assert_array_equal(x, np.stack([np.full(2, r) for r in i]))
    for x, i in df.sample(4).iterator(("x", "i"), seed=1):
        assert [v.tolist() for v in x] == [[r, r] for r in i]
