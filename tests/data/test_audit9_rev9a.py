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
