"""Errors name what went wrong where: the column, the row, the shapes, the columns known."""

import functools

import numpy as np
import pytest

from fnnc.data import DataError, DataFrame
from fnnc.errors import FnncError


def frame(n=12):
    return DataFrame.from_arrays(x=np.arange(n), y=np.arange(n) * 2)


def fails_on_seven(x):
    if x == 7:
        raise ZeroDivisionError("seven")
    return x


@pytest.mark.parametrize("threads", [0, 2])
def test_a_raising_map_names_the_column_and_row(threads):
    df = frame().shuffle().map(fails_on_seven, "x", "safe").batch(4)
    with pytest.raises(DataError, match=r"fails_on_seven -> column 'safe' failed on row 7") as e:
        list(df.iterator(threads=threads))
    assert "ZeroDivisionError: seven" in str(e.value)
    assert isinstance(e.value.__cause__, ZeroDivisionError)
    assert isinstance(e.value, FnncError) and isinstance(e.value, ValueError)


def test_a_raising_map_after_batch_names_the_rows():
    df = frame(8).batch(4).map(lambda x: 1 / 0 if x[0] == 4 else x, "x", "z")
    with pytest.raises(DataError, match=r"column 'z' failed on rows \[4, 5, 6, 7\]"):
        list(df)


def test_shapes_changing_mid_epoch_in_a_batch():
    df = DataFrame.from_function(lambda i: np.zeros(2 if i < 6 else 3), 10, "v").batch(4)
    it = df.iterator("v")
    assert next(it).shape == (4, 2)
    with pytest.raises(DataError) as e:
        next(it)
    message = str(e.value)
    assert "column 'v'" in message and "row 6" in message and "row 4" in message
    assert "(3,)" in message and "(2,)" in message


def test_unknown_columns_list_the_columns():
    df = frame()
    with pytest.raises(DataError, match=r"no column 'z' \(the dataframe has 2 columns: 'x', 'y'\)"):
        df.map(lambda z: z, "z", "w")
    with pytest.raises(DataError, match=r"no columns 'a', 'b'.*'x', 'y'"):
        df.iterator(("a", "x", "b"))
    with pytest.raises(DataError, match=r"batch.*no column 'q'"):
        df.batch(2, columns=["q"])
    with pytest.raises(DataError, match=r"no column 'x'.*'y'"):
        df.batch(2, columns=["y"]).map(lambda x: x, "x", "x2")


def test_a_raising_sample_function_and_a_failing_read():
    df = frame(6).sample(3, lambda xs: xs[5], inputs="x")
    with pytest.raises(
        DataError, match=r"sample <lambda> -> column 'sample' failed on rows \[0, 1, 2\]"
    ):
        list(df)
    broken = DataFrame.from_function(lambda i: [][i], 3, "v")
    with pytest.raises(DataError, match=r"reading column 'v' .* failed on row 0: IndexError"):
        list(broken)


def test_wrong_number_of_map_outputs():
    df = frame(3).map(lambda x: (x, x, x), "x", ("a", "b"))
    with pytest.raises(DataError, match=r"must return 2 values .* returned 3 values on row 0"):
        list(df)


def test_bad_descriptions_fail_when_described():
    with pytest.raises(DataError, match="positive"):
        frame().batch(0)
    with pytest.raises(DataError, match=r"index must be in \[0, count\)"):
        frame().shard(3, 3)
    with pytest.raises(DataError, match="both index and count"):
        frame().shard(1)
    with pytest.raises(DataError, match="twice"):
        frame().map(lambda x: x, ("x", "x"), "z")


def test_a_batch_or_shard_that_leaves_no_rows_fails_when_described():
    """batch(k > rows, drop_remainder=True), or more shards than rows, gave a silently
    empty epoch (the stages' promise: a batch larger than the data is reported)."""
    with pytest.raises(DataError, match=r"^batch\(13,drop\): the dataframe has 12 rows, "):
        frame().batch(13, drop_remainder=True)
    with pytest.raises(DataError, match=r"^sample\(13,drop\): .*give at least 13 rows"):
        frame().sample(13, drop_remainder=True)
    with pytest.raises(DataError, match=r"^shard\(0/13,drop\): .*12 rows, none for shard 0"):
        frame().shard(0, 13)
    with pytest.raises(DataError, match=r"^shard\(12/13\): .*at least 13 rows"):
        frame().shard(12, 13, drop_remainder=False)
    with pytest.raises(DataError, match=r"^batch\(2,drop\): the dataframe has 1 row,"):
        frame().shard(0, 12).batch(2, drop_remainder=True)
    x = np.arange(12)  # what leaves rows reads as NumPy's slices; no rows stay no rows
    assert [b.tolist() for b in frame().batch(12, drop_remainder=True).iterator("x")] == [
        x.tolist()
    ]
    assert list(frame().shard(11, 13, drop_remainder=False).iterator("x")) == x[11::13].tolist()
    assert len(frame(0).batch(4, drop_remainder=True).shard(1, 2)) == 0


def test_from_function_rows_must_be_a_whole_count():
    """rows=2.5 gave 2 rows and rows="3" 3, silently."""
    squares = DataFrame.from_function(lambda i: i * i, np.int64(4), "v").iterator("v")
    assert [int(v) for v in squares] == [k * k for k in range(4)]
    for bad in (2.5, "3", True, -1):
        with pytest.raises(DataError, match=r"^from_function: rows must be an integer >= 0"):
            DataFrame.from_function(lambda i: i, bad)


def test_numpy_integers_are_integers_and_bools_are_not():
    """Sizes from NumPy (np.prod, a config array) were refused as "not a positive
    integer", and df[np.int64(2)] as a row out of range; True was a batch of 1."""
    n = np.int64(2)
    df = frame()
    np.testing.assert_array_equal(next(iter(df.batch(n)))["x"], [0, 1])
    assert [len(list(df.shard(i, n))) for i in (np.int32(0), 1)] == [6, 6]
    assert df[n]["x"] == df[2]["x"] == 2
    assert df.one_hot("x", np.int64(12))[3]["x_one_hot"].tolist() == np.eye(12)[3].tolist()
    list(df.shuffle(np.uint8(3)).read_with(threads=np.int64(1)))
    for bad in (lambda: df.batch(True), lambda: df.batch(np.float64(2.0)), lambda: df.batch(0)):
        with pytest.raises(DataError, match="size must be a positive integer"):
            bad()
    with pytest.raises(DataError, match=r"shard: index must be an integer >= 0, got -1"):
        df.shard(-1, 2)
    with pytest.raises(IndexError, match="row True of a dataframe with 12 rows"):
        df[True]


@pytest.mark.parametrize(
    "add, name",
    [
        (lambda df: df.one_hot("label", 3), "one_hot"),
        (lambda df: df.copy_scalar("label"), "copy_scalar"),
        (lambda df: df.one_squared("label", 4), "one_squared"),
        (lambda df: df.truncate("x", "label"), "truncate"),
    ],
)
def test_an_add_on_names_itself(add, name):
    with pytest.raises(DataError, match=rf"^map {name}: no column 'label'"):
        add(frame())


def test_an_add_on_failing_on_a_row_names_itself_and_a_partial_its_function():
    with pytest.raises(DataError, match=r"^map one_hot -> column 'x_one_hot' failed on row 3"):
        list(frame(4).one_hot("x", 3))
    with pytest.raises(DataError, match=r"^map truncate -> column 'a', 'b' failed on row 3"):
        list(
            frame(4)
            .map(lambda x: np.zeros(2), "x", "v")
            .truncate(["v", "v"], ["x", "x"], ["a", "b"])
        )
    with pytest.raises(DataError, match=r"^map fails_on_seven -> column 's'"):
        list(frame().map(functools.partial(fails_on_seven), "x", "s"))


@pytest.mark.parametrize(
    "value, says",
    [
        (3, "cannot make a column of int"),
        ("abc", "a string is not a column"),
        (np.array(3), "a 0-d array"),
    ],
)
def test_from_arrays_of_something_not_a_column_names_the_column(value, says):
    with pytest.raises(DataError, match=rf"^column 'x': {says}"):
        DataFrame.from_arrays(x=value, y=np.arange(2))


def test_names_that_are_not_names_and_a_sequence_that_is_none_are_data_errors():
    """``map(..., output=None)``, ``from_sequence(rows, names=3)`` and ``iterator(columns=3)``
    were ``TypeError: ... is not iterable``; ``from_sequence(None)`` was ``TypeError: object
    of type 'NoneType' has no len()``."""
    df = frame(3)
    with pytest.raises(DataError, match=r"map output: expected column names .* got None"):
        df.map(lambda a: a, "x", output=None)
    with pytest.raises(DataError, match=r"names: expected column names .* got 3"):
        DataFrame.from_sequence([(1, 2)], names=3)
    with pytest.raises(DataError, match=r"columns: expected column names .* got 3"):
        df.iterator(columns=3)
    with pytest.raises(DataError, match=r"from_sequence: expected a sequence of rows .* NoneType"):
        DataFrame.from_sequence(None)
    with pytest.raises(DataError, match=r"got generator; wrap an iterator in list\(\)"):
        DataFrame.from_sequence(i for i in range(3))
    assert DataFrame.from_sequence(range(3))[2] == {"row": 2}
    assert DataFrame.from_sequence([(1, 2)], names=("a", "b"))[0] == {"a": 1, "b": 2}
