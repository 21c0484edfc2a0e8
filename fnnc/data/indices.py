"""Grain ``MapDataset`` nodes for ordering row indices cheaply: rows, shuffle, groups.

A dataframe's Grain pipeline moves row indices (see :mod:`fnnc.data.plan`). Grain's
own nodes handle one index per Python call through several layers, and its
``MapDataset.shuffle`` computes each position with ``index_shuffle``; measured with
Grain 0.2.18 on a 2-core machine, ordering the 32 indices of one batch that way cost
about 2 ms on digits (1797 rows; ``index_shuffle`` alone was 45 us a row there, 10 us
at a million rows), more than reading and stacking the rows. These nodes keep Grain's
contract -- ``len``, epoch-aware indexing (index ``e * len + i`` is position ``i`` of
epoch ``e``), slicing, pickling for worker processes -- and answer a whole group of
indices with a few NumPy operations (``_getitems``, which Grain's nodes call on their
parents):

- :class:`RowIndices`: ``range(rows)``, repeated each epoch.
- :class:`PermutedMapDataset`: a shuffle drawn afresh for each epoch from (seed, epoch)
  with ``rng.permutation`` and kept as a table (4 bytes a row; the last few epochs).
  Above :data:`TABLE_LIMIT` rows :func:`shuffled` uses Grain's ``shuffle`` instead, which
  needs no table.
- :class:`GroupMapDataset`: ``size`` consecutive elements of one epoch as one (the last
  shorter unless ``drop_remainder``, or filled up by ``wrap``), like Grain's ``batch`` of
  indices.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

TABLE_LIMIT = 1 << 26
"""Above this many rows (256 MiB of table per epoch) shuffles use Grain's index_shuffle."""

_KEEP = 3  # epochs of tables kept: readers ahead may cross into the next epoch


class RowIndices(grain.MapDataset):
    """Row indices ``0 .. rows - 1``; index ``e * rows + i`` is row ``i`` again.

    >>> ds = RowIndices(3)
    >>> [ds[i] for i in range(5)], ds._getitems([4, 0]).tolist()
    ([0, 1, 2, 0, 1], [1, 0])
    """

    def __init__(self, rows: int):
        super().__init__()
        self._rows = int(rows)

    def __len__(self) -> int:
        return self._rows

    def __str__(self) -> str:
        return f"RowIndices({self._rows})"

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        return index % self._rows

    def _getitems(self, indices: Sequence[int]) -> np.ndarray:
        return np.asarray(indices, np.int64) % self._rows


class PermutedMapDataset(grain.MapDataset):
    """``parent`` in a random order drawn afresh for each epoch from (seed, epoch).

    >>> ds = PermutedMapDataset(RowIndices(5), seed=7)
    >>> sorted(ds[i] for i in range(5)), sorted(ds[i] for i in range(5, 10))
    ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4])
    >>> [ds[i] for i in range(5)] == list(ds._getitems(range(5)))
    True
    """

    def __init__(self, parent: grain.MapDataset, *, seed: int):
        super().__init__(parent)
        self._seed, self._length = int(seed), len(parent)
        self._tables: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._length

    def __str__(self) -> str:
        return f"PermutedMapDataset(seed={self._seed})"

    def table(self, epoch: int) -> np.ndarray:
        """Epoch ``epoch``'s permutation: position -> parent index within the epoch."""
        with self._lock:
            table = self._tables.get(epoch)
            if table is not None:
                self._tables.move_to_end(epoch)
                return table
        rng = np.random.default_rng(np.random.SeedSequence([self._seed, epoch]))
        table = rng.permutation(self._length).astype(np.int32)
        with self._lock:
            self._tables[epoch] = table
            while len(self._tables) > _KEEP:
                self._tables.popitem(last=False)
        return table

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        epoch, position = divmod(int(index), self._length)
        return self._parent[int(self.table(epoch)[position]) + epoch * self._length]

    def _getitems(self, indices: Sequence[int]) -> Any:
        n = self._length
        if isinstance(indices, range) and indices.step == 1 and len(indices):
            epoch = indices.start // n
            if (indices.stop - 1) // n == epoch:  # a group's run of one epoch: a slice
                base = epoch * n
                out = self.table(epoch)[indices.start - base : indices.stop - base] + base
                parent = self._parent
                return parent._getitems(out if isinstance(parent, RowIndices) else out.tolist())
        epochs, positions = np.divmod(np.asarray(indices, np.int64), self._length)
        first = int(epochs[0]) if epochs.size else 0
        if not epochs.size or (epochs == first).all():  # the usual case: one epoch
            out = self.table(first)[positions] + first * self._length
        else:
            out = np.empty_like(positions)
            for epoch in np.unique(epochs).tolist():
                at = epochs == epoch
                out[at] = self.table(epoch)[positions[at]] + epoch * self._length
        return self._parent._getitems(out.tolist())

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tables"], state["_lock"] = OrderedDict(), None  # workers draw their own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def shuffled(ds: grain.MapDataset, seed: int) -> grain.MapDataset:
    """``ds`` shuffled per epoch from ``seed``: a permutation table, or Grain's
    ``shuffle`` above :data:`TABLE_LIMIT` rows."""
    if len(ds) > TABLE_LIMIT:
        return ds.shuffle(seed=seed)
    return PermutedMapDataset(ds, seed=seed)


class GroupMapDataset(grain.MapDataset):
    """Groups of ``size`` consecutive elements of ``parent`` within each epoch: an
    ``int64`` array of them when ``parent`` holds row indices (``rows=True``), else a
    tuple. With ``wrap`` a short last group repeats its own elements from its start up to
    ``size`` (NNC's combine: element ``k`` is ``members[k % len(members)]``).

    >>> ds = GroupMapDataset(RowIndices(5), 2, drop_remainder=False, rows=True)
    >>> len(ds), [ds[i].tolist() for i in range(4)]
    (3, [[0, 1], [2, 3], [4], [0, 1]])
    >>> GroupMapDataset(RowIndices(5), 3, drop_remainder=False, rows=True, wrap=True)[1].tolist()
    [3, 4, 3]
    """

    def __init__(
        self,
        parent: grain.MapDataset,
        size: int,
        *,
        drop_remainder: bool,
        rows: bool,
        wrap: bool = False,
    ):
        super().__init__(parent)
        self._size, self._rows, self._parent_length = size, rows, len(parent)
        self._wrap = wrap
        n = self._parent_length
        self._length = n // size if drop_remainder else math.ceil(n / size)

    def __len__(self) -> int:
        return self._length

    def __str__(self) -> str:
        return f"GroupMapDataset(size={self._size})"

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        epoch, group = divmod(int(index), self._length)
        start = group * self._size
        stop = min(start + self._size, self._parent_length)
        offset = epoch * self._parent_length
        positions: Sequence[int] = range(start + offset, stop + offset)
        if self._wrap and stop - start < self._size:
            positions = [positions[k % len(positions)] for k in range(self._size)]
        members = self._parent._getitems(positions)
        return np.asarray(members, np.int64) if self._rows else tuple(members)

    def _getitems(self, indices: Sequence[int]) -> list[Any]:
        return [self[int(i)] for i in indices]
