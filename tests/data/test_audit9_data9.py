"""Audit 9 of fnnc.data: regressions found by using the dataframe as a demanding user."""

import numpy as np
import pytest

from fnnc.data import DataError, DataFrame


def shift_in_place(v):
    v -= 1.0  # an augmentation written in place
    return v


def shift(v):
    return v - 1.0


@pytest.mark.parametrize(
    "column",
    [
        lambda a: a,  # an array column
        lambda a: list(a.copy()),  # a list of arrays (ragged data)
    ],
    ids=["array", "list"],
)
def test_a_map_cannot_change_the_data_set_in_place(column):
    # A row read alone was a writable view of the source array (or the list's own
    # array): an in-place map changed the data set, so epoch 1 read -2 where a fresh
    # epoch-1 iterator (and any worker process, with its own copy) read -1.
    a = np.zeros((4, 2), np.float32)
    source = column(a)
    frame = DataFrame.from_arrays(x=source)
    with pytest.raises(DataError, match=r"map shift_in_place .* row \d.*read-only.*copy"):
        next(iter(frame.map(shift_in_place, "x", "y").batch(2)))
    kept = np.stack(source) if isinstance(source, list) else source
    np.testing.assert_array_equal(kept, np.zeros((4, 2)))  # oracle: the data as given
    # the same map written out of place gives the same values every epoch
    df = frame.map(shift, "x", "y").batch(2)
    epochs = [[b["y"] for b in df.iterator(epoch=e)] for e in range(2)]
    np.testing.assert_array_equal(np.concatenate(epochs[0]), kept - 1.0)
    np.testing.assert_array_equal(np.concatenate(epochs[1]), kept - 1.0)

    # a sample function writing into its rows gets the same hint
    def zero_first(rows):
        rows[0][:] = 0
        return rows[0]

    if isinstance(source, list):
        with pytest.raises(DataError, match=r"sample zero_first .*read-only.*copy"):
            next(iter(frame.sample(2, zero_first, inputs="x")))
    # a gathered batch is the reader's own copy: writing it leaves the source alone
    batch = next(iter(frame.batch(2)))["x"]
    batch += 5
    np.testing.assert_array_equal(np.stack(source), np.zeros((4, 2)))


def test_rows_read_alone_are_read_only_views_and_the_source_stays_writable():
    a = np.arange(6, dtype=np.int16).reshape(3, 2)
    row = next(iter(DataFrame.from_arrays(x=a)))["x"]
    assert not row.flags.writeable and np.shares_memory(row, a)
    assert row.dtype == np.int16 and row.tolist() == [0, 1]
    assert a.flags.writeable
    scalar = next(iter(DataFrame.from_arrays(x=np.arange(3, dtype=np.int16))))["x"]
    assert scalar.flags.writeable and scalar.dtype == np.int16  # a copy: free to write
    rows = DataFrame.from_sequence([{"v": np.ones(2)}], ["v"])[0]["v"]
    assert not rows.flags.writeable
    # a function's rows are its own fresh values: left writable
    fresh = DataFrame.from_function(lambda i: (np.full(2, i),), 2, ["v"])[1]["v"]
    assert fresh.flags.writeable and fresh.tolist() == [1, 1]


IMAGES = np.arange(2 * 8 * 10 * 3, dtype=np.float32).reshape(2, 8, 10, 3) % 255


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"size": 4.5}, "size must be an integer"),
        ({"size": (True, 4)}, "size must be an integer"),
        ({"resize": (6.5, 8)}, "resize must be an integer"),
        ({"resize": ("6", 8)}, "resize must be an integer"),
        ({"offset": (1.5, 0), "size": (4, 4)}, "offset must be an integer"),
        ({"resize": (6, 8), "roundup": 2.5}, "roundup must be an integer >= 0"),
        ({"resize": (6, 8), "roundup": -4}, "roundup must be an integer >= 0"),
        ({"brightness": -1}, "brightness must be a finite number >= 0"),
        ({"contrast": -0.5}, "contrast must be a finite number >= 0"),
        ({"lighting": -1}, "lighting must be a finite number >= 0"),
        ({"aspect_ratio": float("nan")}, "aspect_ratio must be a finite number >= 0"),
        ({"saturation": "0.1"}, "saturation must be a number >= 0"),
    ],
)
def test_jitter_options_are_checked_when_the_jitter_is_made(options, says):
    # These were accepted and failed on the first image read ("'float' object cannot be
    # interpreted as an integer", "math domain error", naming no option), or silently
    # ran: size=(True, 4) cropped 1 row, lighting=-1 subtracted the PCA colour noise,
    # contrast=-0.5 drew from [0.5, 2] as contrast=1, roundup=-4 and aspect_ratio=nan
    # were ignored.
    with pytest.raises(DataError, match=f"image_random_jitter: {says}"):
        DataFrame.from_arrays(im=IMAGES).image_random_jitter("im", **options)


def test_jitter_options_of_numpy_integers_and_offset_none_keep_working():
    from fnnc.data.jitter import Jitter

    rng = np.random.default_rng(0)
    jitter = Jitter(size=np.array([4, 6]), offset=None, center_crop=True, roundup=np.int64(0))
    assert jitter.size == (4, 6) and jitter.offset == (0, 0)
    assert all(type(v) is int for v in jitter.size)
    # oracle: the centre crop is the slice NNC's formula gives, (8-4+1)//2 and (10-6+1)//2
    np.testing.assert_array_equal(jitter(IMAGES[0], rng=rng), IMAGES[0][2:6, 2:8])


@pytest.mark.parametrize(("threads", "prefetch"), [(0, 2), (1, 1)])
def test_iterators_left_open_are_closed_at_exit_before_grain_finalizes_them(threads, prefetch):
    # A script ending with an unfinished iterator reading ahead on Grain threads (or
    # worker processes) printed "Exception ignored in DatasetIterator.__del__ ...
    # 'NoneType' object has no attribute 'Empty'" per thread: Grain's finalizer ran
    # while the interpreter tore its modules down. fnnc now closes them at exit; the
    # exit hook is called directly here (the shutdown itself needs a subprocess).
    from fnnc.data import iterator as iterators

    df = DataFrame.from_arrays(x=np.arange(7)).batch(2)
    it = df.iterator("x", threads=threads, prefetch=prefetch)
    assert next(it).tolist() == [0, 1]
    assert it in iterators._reading
    iterators._close_at_exit()
    assert it._iter is None and it not in iterators._reading
    # closing keeps the position: reading on restarts there (oracle: range(7) in twos)
    assert [b.tolist() for b in it] == [[2, 3], [4, 5], [6]]
    plain = df.iterator("x")  # read in this thread: nothing to close
    next(plain)
    assert plain not in iterators._reading


def test_batching_a_tuple_column_of_unequal_parts_names_the_column():
    # NNC's tuple columns: rows of (array, label) in one column. batch() raised NumPy's
    # raw "inhomogeneous shape" ValueError from np.shape, naming no column or row.
    df = DataFrame.from_sequence([(np.zeros(2), 1), (np.ones(2), 0)], "pair")
    with pytest.raises(DataError, match=r"batch: column 'pair' holds a tuple on row 0 .*split"):
        next(iter(df.batch(2)))
    # split into columns, the same rows batch (oracle: np.stack of each part)
    split = DataFrame.from_sequence([(np.zeros(2), 1), (np.ones(2), 0)], ["x", "y"]).batch(2)
    batch = next(iter(split))
    np.testing.assert_array_equal(batch["x"], np.stack([np.zeros(2), np.ones(2)]))
    assert batch["y"].tolist() == [1, 0]
    # tuples of equal parts still stack as one array, as np.stack does
    pairs = DataFrame.from_sequence([(1, 2), (3, 4)], "pair").batch(2)
    np.testing.assert_array_equal(next(iter(pairs))["pair"], np.stack([(1, 2), (3, 4)]))


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (
            {"on": 0.9, "off": 0.05, "dtype": np.int32},
            r"on=0.9 does not fit dtype int32 \(it would be 0\)",
        ),
        ({"on": 2, "dtype": bool}, r"on=2 does not fit dtype bool"),
        ({"off": 300, "dtype": np.uint8}, r"off=300 does not fit dtype uint8"),
        (
            {"on": 1e6, "dtype": np.float16},
            r"on=1000000.0 does not fit dtype float16 \(it would be inf\)",
        ),
        ({"on": "a"}, r"on must be a number, got 'a'"),
    ],
)
def test_one_hot_values_its_dtype_cannot_hold_are_refused(options, says):
    # on=0.9 with dtype=int32 gave all-zero vectors: the label was silently lost.
    labels = DataFrame.from_arrays(y=np.array([2, 0]))
    with pytest.raises(DataError, match=f"one_hot: {says}"):
        labels.one_hot("y", 3, **options)


def test_one_hot_values_that_fit_keep_working():
    labels = DataFrame.from_arrays(y=np.array([2, 0]))
    got = labels.one_hot("y", 3, on=np.int64(5), off=-1, dtype=np.int8)[0]["y_one_hot"]
    assert got.dtype == np.int8 and got.tolist() == [-1, -1, 5]
    soft = labels.one_hot("y", 3, on=0.9, off=0.05, dtype=np.float16)[1]["y_one_hot"]
    oracle = np.array([0.9, 0.05, 0.05], np.float16)  # NumPy's rounding of each value
    assert soft.dtype == np.float16 and soft.tolist() == oracle.tolist()


def test_take_and_getitem_mistakes_are_data_errors_saying_what_to_do():
    # take(-1) raised islice's "Stop argument for islice() must be None or an integer";
    # df["x"] an IndexError "row 'x' of a dataframe with 3 rows"
    df = DataFrame.from_arrays(x=np.arange(3))
    with pytest.raises(DataError, match=r"take n must be an integer >= 0, got -1"):
        df.iterator("x").take(-1)
    with pytest.raises(DataError, match=r"indexed by row number.*df\[i\]\['x'\].*columns: x"):
        df["x"]
    assert [int(v) for v in df.iterator("x").take(np.int64(2))] == [0, 1]
    with pytest.raises(IndexError, match="row 3 of a dataframe with 3 rows"):
        df[3]


@pytest.mark.parametrize(("threads", "prefetch"), [(0, 2), (1, 1)])
def test_a_state_continues_at_its_position_whatever_its_grain_part_says(threads, prefetch):
    # A threaded iterator's state carries Grain's own state beside the position;
    # set_state gave it to Grain even when it disagreed with the position, so a state
    # rewound to position 0 continued at batch 3 (only [[6, 7]] of 4 batches), and a
    # damaged "grain" part raised a raw KeyError / TypeError.
    df = DataFrame.from_arrays(x=np.arange(8)).shuffle().batch(2)
    oracle = [b.tolist() for b in df.iterator("x", seed=3)]  # read by index, no threads
    it = df.iterator("x", seed=3, threads=threads, prefetch=prefetch)
    it.take(3)
    state = it.get_state()
    assert state["grain"] is not None

    def rest(edited):
        again = df.iterator("x", threads=threads, prefetch=prefetch)
        again.set_state(edited)
        return [b.tolist() for b in again]

    assert rest(state) == oracle[3:]
    assert rest({**state, "position": 0}) == oracle
    assert rest({**state, "position": 1}) == oracle[1:]
    for damaged in ({"foo": 1}, 5, {"opened_at": "a", "workers": 0, "state": {}}):
        assert rest({**state, "grain": damaged}) == oracle[3:]


def test_a_state_with_numpy_integers_gives_json_states_again():
    # set_state accepts NumPy integers (a state restored from an array checkpoint), but
    # kept a NumPy seed as it was: the next get_state() failed json.dumps ("Object of
    # type int64 is not JSON serializable"), though documented as JSON-able.
    import json

    df = DataFrame.from_arrays(x=np.arange(8)).shuffle().batch(2)
    saved = df.iterator("x", seed=5).get_state()
    numpy_state = {**saved, "seed": np.int64(5), "position": np.int64(1), "stop": np.int32(4)}
    it = df.iterator("x")
    it.set_state(numpy_state)
    state = json.loads(json.dumps(it.get_state()))
    assert (state["seed"], state["position"], state["stop"]) == (5, 1, 4)
    oracle = [b.tolist() for b in df.iterator("x", seed=5)]
    assert [b.tolist() for b in it] == oracle[1:]


def test_a_map_seed_without_random_is_refused():
    # map(fn, ..., seed=3) without random=True was accepted and the seed silently unused
    df = DataFrame.from_arrays(x=np.arange(4))
    with pytest.raises(DataError, match=r"map: seed=3 seeds the rng=.*random=True"):
        df.map(lambda v: v, "x", "y", seed=3)
    draws = df.map(lambda v, rng: rng.random(), "x", "y", random=True, seed=3)
    assert [float(v) for v in draws.iterator("y", seed=0)] == [
        float(v)
        for v in draws.iterator("y", seed=9)  # its own seed: the iterator's unused
    ]


def test_from_csv_checks_its_delimiter_and_quote(tmp_path):
    # '' and 'ab' raised the csv module's raw TypeError; a delimiter equal to the quote
    # read "a,b" as one column silently
    path = tmp_path / "t.csv"
    path.write_text("a;b\n1;2\n")
    for options, says in (
        ({"delimiter": ""}, "delimiter must be one character"),
        ({"delimiter": "ab"}, "delimiter must be one character"),
        ({"quote": "\n"}, "quote must be one character"),
        ({"delimiter": '"'}, "delimiter and quote are both"),
    ):
        with pytest.raises(DataError, match=f"from_csv: {says}"):
            DataFrame.from_csv(path, **options)
    assert DataFrame.from_csv(path, delimiter=";")[0] == {"a": "1", "b": "2"}
