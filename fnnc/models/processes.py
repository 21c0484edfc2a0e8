"""How the rows of several processes make one set (``jax.distributed`` runs).

A data-parallel model whose mesh spans processes takes each process's own rows and
assembles the global batch from them in process order: all of process 0's rows, then
process 1's, and so on (``jax.make_array_from_process_local_data``). ``evaluate``
returns the gathered outputs in that order, ``predict`` every process's rows in it
(process 0's over all its batches first), and ``score`` / ``train(validation=...)``
measure the union of every process's rows, so each process gets the same numbers.

Every process must give as many rows per batch and as many batches: one that gave
fewer would leave the others waiting in a collective forever. :func:`agree` checks it
(one small all-gather) and raises the same :class:`~fnnc.errors.ShapeError`, naming
each process's count, on every process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from fnnc.errors import ShapeError


def spanned(model: Any) -> int:
    """The processes whose rows ``model``'s programs combine: ``jax.process_count()``
    for a data-parallel model (its mesh spans every process), else 1."""
    return jax.process_count() if model.engine.parallel is not None else 1


def agree(
    counts: Sequence[int],
    where: str,
    what: str,
    fix: str,
    show: Callable[[int], str] = str,
) -> None:
    """Raises a :class:`ShapeError` on every process unless all processes passed the
    same ``counts`` (``what`` they count; ``show`` prints one); ``fix`` says what to do.
    A collective: every process must call it."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    mine = np.asarray(counts, np.int64)
    every = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, len(mine))
    if (every == every[0]).all():
        return
    each = "; ".join(
        f"process {p}: {', '.join(show(int(c)) for c in row)}" for p, row in enumerate(every)
    )
    raise ShapeError(f"{where}: the processes disagree on {what} ({each}); {fix}")


def gathered_rows(array: Any) -> np.ndarray:
    """Every process's rows of ``array`` (this process's), in process order. A
    collective; the processes must give as many rows (see :func:`agree`)."""
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(np.asarray(array), tiled=True))


def per_process(outs: np.ndarray, rows: int, kept: int, procs: int) -> np.ndarray:
    """Of ``outs``, the gathered per-row outputs of ``procs`` processes giving ``rows``
    rows each, the first ``kept`` rows of every process, still in process order (the
    others were padding). Outputs that are not per-row come back as they are."""
    if not outs.ndim or len(outs) != rows * procs or kept == rows:
        return outs
    blocks = outs.reshape(procs, rows, *outs.shape[1:])[:, :kept]
    return blocks.reshape(procs * kept, *outs.shape[1:])


def in_process_order(chunks: Sequence[np.ndarray], rows: Sequence[int], procs: int) -> np.ndarray:
    """The outputs of consecutive batches (``chunks``, each gathered over ``procs``
    processes of ``rows[k]`` rows each) as all of process 0's rows, then process 1's...
    A chunk that is not per-row leaves the chunks concatenated as they are."""
    if procs == 1 or any(not c.ndim or len(c) != r * procs for c, r in zip(chunks, rows)):
        return np.concatenate(chunks)
    parts = [c.reshape(procs, r, *c.shape[1:]) for c, r in zip(chunks, rows)]
    return np.concatenate([parts[k][p] for p in range(procs) for k in range(len(parts))])
