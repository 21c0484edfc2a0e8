"""Audit 10 of fnnc.data against NNC's dataframe.tests.c / dataframe.addons.tests.c and
lib/nnc/ccv_cnnp_dataframe*.c (liuliu/ccv): cases where fnnc had no equivalent."""

import json

import numpy as np
import pytest

from fnnc.data import DataError, DataFrame

INTS = np.array([2, 3, 4, 5, 6, 7, 8, 9], dtype=np.int32)


def nnc_combine(order, batch_count, group_count=1):
    """NNC's _ccv_cnnp_combine_new over a sample of batch_count * group_count rows:
    group i's row k of a sample holding n rows is input[(k + i * batch_count) % n]."""
    size = batch_count * group_count
    out = []
    for start in range(0, len(order), size):
        rows = order[start : start + size]
        for i in range(group_count):
            out.append([rows[(k + i * batch_count) % len(rows)] for k in range(batch_count)])
    return out


def test_batch_wrap_fills_the_last_batch_as_nnc_combine():
    # NNC "batching tensors": one-hot labels of INTS in batches of 3; NNC's last batch
    # holds rows 6, 7, 6 (its own rows again), fnnc's plain batch only rows 6, 7.
    df = DataFrame.from_arrays(y=INTS).one_hot("y", 10)
    batches = list(df.batch(3, columns=["y_one_hot"], wrap=True).iterator("y_one_hot"))
    eye = np.eye(10, dtype=np.float32)
    expected = [eye[INTS[rows]] for rows in nnc_combine(list(range(8)), 3)]
    assert len(batches) == 3 and [b.shape for b in batches] == [(3, 10)] * 3
    for got, want in zip(batches, expected):
        np.testing.assert_array_equal(got, want)
    # group_count 2 is a batch of 6 split in two: NNC's (k + i * 3) % n on rows 6, 7
    six = [b.tolist() for b in DataFrame.from_arrays(x=INTS).batch(6, wrap=True).iterator("x")]
    groups = [g for b in six for g in (b[:3], b[3:])]
    assert groups == [INTS[rows].tolist() for rows in nnc_combine(list(range(8)), 3, 2)]


def test_batch_wrap_follows_the_shuffle_and_keeps_a_full_batch_alone():
    df = DataFrame.from_arrays(x=np.arange(7)).shuffle()
    order = [int(v) for v in df.iterator("x", seed=4, epoch=1)]
    wrapped = df.batch(3, wrap=True)
    got = [b.tolist() for b in wrapped.iterator("x", seed=4, epoch=1)]
    assert got == nnc_combine(order, 3) and len(wrapped) == 3
    assert [
        b.tolist() for b in DataFrame.from_arrays(x=np.arange(6)).batch(3, wrap=True).iterator("x")
    ] == [[0, 1, 2], [3, 4, 5]]
    it = wrapped.iterator("x", seed=4, epoch=1)  # a state resumes inside the wrapped epoch
    next(it)
    again = wrapped.iterator("x")
    again.set_state(json.loads(json.dumps(it.get_state())))
    assert [b.tolist() for b in again] == got[1:]


def test_batch_wrap_repeats_a_row_with_its_own_random_draw_and_works_on_batches():
    noise = DataFrame.from_arrays(x=np.zeros(5)).map(
        lambda v, rng: v + rng.random(), "x", "x", random=True
    )
    last = list(noise.batch(3, wrap=True).iterator("x", seed=1))[-1]
    assert last[0] == last[2] != last[1]  # NNC's combine copies the same row's tensor
    pairs = DataFrame.from_arrays(x=np.arange(10)).batch(2).batch(4, wrap=True)
    assert [b.tolist() for b in pairs.iterator("x")][-1] == [[8, 9], [8, 9], [8, 9], [8, 9]]
    with pytest.raises(DataError, match="one of them"):
        DataFrame.from_arrays(x=INTS).batch(3, drop_remainder=True, wrap=True)


def test_csv_columns_are_the_fields_of_the_first_line_as_nnc_counts_them(tmp_path):
    # NNC's from_csv_new counts the delimiters of the first line ("has 4 columns based
    # on header") and stores no field past that count on later lines; fnnc made a
    # column for the longest line instead ("2" here, beside a and b).
    path = tmp_path / "ragged.csv"
    path.write_text('a,b\n1,2,3\n4\n"x,y",5,6,7\n')
    df = DataFrame.from_csv(path)
    assert df.columns == ("a", "b")
    assert [tuple(r) for r in df.iterator(("a", "b"))] == [("1", "2"), ("4", None), ("x,y", "5")]
    df = DataFrame.from_csv(path, header=False)
    assert df.columns == ("0", "1") and list(df.iterator("1")) == ["b", "2", None, "5"]


def test_newly_added_column_counts_with_a_public_function_column():
    # NNC "iterate through newly added column" (ccv_cnnp_dataframe_add: a data_enum
    # column), with from_function counting its calls; NNC counts one call per batched
    # read, fnnc one per row. Reading threads would read ahead, so threads=0.
    calls = []

    def row(i):
        calls.append(i)
        return int(INTS[i])

    df = DataFrame.from_function(row, 8, "x")
    assert list(df.iterator("x", threads=0)) == INTS.tolist()
    it = df.iterator("x", threads=0)
    assert [it.prefetch(1) for _ in range(3)] == [1, 1, 1]
    calls.clear()
    result = [next(it) for _ in range(3)]
    assert calls == []  # all three were prefetched
    result.append(next(it))
    assert calls == [3]
    assert it.prefetch(4) == 4 and calls == [3, 4, 5, 6, 7]
    calls.clear()
    result += [next(it) for _ in range(2)]
    assert calls == [] and it.prefetch(1) == 0  # NNC: -1, rows 6 and 7 are held
    assert result == INTS[:6].tolist()


def test_batch_and_sample_flags_are_bools_or_nncs_ints():
    """``batch(3, wrap='no')`` wrapped (``bool('no')`` is True); the flags take a bool or
    NNC's 1 / 0 and refuse anything else (review of session 22)."""
    df = DataFrame.from_arrays(x=np.arange(8))
    assert [b.tolist() for b in df.batch(3, wrap=1).iterator("x")][-1] == [6, 7, 6]
    assert [b.tolist() for b in df.batch(3, drop_remainder=np.True_).iterator("x")] == [
        [0, 1, 2],
        [3, 4, 5],
    ]
    for bad in (dict(wrap="no"), dict(drop_remainder="yes"), dict(wrap=2)):
        with pytest.raises(DataError, match=r"batch: \w+ must be True or False"):
            df.batch(3, **bad)
    with pytest.raises(DataError, match=r"sample: drop_remainder must be True or False"):
        df.sample(3, drop_remainder=None)
