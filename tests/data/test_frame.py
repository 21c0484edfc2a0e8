"""DataFrame as a description: columns, rows, map, batch, sample, constructors."""

import csv

import numpy as np
import pytest

from fnnc.data import DataError, DataFrame


def xy(n=10):
    return DataFrame.from_arrays(x=np.arange(n, dtype=np.float32), y=np.arange(n) * 10)


def test_columns_rows_and_repr():
    df = xy().map(lambda x: x + 1, "x", "x1").batch(4)
    assert df.columns == ("x", "y", "x1")
    assert len(df) == 3
    assert repr(df) == "DataFrame(3 rows; columns x, y, x1; map(x->x1) batch(4))"


def test_description_is_immutable():
    base = xy()
    shuffled = base.shuffle(seed=1)
    assert len(base.map(lambda x: x, "x", "z").columns) == 3
    assert base.columns == ("x", "y")
    assert [r["x"] for r in base] == list(range(10))
    assert [r["x"] for r in shuffled] != list(range(10))


def test_map_derives_columns_row_by_row():
    df = xy().map(lambda x, y: x * 2 + y, ("x", "y"), "z")
    assert [float(r["z"]) for r in df] == [12.0 * i for i in range(10)]


def test_map_several_outputs_and_replacing_a_column():
    df = xy(4).map(lambda x: (x + 1, x - 1), "x", ("up", "down")).map(lambda x: -x, "x", "x")
    rows = list(df.iterator(("x", "up", "down")))
    assert [tuple(map(float, r)) for r in rows] == [(-i, i + 1, i - 1) for i in range(4)]


def test_batch_stacks_and_keeps_the_remainder():
    batches = list(xy(10).batch(4))
    assert [b["x"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert batches[0]["x"].dtype == np.float32 and batches[0]["y"].dtype == np.arange(1).dtype


def test_batch_drop_remainder():
    df = xy(10).batch(4, drop_remainder=True)
    assert len(df) == 2
    assert [b["y"].tolist() for b in df] == [[0, 10, 20, 30], [40, 50, 60, 70]]


def test_batch_columns_keeps_only_those():
    df = xy(4).batch(2, columns=["y"])
    assert df.columns == ("y",)
    assert [b["y"].tolist() for b in df] == [[0, 10], [20, 30]]


def test_map_after_batch_sees_whole_batches_and_maps_before_batch_see_rows():
    df = xy(6).map(lambda x: x * x, "x", "sq").batch(3).map(lambda sq: sq.sum(), "sq", "total")
    assert [float(b["total"]) for b in df] == [5.0, 50.0]


def test_batch_of_batches():
    df = xy(8).batch(2).batch(2, drop_remainder=True)
    first = next(iter(df))
    assert first["x"].shape == (2, 2)
    assert first["x"].tolist() == [[0, 1], [2, 3]]


def test_sample_lists_and_reduces():
    lists = xy(5).sample(2, inputs="y")
    assert [b["y"] for b in lists.iterator()] == [[0, 10], [20, 30], [40]]
    reduced = xy(5).sample(2, lambda xs, ys: float(sum(xs) + sum(ys)), inputs=("x", "y"))
    assert reduced.columns == ("sample",)
    assert [r for r in reduced.iterator("sample")] == [11.0, 55.0, 44.0]


def test_ragged_rows_group_with_sample_and_pad_in_a_map():
    df = DataFrame.from_function(lambda i: np.ones(i + 1), 4, "seq")

    def pad(seqs):
        out = np.zeros((len(seqs), max(len(s) for s in seqs)))
        for i, s in enumerate(seqs):
            out[i, : len(s)] = s
        return out

    padded = df.sample(2).map(pad, "seq", "seq")
    assert [b.shape for b in padded.iterator("seq")] == [(2, 2), (2, 4)]


def test_getitem_reads_one_row_of_epoch_zero():
    df = xy().batch(3)
    assert df[1]["x"].tolist() == [3, 4, 5]
    assert df[-1]["x"].tolist() == [9]
    with pytest.raises(IndexError):
        df[4]


def test_from_sequence_and_function_split_records():
    records = [{"name": f"n{i}", "label": i % 3} for i in range(6)]
    df = DataFrame.from_sequence(records, names=("name", "label"))
    assert [r["name"] for r in df][:2] == ["n0", "n1"]
    assert next(iter(df.batch(6)))["label"].tolist() == [0, 1, 2, 0, 1, 2]

    calls = []

    def make(i):
        calls.append(i)
        return (i, -i)

    df = DataFrame.from_function(make, 3, names=("a", "b"))
    assert [tuple(r) for r in df.iterator(("a", "b"))] == [(0, 0), (1, -1), (2, -2)]
    assert calls.count(1) == 1  # one call per row, however many fields


def test_unread_columns_and_maps_are_skipped():
    calls = []

    def expensive(x):
        calls.append(x)
        return x

    df = xy(4).map(expensive, "x", "e")
    assert [r for r in df.iterator("y")] == [0, 10, 20, 30]
    assert calls == []


def test_from_csv(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('name,value\n"a, quoted",1\n"say ""hi""",2\nshort\n')
    df = DataFrame.from_csv(path)
    assert df.columns == ("name", "value")
    assert [tuple(r) for r in df.iterator(("name", "value"))] == [
        ("a, quoted", "1"),
        ('say "hi"', "2"),
        ("short", None),
    ]
    tsv = tmp_path / "t.tsv"
    tsv.write_text("1\t2\n3\t4\n")
    df = DataFrame.from_csv(tsv, delimiter="\t", header=False).map(int, "1", "b")
    assert [r for r in df.iterator("b")] == [2, 4]


def test_from_csv_reads_long_fields_and_blank_lines_as_nnc_does(tmp_path):
    """A field over Python's 128 KiB csv limit raised csv.Error; a blank line is one
    empty field, as NNC's reader gives it ("" in column 0, NULL in the others)."""
    path = tmp_path / "t.csv"
    long = "x" * 200_000
    path.write_text(f"a,b\n{long},1\n\nshort,2\n")
    limit = csv.field_size_limit()
    rows = [tuple(r) for r in DataFrame.from_csv(path, header=False).iterator(("0", "1"))]
    assert rows == [("a", "b"), (long, "1"), ("", None), ("short", "2")]
    assert csv.field_size_limit() == limit  # Python's process-wide limit is put back


def test_columns_must_have_equal_rows():
    with pytest.raises(DataError, match="different numbers of rows"):
        DataFrame.from_arrays(x=np.zeros(3), y=np.zeros(4))


def test_to_grain_is_one_epoch_of_a_grain_map_dataset():
    import grain

    df = xy(10).shuffle().batch(4)
    ds = df.to_grain("x", seed=2)
    assert isinstance(ds, grain.MapDataset) and len(ds) == 3
    epoch1 = [ds[i].tolist() for i in range(3, 6)]
    assert epoch1 == [b.tolist() for b in df.iterator("x", seed=2, epoch=1)]
