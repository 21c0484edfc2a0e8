"""NNC's dataframe.tests.c, translated: synchronous prefetch and reduce (sample).

NNC counts calls of a column's ``data_enum``; a batched read (``prefetch(3)``, a reduce
group) is one call there. Here a column counts the rows it reads for prefetch (Grain
reads elements one at a time) and its ``gather`` calls for sample, where one call
reads a whole group as NNC does.
"""

import numpy as np

from fnnc.data import DataFrame
from fnnc.data.sources import ArrayColumn


class Counting(ArrayColumn):
    """An array column that counts row reads and gather calls (NNC's ``_ccv_iter_accessed``)."""

    def __init__(self, array):
        super().__init__(np.asarray(array))
        self.reads = 0
        self.gathers = 0

    def read(self, row):
        self.reads += 1
        return super().read(row)

    def gather(self, rows):
        self.gathers += 1
        return super().gather(rows)


INTS = [2, 3, 4, 5, 6, 7, 8, 9]


def frame(values=INTS, plus_one=False):
    column = Counting(values)
    df = DataFrame({"x": column})
    if plus_one:
        df = df.map(lambda x: x + 1, "x", "x")
    return df, column


def take(it):
    return int(next(it))


def test_prefetched_rows_are_not_read_again():  # "iterate through a simple dataframe", iter2
    for plus_one in (False, True):  # and "iterate through derived column"
        values = [0, 3, 4, 5, 6, 7, 8, 9]
        df, column = frame(values, plus_one)
        it = df.iterator("x")
        for _ in range(3):
            assert it.prefetch(1) == 1
        column.reads = 0
        result = [take(it) for _ in range(3)]
        assert column.reads == 0
        result.append(take(it))
        assert column.reads == 1
        it.prefetch(1)
        assert column.reads == 2
        column.reads = 0
        result += [take(it) for _ in range(4)]
        assert column.reads == 3  # the first was prefetched
        assert result == [v + plus_one for v in values]


def test_prefetch_reports_the_end():  # iter3 of the same cases
    df, column = frame(plus_one=True)
    it = df.iterator("x")
    for _ in range(3):
        it.prefetch(1)
    result = []
    for _ in range(2):
        column.reads = 0
        result.append(take(it))
        assert column.reads == 0
        assert it.prefetch(1) == 1
        assert column.reads == 1
    it.prefetch(1), it.prefetch(1)
    column.reads = 0
    result += [take(it) for _ in range(5)]
    assert column.reads == 0
    result.append(take(it))
    assert column.reads == 1
    assert it.prefetch(1) == 0  # NNC: -1, cannot advance
    assert result == [v + 1 for v in INTS]
    assert it.prefetch(3) == 0 and list(it) == []


def test_prefetch_more_than_one_and_fewer_at_the_end():  # "prefetch more than 1 item"
    df, column = frame(plus_one=True)
    it = df.iterator("x")
    assert it.prefetch(3) == 3 and column.reads == 3
    result = [take(it) for _ in range(3)]
    assert it.prefetch(2) == 2
    result.append(take(it))
    assert it.prefetch(10) == 3  # 4 rows left, 1 of them held: 3 more
    column.reads = 0
    result += [take(it) for _ in range(4)]
    assert column.reads == 0
    assert result == [v + 1 for v in INTS]


def test_set_state_drops_the_prefetched_rows():  # "derived column with cursor reset"
    """NNC TEST_CASE covered here:
    "iterate through derived column with cursor reset".
    """
    df, column = frame(plus_one=True)
    it = df.iterator("x")
    start = it.get_state()
    it.prefetch(3)
    take(it), take(it)
    it.prefetch(2)
    it.set_state(start)  # NNC's set_cursor(0)
    it.prefetch(1), it.prefetch(1)
    column.reads = 0
    result = [take(it) for _ in range(7)]
    assert column.reads == 5
    result.append(take(it))
    assert it.prefetch(1) == 0
    assert result == [v + 1 for v in INTS]


def test_state_after_prefetch_resumes_at_the_next_unconsumed_row():
    x = np.arange(10)
    for threads in (0, 2):
        df = DataFrame.from_arrays(x=x).shuffle(seed=3)
        it = df.iterator("x", threads=threads)
        first = [int(next(it)) for _ in range(3)]
        assert it.prefetch(4) == 4
        state = it.get_state()
        rest = [int(v) for v in it]
        again = df.iterator("x", threads=threads)
        again.set_state(state)
        assert [int(v) for v in again] == rest
        assert sorted(first + rest) == x.tolist()


def test_shuffled_prefetch_covers_every_row():  # "data is shuffled"
    df, _ = frame(plus_one=True)
    it = df.shuffle().iterator("x", seed=1)
    it.prefetch(3)
    result = [take(it) for _ in range(3)]
    it.prefetch(2)
    result += [take(it) for _ in range(5)]
    assert result != [v + 1 for v in INTS]
    assert sorted(result) == [v + 1 for v in INTS]


def total(xs):
    return int(np.sum(xs))


def test_reduce_reads_its_column_once_per_group():  # "dataframe reduce"
    """NNC TEST_CASE covered here:
    "dataframe sample".
    """
    df, column = frame()
    reduced = df.sample(3, total, inputs="x")
    assert [r for r in reduced.iterator("sample")] == [9, 18, 17]
    assert column.gathers == 3 and column.reads == 0


def test_sample_lists_are_gathered_per_group():
    df, column = frame()
    groups = [[int(v) for v in g] for g in df.sample(3).iterator("x")]
    assert groups == [INTS[0:3], INTS[3:6], INTS[6:8]]
    assert column.gathers == 3 and column.reads == 0


def test_map_before_and_after_reduce():  # "map before reduce", "map after reduce"
    """NNC TEST_CASEs covered here:
    "dataframe map before sample",
    "dataframe map after sample",
    "dataframe map after sample shuffled".
    """
    df, _ = frame(plus_one=True)
    assert list(df.sample(3, total, inputs="x").iterator("sample")) == [12, 21, 19]
    df, column = frame()
    after = df.sample(3, total, inputs="x").map(lambda s: s + 1, "sample", "derived")
    assert list(after.iterator("derived")) == [10, 19, 18]
    assert (column.gathers, column.reads) == (3, 0)
    shuffled = after.shuffle().iterator("derived", seed=2)  # "map after reduce shuffled"
    assert sorted(shuffled) == [10, 18, 19]


def test_newly_added_column_prefetch():  # "iterate through newly added column"
    df = DataFrame.from_function(lambda i: INTS[i], 8, "x")
    it = df.iterator("x")
    for _ in range(3):
        it.prefetch(1)
    result = [take(it) for _ in range(4)]
    assert it.prefetch(4) == 4
    result += [take(it) for _ in range(2)]
    assert it.prefetch(1) == 0  # NNC: -1; rows 6 and 7 are held, none is left
    assert result == INTS[:6] and [take(it) for _ in range(2)] == INTS[6:]
