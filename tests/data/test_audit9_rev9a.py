"""Audit 9 (review fixes): per-row and per-element costs of the data pipeline."""

from __future__ import annotations

import weakref

import numpy as np

import fnnc.data.iterator as iterators
from fnnc.data import DataFrame


def test_a_threaded_iterator_registers_once_per_stream(monkeypatch):
    """``_reading.add`` (a new weakref each time) ran on every element of a threaded
    iterator; it belongs where a stream is opened or taken. Oracle: the number of streams
    (one per open: the first read, and the read after ``close``), and the elements."""
    adds: list = []

    class Counting(weakref.WeakSet):
        def add(self, item):
            adds.append(item)
            super().add(item)

    monkeypatch.setattr(iterators, "_reading", Counting())
    it = DataFrame.from_arrays(x=np.arange(12)).iterator("x", threads=1)
    first = [int(next(it)) for _ in range(5)]
    assert it in iterators._reading and len(adds) == 1
    it.close()
    assert it not in iterators._reading
    rest = [int(v) for v in it.take(7)]
    assert len(adds) == 2 and adds == [it, it]
    assert first + rest == list(range(12))
    it.close()


def test_array_rows_are_locked_in_place_and_no_one_elses_array_is(tmp_path, monkeypatch):
    """``ArrayColumn.read`` made a second view of a row view that was already new
    (0.1-0.25 us a row per column) before locking it; now it locks the row view it got.
    The contract stays (oracle: NumPy's flags and ``np.shares_memory``): a 2-D array's
    and a memmap's rows are read-only plain-ndarray views, the sources stay writable, a
    1-D row is a writable copy, and an array held in an object column is never locked."""
    import fnnc.data.sources as sources

    views: list = []
    monkeypatch.setattr(sources, "read_only", lambda v: views.append(v) or v.view(np.ndarray))
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    row = sources.ArrayColumn(a).read(1)
    assert type(row) is np.ndarray and not row.flags.writeable
    assert np.shares_memory(row, a) and row.tolist() == [2.0, 3.0] and a.flags.writeable
    assert views == []  # the new row view itself, not a view of it
    monkeypatch.undo()

    m = np.lib.format.open_memmap(tmp_path / "m.npy", "w+", np.int32, (2, 3))
    m[:] = np.arange(6).reshape(2, 3)
    mrow = sources.ArrayColumn(m).read(1)
    assert type(mrow) is np.ndarray and not mrow.flags.writeable and m.flags.writeable
    assert mrow.tolist() == [3, 4, 5]
    one = sources.ArrayColumn(np.arange(3, dtype=np.int16)).read(2)
    assert one.flags.writeable and int(one) == 2 and one.dtype == np.int16
    inner = np.zeros(2)
    objects = np.empty(1, object)
    objects[0] = inner
    got = sources.ArrayColumn(objects).read(0)
    assert not got.flags.writeable and inner.flags.writeable and np.shares_memory(got, inner)
