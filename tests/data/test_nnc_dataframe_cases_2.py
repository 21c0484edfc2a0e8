"""NNC's dataframe.tests.c and dataframe.addons.tests.c (liuliu/ccv test/unit/nnc):
the cases tests/data/test_nnc_dataframe.py and tests/data/test_addons.py leave out.

Translation: NNC's integer column (``_ccv_iter_int``) is an array column that counts
its row reads (NNC counts ``data_enum`` calls, one per batched read; Grain reads one
element at a time, so a ``prefetch(3)`` is 3 reads here, 1 there); NNC's
``ccv_cnnp_dataframe_map`` is ``DataFrame.map`` with a named output;
``make_tuple`` / ``extract_tuple`` are a map returning a tuple and a map taking one
item of it; ``iter_peek`` of several columns is an iterator over a tuple of columns;
``prefetch`` returns how many rows it read (0 at the end, where NNC returns -1: a
documented difference, fnnc/data/iterator.py). NNC's CSV reader is ``from_csv``:
``include_header=0`` is ``header=False`` (the first line is data), a missing field is
``None`` (NNC's NULL). NNC's ``quote.csv`` is small and copied here verbatim;
``scaled_data.csv`` (1.4 MB) is rebuilt with its shape (3213 columns, a quoted
header, 24 data rows) around the values NNC's test checks.
"""

from __future__ import annotations

import math

import numpy as np

from fnnc import ops
from fnnc.data import DataFrame
from fnnc.data.sources import ArrayColumn

INTS = [2, 3, 4, 5, 6, 7, 8, 9]


class Counting(ArrayColumn):
    """An int column counting its row reads (NNC's ``_ccv_iter_accessed``)."""

    def __init__(self, values):
        super().__init__(np.asarray(values))
        self.reads = 0

    def read(self, row):
        self.reads += 1
        return super().read(row)


def derived_frame(name="derived"):
    """NNC's column of INTS and ``map(_ccv_int_plus_1)`` on it."""
    column = Counting(INTS)
    df = DataFrame({"x": column}).map(lambda x: x + 1, "x", name)
    return df, column


def take(it):
    return int(next(it))


# -- dataframe.tests.c -------------------------------------------------------------------


def test_derived_column_has_its_name_and_prefetch_stops_at_the_end():
    """NNC: iterate through derived column (the map's name, iter2: prefetch twice more
    succeeds at rows 6 and 7, a third fails)."""
    df, column = derived_frame("map")
    assert df.columns[-1] == "map"
    assert [int(v) for v in df.iterator("map")] == [v + 1 for v in INTS]
    it = df.iterator("map")
    for _ in range(3):
        assert it.prefetch(1) == 1
    column.reads = 0
    result = [take(it) for _ in range(3)]
    assert column.reads == 0  # all three were prefetched
    result.append(take(it))
    assert column.reads == 1
    assert it.prefetch(1) == 1
    assert column.reads == 2
    column.reads = 0
    result += [take(it) for _ in range(2)]
    assert column.reads == 1  # row 4 was prefetched, row 5 is read now
    assert it.prefetch(1) == 1  # NNC: success0
    assert it.prefetch(1) == 1  # NNC: success1
    assert it.prefetch(1) == 0  # NNC: fail0 (-1)
    assert result == [v + 1 for v in INTS[:6]]
    column.reads = 0
    assert [take(it) for _ in range(2)] == [INTS[6] + 1, INTS[7] + 1]
    assert column.reads == 0


def test_prefetch_more_than_one_item_variant_1():
    """NNC: iterate with prefetch more than 1 item, variant 1 (prefetch 3; twice take one
    and prefetch one; prefetch 4 more; the last 6 rows come without a read)."""
    df, column = derived_frame()
    it = df.iterator("derived")
    column.reads = 0
    assert it.prefetch(3) == 3
    assert column.reads == 3  # NNC: one batched data_enum call
    result = []
    for _ in range(2):
        column.reads = 0
        result.append(take(it))
        assert column.reads == 0
        assert it.prefetch(1) == 1
        assert column.reads == 1
    assert it.prefetch(4) == 3  # 6 rows left, 3 held: only 3 more exist
    column.reads = 0
    result += [take(it) for _ in range(6)]
    assert column.reads == 0
    assert result == [v + 1 for v in INTS]
    assert list(it) == []


def test_prefetch_more_than_one_item_variant_2():
    """NNC: iterate with prefetch more than 1 item, variant 2 (prefetch 3, take 3,
    prefetch 2, take 1, prefetch 3: the last 4 rows come without a read)."""
    df, column = derived_frame()
    it = df.iterator("derived")
    column.reads = 0
    assert it.prefetch(3) == 3
    result = []
    for _ in range(3):
        column.reads = 0
        result.append(take(it))
        assert column.reads == 0
    assert it.prefetch(2) == 2
    result.append(take(it))
    assert it.prefetch(3) == 3  # one held in the middle, three more
    column.reads = 0
    result += [take(it) for _ in range(4)]
    assert column.reads == 0
    assert result == [v + 1 for v in INTS]


def test_make_a_tuple_out_of_column_and_derived_column():
    """NNC: make a tuple out of column and derived column (a tuple column of
    (derived, x), tuple size 2; the same as an iterator over both columns)."""
    df, _ = derived_frame()
    df = df.map(lambda d, x: (d, x), ("derived", "x"), "tuple")
    rows = [r for r in df.iterator("tuple")]
    assert all(isinstance(r, tuple) and len(r) == 2 for r in rows)
    assert [int(r[0]) for r in rows] == [v + 1 for v in INTS]
    assert [int(r[1]) for r in rows] == INTS
    pairs = [tuple(map(int, r)) for r in df.iterator(("derived", "x"))]
    assert pairs == [(v + 1, v) for v in INTS]


def test_extract_value_out_of_a_tuple():
    """NNC: extract value out of a tuple (item 1 of the tuple (x, derived))."""
    df, _ = derived_frame()
    df = df.map(lambda x, d: (x, d), ("x", "derived"), "tuple")
    df = df.map(lambda t: t[1], "tuple", "extract")
    assert len(df[0]["tuple"]) == 2
    assert [int(v) for v in df.iterator("extract")] == [v + 1 for v in INTS]


def test_iterate_through_derived_column_with_peek():
    """NNC: iterate through derived column with peek (one iterator over the column and
    its derived column; each step shows both)."""
    df, column = derived_frame()
    column.reads = 0
    rows = [tuple(map(int, r)) for r in df.iterator(("x", "derived"))]
    assert [r[0] for r in rows] == INTS
    assert [r[1] for r in rows] == [v + 1 for v in INTS]
    assert column.reads == 8  # one read per row serves both columns


# -- dataframe.addons.tests.c ----------------------------------------------------------


def test_execute_command_from_dataframe():
    """NNC: execute command from dataframe addons API (CMD_EWLOG_FORWARD on a [1] 32F
    tensor of 183 gives log(183) within 1e-6): a map running an fnnc command."""
    df = DataFrame.from_arrays(x=np.array([[183]], np.float32))
    df = df.map(ops.ewlog(), "x", "log")
    out = np.asarray(df[0]["log"])
    assert out.shape == (1,) and out.dtype == np.float32
    assert abs(float(out[0]) - math.log(183)) < 1e-6


QUOTE_CSV = '"head 1","""header"" 2",,\na,b,c\nc,d,e\nd,f,g,h\ne\n'  # NNC's data/quote.csv


def test_read_a_csv_file(tmp_path):
    """NNC: read a csv file (quote.csv without a header row: 4 columns; column 1 is
    '"header" 2', b, d, f, then NULL for the line that has one field)."""
    path = tmp_path / "quote.csv"
    path.write_bytes(QUOTE_CSV.encode())
    df = DataFrame.from_csv(path, delimiter=",", quote='"', header=False)
    assert len(df.columns) == 4
    assert list(df.iterator(df.columns[1])) == ['"header" 2', "b", "d", "f", None]


# Column 1 of NNC's data/scaled_data.csv, as NNC's test lists it.
SCALED_COLUMN_1 = [
    "0.0239389181223648",
    "0.128521802419456",
    "0.157117194502824",
    "0.255931328978371",
    "0.160808946156887",
    "0.129455089453963",
    "0.0944587345381377",
    "0.0619675688122819",
    "0.125194372114953",
    "0.114054752304399",
    "0.0331194635169463",
    "0.0796469310314676",
    "0.0971290536167178",
    "0.0576220663889997",
    "0.134768058679109",
    "0.0655047474218985",
    "0.189655655632105",
    "-0.019471558855501",
    "-0.0161545694780594",
    "0.131137326326646",
    "0.160254357051892",
    "0.0506895539858365",
    "-0.01033458071889",
    "-0.12347980825132",
]


def _scaled_data(path):
    """A file shaped as NNC's scaled_data.csv: 3213 columns, a quoted header ("V0000",
    ..., "time", "id", "label"), 24 rows of unquoted numbers, a quoted last field."""
    names = [f'"V{i:04d}"' for i in range(3210)] + ['"time"', '"id"', '"label"']
    lines = [",".join(names)]
    for r, value in enumerate(SCALED_COLUMN_1):
        fields = [f"{0.001 * (r + 1) * (c + 1):.15g}" for c in range(3210)]
        fields[1] = value
        lines.append(",".join([*fields, str(r), "0", '"110"']))
    path.write_text("\n".join(lines) + "\n")


def test_read_a_larger_csv_file(tmp_path):
    """NNC: read a larger csv file (3213 columns; without a header row, column 1 is
    "V0001" and then the 24 values as written)."""
    path = tmp_path / "scaled_data.csv"
    _scaled_data(path)
    df = DataFrame.from_csv(path, header=False)
    assert len(df.columns) == 3213
    assert list(df.iterator(df.columns[1])) == ["V0001", *SCALED_COLUMN_1]


def test_read_csv_include_header(tmp_path):
    """NNC: read csv include header (3213 columns named by the header: column 0, 1, 2
    are V0000, V0001, V0002; column 1 holds the 24 values)."""
    path = tmp_path / "scaled_data.csv"
    _scaled_data(path)
    df = DataFrame.from_csv(path, header=True)
    assert len(df.columns) == 3213
    assert df.columns[:3] == ("V0000", "V0001", "V0002")
    assert df.columns[-3:] == ("time", "id", "label")
    assert list(df.iterator(df.columns[1])) == SCALED_COLUMN_1
    assert list(df.iterator("label"))[:2] == ["110", "110"]
