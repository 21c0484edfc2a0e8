"""Moving values on and off a data-parallel model's mesh: :class:`ValuesMixin` gives
:class:`~fnnc.models.parallel.Parallel` ``batch`` (this process's rows into a global
array split over the data axis, with the checks and errors of a batch that does not
split) and ``gather`` (any sharded array back to a full one); :func:`place` and
:class:`Placed` lay a program's arguments out as its inputs' shardings before a call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from fnnc.errors import ShapeError
from fnnc.models import processes


class ValuesMixin:
    """:class:`~fnnc.models.parallel.Parallel`'s ``batch`` and ``gather`` (module doc)."""

    axis: str
    size: int
    sharding: Any
    _seen_rows: set

    def batch(
        self, arrays: Sequence[Any], where: str, names: str = "input", lenient: bool = False,
        rows_of_inputs: int | None = None,
    ) -> list[Any]:  # fmt: skip
        """Global batch arrays from this process's ``arrays`` (split over the mesh);
        ``lenient`` (``evaluate``) replicates a batch that does not divide in one process,
        and with several checks the processes' rows at every call (``fit``: the first
        time this process sees its row counts, so that a step waits on no collective).
        ``rows_of_inputs``: this process's input rows, for the error of a target that
        does not divide because it has another number of rows."""
        procs = jax.process_count()
        if procs > 1:
            self._check_rows(arrays, where, names, every_call=lenient)
        out = []
        for i, a in enumerate(arrays):
            if isinstance(a, jax.Array) and not a.is_fully_addressable:
                out.append(a)
                continue
            a = np.asarray(a)
            rows = a.shape[0] * procs if a.ndim else 0
            if (not a.ndim or rows % self.size) and lenient and procs == 1:
                out.append(a)
                continue
            if not a.ndim:
                raise ShapeError(
                    f"{where}: {names} {i} is a scalar {a.dtype.name}, with no batch axis to "
                    f"split over the {self.size} devices of mesh axis {self.axis!r}; give "
                    "it rows (a leading batch axis, e.g. np.full((batch, 1), value)), or "
                    "pass it to the model as a constant or parameter instead of as an input"
                )
            if rows % self.size and rows_of_inputs not in (None, a.shape[0]):
                raise ShapeError(
                    f"{where}: {names} {i} has {a.shape[0]} rows but the inputs have "
                    f"{rows_of_inputs}; give as many {names} rows as input rows (one per "
                    "sample: the loss compares them row by row)"
                )
            if rows % self.size:
                raise ShapeError(self._indivisible(where, f"{names} {i}", a, rows))
            sharding = self.sharding(PartitionSpec(self.axis))
            if procs == 1:
                out.append(jax.device_put(a, sharding))
            else:
                out.append(
                    jax.make_array_from_process_local_data(sharding, a, (rows, *a.shape[1:]))
                )
        return out

    def _check_rows(self, arrays: Sequence[Any], where: str, names: str, every_call: bool) -> None:
        """The global batch is each process's rows times the process count: checks
        (one all-gather; unless ``every_call``, only the first time this process sees
        these row counts) that every process passes as many rows, where a mismatch
        would abort or hang a collective. (Once per row counts leaves a gap: a process
        that saw its counts before does not check while another's are new, as when only
        one process's data has a short last batch; ``train`` checks that every process
        has as many batches, and evenly split data, ``DataFrame.shard()``, has the
        same batch sizes on every process.)"""
        rows = tuple(
            0 if isinstance(a, jax.Array) and not a.is_fully_addressable else int(np.shape(a)[0])
            for a in arrays
            if np.ndim(a)
        )
        if rows in self._seen_rows and not every_call:
            return
        processes.agree(
            rows, where, f"the rows of each {names}",
            "every process must pass as many rows (its slice of the global batch; "
            "DataFrame.shard() gives equal shares)",
        )  # fmt: skip
        self._seen_rows.add(rows)

    def _indivisible(self, where: str, what: str, a: np.ndarray, rows: int) -> str:
        """The error for a batch of ``rows`` rows (``a``: this process's) that does
        not divide over the mesh, saying what to change."""
        procs = jax.process_count()
        head = (
            f"{where}: {what} has a batch of {rows} rows, which does not divide over the "
            f"{self.size} devices of mesh axis {self.axis!r}"
        )
        if procs == 1:
            return (
                f"{head}; use a batch size that is a multiple of {self.size}, or "
                f"set_data_parallel(n) with n dividing {rows}"
            )
        local, each = a.shape[0] if a.ndim else 0, max(self.size // procs, 1)
        return (
            f"{head} ({local} rows in each of {procs} processes, {each} devices each); "
            f"give each process a batch that is a multiple of {each} (a global batch that "
            f"is a multiple of {self.size})"
        )

    def gather(self, value: Any) -> Any:
        """A full array on one device from any (sharded, multi-process) array."""
        if not isinstance(value, jax.Array):
            return jax.numpy.array(value, copy=True)
        if value.is_fully_addressable or value.is_fully_replicated:
            # a copy: np.asarray of a replicated CPU array, then device_put, can both be
            # zero-copy, and the caller's array would pin a buffer the next step donates
            host = np.array(value, copy=True)
        else:
            from jax.experimental import multihost_utils

            host = np.asarray(multihost_utils.process_allgather(value, tiled=True))
        return jax.device_put(host, jax.local_devices()[0])


def place(value: Any, sharding: NamedSharding) -> Any:
    """``value`` laid out as ``sharding`` (itself when it already is)."""
    if isinstance(value, jax.Array) and value.sharding == sharding:
        return value
    if sharding.is_fully_addressable:
        return jax.device_put(value, sharding)
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        return jax.device_put(value, sharding)  # global -> global: a reshard
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


class Placed:
    """A compiled program whose arguments are moved to its input layouts first."""

    def __init__(self, program: Any):
        self.program = program
        plan = program.shardings
        self.targets = plan.named(plan.inputs)

    def __call__(self, *args: Any) -> Any:
        return self.program(*[place(a, s) for a, s in zip(args, self.targets)])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.program, name)
