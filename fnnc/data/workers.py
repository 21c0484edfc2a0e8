"""Reading with worker processes: chunked streams, kept from one epoch to the next.

:func:`stream` is what a :class:`~fnnc.data.DataIterator` with ``workers=N`` reads:
Grain's ``mp_prefetch`` over the dataframe's elements from a position on, without
end. Two things make it cheap enough to feed training of a small model:

- Small elements travel in chunks. Grain sends every element through its queue with
  the iterator state, and every array through a shared-memory block of its own;
  measured on digits batches (8 KB), that cost the workers 0.85 ms of CPU a batch and
  the consumer 0.15 ms. Elements under :data:`CHUNK_BYTES` go in chunks of up to that
  size (at most :data:`CHUNK_MAX` elements), pickled through the queue: 0.16 and
  0.04 ms a batch.
- The processes are started once per run. Starting them takes about a second, longer
  than an epoch of a small model, and a training loop asks for one epoch at a time
  (:meth:`Model.train <fnnc.models.Model.train>` makes ``df.iterator(epoch=e)`` for
  each). An iterator with workers that has read to its end *parks* its stream here
  (:func:`park`) instead of stopping it, and the next iterator of the same pipeline
  (dataframe steps, columns, seed and reading options) that starts at that position
  takes it over (:func:`take`), already read ahead into the new epoch. Every element
  is a function of its index, so the stream is the one fresh workers would give.

At most :data:`KEEP` streams stay parked (the oldest is closed when another comes);
:func:`release_workers` closes them all, and runs at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Any

import grain

from fnnc.errors import DataError

KEEP = 2
"""Parked streams kept at most (a training and a validation pipeline)."""
CHUNK_BYTES = 1 << 20
"""Elements smaller than this travel in chunks up to this size, pickled; larger arrays
go through shared memory (Grain's ``min_shm_size``)."""
CHUNK_MAX = 16
"""Elements in one chunk at most."""
BUFFER = 2
"""Chunks each worker reads ahead at least (Grain's ``per_worker_buffer_size``; its
default 1 leaves a worker idle until its one chunk is taken)."""

_lock = threading.Lock()
_parked: OrderedDict[Hashable, tuple[int, int, Any, Any]] = OrderedDict()


def stream(
    data: grain.MapDataset, position: int, workers: int, threads: int, prefetch: int
) -> Iterator[Any]:
    """Elements ``position, position + 1, ...`` of ``data`` read by ``workers``
    processes (each with ``threads`` reading threads), ``prefetch`` elements ahead at
    least, small ones in chunks."""
    _allow_worker_flags()
    size = max(_nbytes(data[position]), 1)
    chunk = max(1, min(CHUNK_MAX, CHUNK_BYTES // size))
    ds = data[position : sys.maxsize]
    if chunk > 1:
        ds = ds.batch(chunk, batch_fn=list)
    buffer = threads if threads else 0
    out = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=buffer))
    small = grain.experimental.DatasetOptions(min_shm_size=CHUNK_BYTES)
    options = grain.MultiprocessingOptions(
        num_workers=workers, per_worker_buffer_size=max(-(-prefetch // chunk), BUFFER)
    )
    out = grain.experimental.WithOptionsIterDataset(out, small).mp_prefetch(
        options, worker_init_fn=_yield_to_training
    )
    return _Unchunked(_Explained(iter(out))) if chunk > 1 else _Explained(iter(out))


NICE = 10
"""How much lower the workers' scheduling priority is than the training process's."""


def _yield_to_training(worker: int, workers: int) -> None:
    """Runs first in each worker: a lower priority, so on a machine with fewer cores than
    the workers and the training threads want, reading ahead takes only the CPU time that
    the training step leaves (the step waits for a batch only when none is buffered)."""
    with contextlib.suppress(OSError):  # not permitted here: keep the default priority
        os.nice(NICE)


DIED = "terminated unexpectedly"
"""What Grain's error says when a worker process dies."""


class _Explained(Iterator[Any]):
    """Grain's stream, with a worker that died explained: most often a script without
    ``if __name__ == "__main__":``, whose workers (started by *spawn*, which imports the
    script again) fail to start and print Python's "bootstrapping phase" error."""

    def __init__(self, it: Any):
        self._it = it

    def __next__(self) -> Any:
        try:
            return next(self._it)
        except RuntimeError as e:
            if DIED not in str(e):
                raise
            raise DataError(
                f"a worker process reading the dataframe died ({str(e).splitlines()[0]}); "
                "its own error is printed above. Workers are started with spawn, which "
                "imports your script again in each: put the code that reads with workers "
                'under if __name__ == "__main__":, or read with workers=0'
            ) from e

    def close(self) -> None:
        self._it.close()

    def __getattr__(self, name: str) -> Any:  # get_state and the rest: Grain's own
        return getattr(self._it, name)


class _Unchunked(Iterator[Any]):
    """The elements of a stream of chunks (lists of elements), one by one."""

    def __init__(self, chunks: Any):
        self._chunks, self._pending = chunks, iter(())

    def __next__(self) -> Any:
        for element in self._pending:
            return element
        self._pending = iter(next(self._chunks))
        return next(self._pending)

    def close(self) -> None:
        self._chunks.close()


def _nbytes(element: Any) -> int:
    """The bytes of the arrays in ``element`` (dicts, tuples and lists of them)."""
    if isinstance(element, dict):
        return sum(_nbytes(v) for v in element.values())
    if isinstance(element, (tuple, list)):
        return sum(_nbytes(v) for v in element)
    return int(getattr(element, "nbytes", 0))


def _allow_worker_flags() -> None:
    # Grain 0.2.18 reads the absl flag --grain_enable_multiprocess_worker_profiling
    # when it starts workers under JAX, and absl refuses to read flags before they are
    # parsed (a script that does not use absl.app never parses them): google/grain#1355,
    # fixed upstream by #1362. Marking that one flag present lets its default be read,
    # as Grain itself does for its debug flags; parsed flags are left alone.
    from absl import flags

    name = "grain_enable_multiprocess_worker_profiling"
    if not flags.FLAGS.is_parsed() and name in flags.FLAGS:
        flags.FLAGS[name].present = True


# -- kept between epochs ------------------------------------------------------------
def park(key: Hashable, position: int, opened_at: int, iterator: Any, keep: Any) -> None:
    """Keeps ``iterator`` (opened at ``opened_at``, next element ``position``) for the
    next iterator of pipeline ``key``; ``keep`` is held alive with it (what ``key``
    refers to by ``id``)."""
    with _lock:
        old = _parked.pop(key, None)
        _parked[key] = (position, opened_at, iterator, keep)
        evicted = [old] if old is not None else []
        while len(_parked) > KEEP:
            evicted.append(_parked.popitem(last=False)[1])
    for entry in evicted:
        entry[2].close()


def take(key: Hashable, position: int) -> tuple[int, Any] | None:
    """``(opened_at, iterator)`` parked for pipeline ``key`` at ``position``, or ``None``
    (a parked one at another position is closed: nobody will continue it)."""
    with _lock:
        entry = _parked.pop(key, None)
    if entry is None:
        return None
    if entry[0] != position:
        entry[2].close()
        return None
    return entry[1], entry[2]


def release_workers() -> None:
    """Stops the worker processes of every stream kept for a next epoch."""
    with _lock:
        entries = list(_parked.values())
        _parked.clear()
    for entry in entries:
        entry[2].close()


atexit.register(release_workers)
