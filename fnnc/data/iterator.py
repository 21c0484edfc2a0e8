"""DataIterator: a dataframe's rows through Grain, with a position a checkpoint can keep.

The iterator reads the dataframe's Grain ``MapDataset`` (one epoch, see
:mod:`fnnc.data.plan`) as an endless, epoch-by-epoch stream: ``.repeat()`` and a slice
from ``epoch * len`` give Grain's epoch-aware indexing, where epoch ``e``'s shuffles are
seeded from (seed, e) and batches never straddle two epochs. How it is read:

- nothing reading ahead (no threads, workers or prefetch): by index in the consuming
  thread (Grain's iterator machinery costs about 80 us an element, for nothing when
  nobody reads ahead);
- threads: the slice goes to ``to_iter_dataset(grain.ReadOptions(...))``, or with no
  threads but a prefetch to ``grain.experimental.ThreadPrefetchIterDataset`` (one
  thread reading ahead);
- workers: Grain's ``mp_prefetch`` processes, reading small elements in chunks, and
  handed on from an epoch's iterator to the next epoch's (:mod:`fnnc.data.workers`).

The stream is the same for any number of threads or workers.

State: ``get_state()`` is ``{"position": ..., "grain": ...}`` plus what the position
means (seed, end, the dataframe's signature). ``"grain"`` is Grain's own iterator state
of a threaded iterator; ``set_state`` hands it back to Grain when it lands on
``"position"``, and otherwise restarts at ``"position"`` (both land on the same element,
since every element is a function of its index; the position is the truth).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import itertools
import sys
import weakref
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import grain

from fnnc.data import workers as parking
from fnnc.data.errors import DataError, as_int, integer

_FORMAT = "fnnc.data.DataIterator/1"
_FILE_THREADS = 4
"""Default reading threads when a column reads files (memory maps, tensor files,
functions); in-memory columns default to 0, as Grain advises: threads would only
contend for the GIL (measured: 2 threads read digits batches about half as fast)."""


_reading: weakref.WeakSet[DataIterator] = weakref.WeakSet()
"""Iterators with Grain threads or worker processes open, closed at exit."""


@atexit.register
def _close_at_exit() -> None:
    """Closes the iterators a script left open. Grain's own finalizers, run later while
    the interpreter tears its modules down, print a traceback for each reading thread
    ('NoneType' object has no attribute 'Empty'). Runs before :func:`release_workers`
    (registered earlier), which then stops the streams parked here."""
    for iterator in list(_reading):
        with contextlib.suppress(Exception):
            iterator.close()


def _count(value: Any, what: str, low: int) -> int:
    return integer(value, "iterator", low, what)


def _check_state(state: Any) -> None:
    """A :class:`DataError` saying what is wrong with ``state`` unless it has
    :meth:`DataIterator.get_state`'s keys with integer seed, position and stop."""
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise DataError(f"set_state: not a DataIterator state (no format {_FORMAT!r})")
    keys = ("signature", "seed", "position", "stop")
    missing = [k for k in keys if k not in state]
    if missing:
        raise DataError(
            f"set_state: the state lacks {missing}; pass the dict get_state() returned "
            f"whole (keys {['format', *keys, 'grain']})"
        )
    for key, none_ok in (("seed", False), ("position", False), ("stop", True)):
        value = state[key]
        number = as_int(value)
        if not (value is None and none_ok) and (number is None or number < 0):
            need = "an integer >= 0" + (" or None" if none_ok else "")
            raise DataError(f"set_state: {key!r} must be {need}, got {value!r}")


class DataIterator(Iterator[Any]):
    """Rows of a :class:`~fnnc.data.DataFrame`, read ahead by Grain; made by
    :meth:`DataFrame.iterator`.

    >>> import json
    >>> import numpy as np
    >>> from fnnc.data import DataFrame
    >>> df = DataFrame.from_arrays(x=np.arange(8)).shuffle().batch(2)
    >>> it = df.iterator("x", seed=1)
    >>> first = next(it)
    >>> saved = json.dumps(it.get_state())
    >>> rest = [b.tolist() for b in it]
    >>> again = df.iterator("x")
    >>> again.set_state(json.loads(saved))
    >>> [b.tolist() for b in again] == rest, len(rest)
    (True, 3)
    """

    def __init__(
        self,
        *,
        build: Callable[[int], grain.MapDataset],
        signature: str,
        seed: int,
        epoch: int = 0,
        epochs: int | None = 1,
        workers: int = 0,
        threads: int | None = None,
        prefetch: int | None = None,
        in_memory: bool = False,
        pipeline: Hashable | None = None,
        boxed: bool = False,
    ):
        self._build, self._signature, self._boxed = build, signature, boxed
        self._workers = _count(workers, "workers", 0)
        if threads is None:
            threads = 0 if in_memory else _FILE_THREADS
        self._threads = _count(threads, "threads", 0)
        self._prefetch = 2 * self._threads if prefetch is None else _count(prefetch, "prefetch", 0)
        epoch = _count(epoch, "epoch", 0)
        if epochs is not None:
            epochs = _count(epochs, "epochs", 1)
        self._seed = seed
        self._epoch_data = build(seed)
        self.batches_per_epoch = len(self._epoch_data)
        """Elements per epoch (batches after ``batch``, else rows)."""
        self._position = epoch * self.batches_per_epoch
        self._stop = None if epochs is None else (epoch + epochs) * self.batches_per_epoch
        self._iter: Any = None
        self._buffer: collections.deque[Any] = collections.deque()
        self._opened_at = -1
        self._pipeline = None
        if pipeline is not None and self._workers:
            try:
                hash(pipeline)
                self._pipeline = pipeline
            except TypeError:  # a map with an unhashable function: never parked
                pass

    # -- where it is ---------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch the next element comes from."""
        return self._position // max(self.batches_per_epoch, 1)

    @property
    def step(self) -> int:
        """The next element's index within its epoch."""
        return self._position % max(self.batches_per_epoch, 1)

    @property
    def _key(self) -> Hashable | None:
        """What a parked stream of this iterator is kept under: the pipeline, the seed
        as of now (``set_state`` may change it) and the reading options."""
        if self._pipeline is None:
            return None
        return (self._pipeline, self._seed, self._workers, self._threads, self._prefetch)

    # -- reading -------------------------------------------------------------------
    def _open(self, reuse: bool = True) -> Iterator[Any]:
        if self._iter is not None:
            return self._iter
        if reuse and self._key is not None:
            taken = parking.take(self._key, self._position)
            if taken is not None:
                self._opened_at, self._iter = taken
        if self._iter is None:
            data, at = self._epoch_data.repeat(), self._position
            stop = sys.maxsize if self._stop is None else self._stop
            if self._workers:  # unbounded: the processes may go on into the next epoch
                self._iter = parking.stream(data, at, self._workers, self._threads, self._prefetch)
            elif not (self._threads or self._prefetch):
                self._iter = _Indexed(data, at, stop)
            else:
                buffer = max(self._prefetch, self._threads) if self._threads else 0
                read = grain.ReadOptions(num_threads=self._threads, prefetch_buffer_size=buffer)
                out = data[at:stop].to_iter_dataset(read)
                if not self._threads:
                    out = grain.experimental.ThreadPrefetchIterDataset(
                        out, prefetch_buffer_size=self._prefetch
                    )
                self._iter = iter(out)
            self._opened_at = at
        if not isinstance(self._iter, _Indexed):  # once per stream opened or taken
            _reading.add(self)
        return self._iter

    def __next__(self) -> Any:
        if self.batches_per_epoch == 0 or (self._stop is not None and self._position >= self._stop):
            self.close()
            raise StopIteration
        element = self._buffer.popleft() if self._buffer else next(self._open())
        self._position += 1
        return element[0] if self._boxed else element

    def prefetch(self, n: int = 1) -> int:
        """Reads the next ``n`` elements now into a buffer that the following ``next``
        calls take from (NNC's ``ccv_cnnp_dataframe_iter_prefetch``).

        Prefetches add up: three ``prefetch(1)`` hold three elements, and ``next`` reads
        nothing until they are used. Returns how many elements it read: ``n``, fewer
        when the iterator's end comes first (0 at the end, where NNC returns -1). The
        background read-ahead (``threads``, ``prefetch=``, ``workers``) is unchanged and
        this fills the buffer from it: rows are read only when asked for, as NNC's tests
        count them, with ``threads=0`` and ``prefetch=0`` (the default for in-memory
        columns, not for ``from_function``); reading threads read further ahead.
        :meth:`get_state` counts only elements taken with ``next``: buffered ones are
        read again after a restore.

        >>> import numpy as np
        >>> from fnnc.data import DataFrame
        >>> it = DataFrame.from_arrays(x=np.arange(5)).iterator("x")
        >>> it.prefetch(3), it.prefetch(3), it.prefetch(1), [int(v) for v in it]
        (3, 2, 0, [0, 1, 2, 3, 4])
        """
        n = _count(n, "prefetch n", 0)
        if self.batches_per_epoch == 0:
            return 0
        ahead = self._position + len(self._buffer)
        if self._stop is not None:
            n = min(n, max(self._stop - ahead, 0))
        source = self._open() if n else None
        for read in range(n):
            try:
                self._buffer.append(next(source))  # type: ignore[call-overload]
            except StopIteration:
                return read
        return n

    def __iter__(self) -> DataIterator:
        return self

    def take(self, n: int) -> list[Any]:
        """The next ``n`` elements (fewer at the end)."""
        return list(itertools.islice(self, _count(n, "take n", 0)))

    def close(self) -> None:
        """Stops Grain's threads and worker processes; the position is kept, and reading
        again restarts them there. Worker processes of an iterator that read to its end
        are kept for the next epoch's iterator instead (:mod:`fnnc.data.workers`)."""
        self._buffer.clear()  # reopening restarts at the position, before them
        _reading.discard(self)
        if self._iter is None:
            return
        if self._key is not None and self._position == self._stop:
            parking.park(self._key, self._position, self._opened_at, self._iter, self._build)
        else:
            self._iter.close()
        self._iter = None

    def __enter__(self) -> DataIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- checkpoints ---------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """Where the iterator is, as a JSON-able dict (store it with the checkpoint)."""
        grain_state = None
        # Grain's state is past the buffered elements; the position is the truth then.
        if self._iter is not None and not self._buffer and hasattr(self._iter, "get_state"):
            grain_state = {
                "opened_at": self._opened_at,
                "workers": self._workers,
                "state": self._iter.get_state(),
            }
        return {
            "format": _FORMAT,
            "signature": self._signature,
            "seed": self._seed,
            "position": self._position,
            "stop": self._stop,
            "grain": grain_state,
        }

    def snapshot(self) -> Callable[[], dict[str, Any]]:
        """:meth:`get_state` as of now, to call later: cheap now where the position says
        everything (in the calling thread, or worker processes, which restart from
        it), taken whole now where Grain's reading threads hold a buffer. A training
        loop that reads the next batch while a step runs keeps the position of the
        step's own batch this way."""
        if (self._threads or self._prefetch) and not self._workers and not self._buffer:
            state = self.get_state()
            return lambda: state
        position = self._position

        def state() -> dict[str, Any]:
            return {**self.get_state(), "position": position, "grain": None}

        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from ``state`` (from :meth:`get_state` of an iterator of the same
        dataframe): the next elements are the ones that iterator would have given next.
        The state's seed and end of iteration replace this iterator's; its worker, thread
        and prefetch settings stay. Worker processes kept from an earlier epoch are taken
        over, and this iterator's kept for the next, under the state's seed."""
        _check_state(state)
        if state["signature"] != self._signature:
            raise DataError(
                "set_state: the state is from a different dataframe:\n"
                f"  saved: {state['signature']}\n  this:  {self._signature}"
            )
        self.close()
        seed = as_int(state["seed"])  # a Python int: get_state stays JSON-able
        if seed != self._seed:
            self._seed, self._epoch_data = seed, self._build(seed)
        self._position, self._stop = as_int(state["position"]), as_int(state["stop"])
        saved = _grain_state(state.get("grain"), self._position)
        if saved is not None and (self._threads or self._prefetch) and not self._workers:
            self._position = saved[0]
            self._open(reuse=False).set_state(saved[1])  # type: ignore[attr-defined]
            self._position = as_int(state["position"])


def _grain_state(saved: Any, position: int) -> tuple[int, dict[str, Any]] | None:
    """``(opened_at, Grain's state)`` of a threaded iterator's saved ``"grain"`` part when
    it lands on ``position`` (Grain's ``next_index`` counts from ``opened_at``), else
    ``None``: the position is the truth, and a part that disagrees with it (a state
    whose position was edited, a damaged one) would continue somewhere else."""
    if not isinstance(saved, dict) or saved.get("workers") != 0:
        return None
    opened, inner = as_int(saved.get("opened_at")), saved.get("state")
    if opened is None or opened < 0 or not isinstance(inner, dict):
        return None
    if as_int(inner.get("next_index")) != position - opened:
        return None
    return opened, inner


class _Indexed(Iterator[Any]):
    """Elements ``start, start + 1, ...`` (before ``stop``) of a ``MapDataset``, read by
    index in the calling thread; its position is the state."""

    def __init__(self, dataset: grain.MapDataset, start: int, stop: int):
        self._dataset, self._next, self._stop = dataset, start, stop

    def __next__(self) -> Any:
        if self._next >= self._stop:
            raise StopIteration
        element = self._dataset[self._next]
        self._next += 1
        return element

    def close(self) -> None:
        """Nothing runs in the background."""
