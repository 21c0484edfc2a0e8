"""DataIterator: a dataframe's rows through Grain, with a position a checkpoint can keep.

The iterator reads the dataframe's Grain ``MapDataset`` (one epoch, see
:mod:`fnnc.data.plan`) as an endless, epoch-by-epoch stream: ``.repeat()`` and a slice
from ``epoch * len`` give Grain's epoch-aware indexing, where epoch ``e``'s shuffles are
seeded from (seed, e) and batches never straddle two epochs. The slice goes to
``to_iter_dataset(grain.ReadOptions(...))`` (threads reading ahead), or with no threads
but a prefetch to ``grain.experimental.ThreadPrefetchIterDataset`` (one thread reading
ahead), and with workers to ``mp_prefetch(grain.MultiprocessingOptions(...))``
(processes, each reading every ``workers``-th element, interleaved back in order), so
the stream is the same for any number of threads or workers.

State: ``get_state()`` is ``{"position": ..., "grain": ...}`` plus what the position
means (seed, end, the dataframe's signature). ``"grain"`` is Grain's own iterator state;
``set_state`` hands it back to Grain when the worker count and slice are the same, and
otherwise restarts Grain's slice at ``"position"`` (both land on the same element,
since every element is a function of its index).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import grain

from fnnc.data.errors import DataError

_FORMAT = "fnnc.data.DataIterator/1"
_FILE_THREADS = 4
"""Default reading threads when a column reads files (memory maps, tensor files,
functions); in-memory columns default to 0, as Grain advises: threads would only
contend for the GIL (measured: 2 threads read digits batches about half as fast)."""


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


def _count(value: Any, what: str, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise DataError(f"iterator: {what} must be an integer >= {low}, got {value!r}")
    return value


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
    ):
        self._build, self._signature = build, signature
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
        self._opened_at = -1

    # -- where it is ---------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch the next element comes from."""
        return self._position // max(self.batches_per_epoch, 1)

    @property
    def step(self) -> int:
        """The next element's index within its epoch."""
        return self._position % max(self.batches_per_epoch, 1)

    # -- reading -------------------------------------------------------------------
    def _open(self) -> Iterator[Any]:
        if self._iter is None:
            stop = sys.maxsize if self._stop is None else self._stop
            ds = self._epoch_data.repeat()[self._position : stop]
            buffer = max(self._prefetch, self._threads) if self._threads else 0
            read = grain.ReadOptions(num_threads=self._threads, prefetch_buffer_size=buffer)
            out = ds.to_iter_dataset(read)
            if not self._threads and self._prefetch and not self._workers:
                out = grain.experimental.ThreadPrefetchIterDataset(
                    out, prefetch_buffer_size=self._prefetch
                )
            if self._workers:
                _allow_worker_flags()
                options = grain.MultiprocessingOptions(
                    num_workers=self._workers, per_worker_buffer_size=max(self._prefetch, 1)
                )
                out = out.mp_prefetch(options)
            self._iter, self._opened_at = iter(out), self._position
        return self._iter

    def __next__(self) -> Any:
        if self.batches_per_epoch == 0 or (self._stop is not None and self._position >= self._stop):
            self.close()
            raise StopIteration
        element = next(self._open())
        self._position += 1
        return element

    def __iter__(self) -> DataIterator:
        return self

    def take(self, n: int) -> list[Any]:
        """The next ``n`` elements (fewer at the end)."""
        return list(itertools.islice(self, n))

    def close(self) -> None:
        """Stops Grain's threads and worker processes; the position is kept, and reading
        again restarts them there."""
        if self._iter is not None:
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
        if self._iter is not None:
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

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from ``state`` (from :meth:`get_state` of an iterator of the same
        dataframe): the next elements are the ones that iterator would have given next.
        The state's seed and end of iteration replace this iterator's; its worker, thread
        and prefetch settings stay."""
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise DataError(f"set_state: not a DataIterator state (no format {_FORMAT!r})")
        if state["signature"] != self._signature:
            raise DataError(
                "set_state: the state is from a different dataframe:\n"
                f"  saved: {state['signature']}\n  this:  {self._signature}"
            )
        self.close()
        if state["seed"] != self._seed:
            self._seed, self._epoch_data = state["seed"], self._build(state["seed"])
        self._position, self._stop = int(state["position"]), state["stop"]
        saved = state.get("grain")
        if saved and saved["workers"] == self._workers and saved["opened_at"] >= 0:
            self._position = saved["opened_at"]
            self._open().set_state(saved["state"])  # type: ignore[attr-defined]
            self._position = int(state["position"])
