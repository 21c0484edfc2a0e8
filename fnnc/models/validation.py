"""Where :meth:`Model.train <fnnc.models.Model.train>` reads its ``validation=`` data.

Validation takes what training takes: ``(inputs, targets)`` arrays, a
:class:`fnnc.data.DataFrame` (unbatched ones are read in batches of ``batch_size``,
in order, nothing dropped; batched ones as they are; columns chosen as for training,
by ``inputs=``/``targets=`` or the last column as the target), a ``grain.MapDataset``
of ``(inputs, targets)`` batches, or a ``grain.IterDataset`` of them (read once per
epoch from its start). Every epoch the model's test-mode outputs over all of it are
gathered with the targets, so the loss and metrics are those of the whole set, the
same numbers whichever form the data came in (bitwise, for the same batches). Every
epoch reads the set's epoch 0 (the same rows, random maps included); so worker
processes of a validation dataframe (``read_with(workers=...)``) start anew each
epoch: give them to the training dataframe, where they are kept from epoch to epoch.

>>> import numpy as np
>>> from fnnc.data import DataFrame
>>> from fnnc.models.validation import validation_batches
>>> x, y = np.ones((5, 2), np.float32), np.arange(5)
>>> read = validation_batches(DataFrame.from_arrays(x=x, y=y), batch_size=2)
>>> [(xb[0].shape, yb[0].tolist()) for xb, yb in read()]
[((2, 2), [0, 1]), ((2, 2), [2, 3]), ((1, 2), [4])]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from fnnc.errors import DataError, ModelError
from fnnc.models import batches as feed
from fnnc.models import processes, sample_sets

Read = Callable[[], Iterator[feed.Batch]]


def validation_batches(
    validation: Any,
    *,
    batch_size: int = 256,
    inputs: Any = None,
    targets: Any = None,
    where: str = "train validation",
) -> Read:
    """A function giving, each time it is called, the ``(inputs, targets)`` batches of
    ``validation`` (see the module docstring); ``inputs``/``targets`` name a
    dataframe's columns; ``where`` begins its data errors (``Model.score`` passes
    ``"score"``)."""
    import grain

    from fnnc.data import DataFrame
    from fnnc.data.stages import Group

    if isinstance(validation, DataFrame):
        frame = validation
        if not any(isinstance(s, Group) for s in frame._stages):
            frame = frame.batch(batch_size)  # in order, the last batch kept
        try:
            source = feed.FrameBatches(frame, batch_size, 0, inputs, targets)
        except ModelError as e:
            raise ModelError(_where(e, where)) from None
        return lambda: _renamed(source.epoch(0, 0, None), where)
    if isinstance(validation, grain.MapDataset):
        grain_source = feed.GrainBatches(validation)
        return lambda: _renamed(grain_source.epoch(0, 0, None), where)
    if isinstance(validation, grain.IterDataset):
        return lambda: (_pair(e, k, where) for k, e in enumerate(validation))
    xs, ts = sample_sets.split(validation, where)
    n = len(xs[0])

    def arrays() -> Iterator[feed.Batch]:
        for start in range(0, n, batch_size):
            end = start + batch_size
            yield [x[start:end] for x in xs], [t[start:end] for t in ts]

    return arrays


def outputs_and_targets(
    model: Any, read: Read, where: str = "train validation"
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The model's test-mode outputs over every batch of ``read()``, and the targets,
    each concatenated over batches (one array per output / target); ``where`` begins
    the error of a set with no batches. With several processes (a data-parallel
    model), each reads its own share of the set and gets the outputs and targets of
    every process's rows (:mod:`fnnc.models.processes`): the metrics are those of the
    whole set, the same on every process; every process must give as many batches of
    as many rows."""
    outs: list[list[np.ndarray]] = []
    targets: list[list[np.ndarray]] = []
    multiple = sample_sets.row_multiple(model)
    procs = processes.spanned(model)
    batches = iter(read())
    while True:
        batch = next(batches, None)
        if procs > 1:  # before any collective: a process out of batches would hang them
            _agree(batch, len(outs), where)
        if batch is None:
            break
        inputs_b, targets_b = batch
        outs.append(
            sample_sets.evaluate_rows(model, sample_sets.as_list(inputs_b), multiple, where)
        )
        ts = [np.asarray(t) for t in targets_b]
        targets.append([processes.gathered_rows(t) for t in ts] if procs > 1 else ts)
    if not outs:
        raise ModelError(f"{where}: the data gave no batches; pass a non-empty set")
    return _gathered(outs, "output", where), _gathered(targets, "target", where)


def _gathered(per_batch: list[list[np.ndarray]], what: str, where: str) -> list[np.ndarray]:
    """Each ``what`` (output or target) concatenated over the batches; a
    :class:`ModelError` naming the batches whose shapes past the rows differ (sequences
    padded per batch), where NumPy's concatenate raised a bare ValueError."""
    gathered = []
    for i, arrays in enumerate(zip(*per_batch)):
        first = np.shape(arrays[0])[1:]
        for k, a in enumerate(arrays):
            if np.shape(a)[1:] != first:
                raise ModelError(
                    f"{where}: {what} {i} is {_typed(arrays[0])} in batch 0 but "
                    f"{_typed(a)} in batch {k}; the metrics see each {what} of the whole "
                    "set as one array, so its batches must share every axis but the "
                    "first: pad every batch to one length (the set's longest), or "
                    "measure each batch apart with model.score(batch)"
                )
        gathered.append(np.concatenate(arrays))
    return gathered


def _typed(a: np.ndarray) -> str:
    return f"{np.dtype(a.dtype).name}{list(np.shape(a))}"


def _agree(batch: feed.Batch | None, k: int, where: str) -> None:
    """Checks that every process has a batch ``k`` (``None``: this one's set ended)
    of as many rows as this one's."""
    rows = -1 if batch is None else len(sample_sets.as_list(batch[0])[0])
    processes.agree(
        [rows], where, f"the rows of batch {k} of the set",
        "every process must give as many batches of as many rows (its share of the set: "
        "DataFrame.shard() or equal slices of the arrays)",
        show=lambda n: "none (its set ended)" if n < 0 else f"{n} rows",
    )  # fmt: skip


def _renamed(batches: Iterator[feed.Batch], where: str) -> Iterator[feed.Batch]:
    """``batches``, with a data error saying it came from this set (``where``), not
    from the training data."""
    try:
        yield from batches
    except DataError as e:
        raise DataError(_where(e, where)) from e
    except ModelError as e:
        raise ModelError(_where(e, where)) from e


def _where(error: Exception, where: str) -> str:
    """``error``'s message (worded for the training data) said of ``where``'s set."""
    return f"{where}: {str(error).removeprefix('train: ')}"


def _pair(element: Any, k: int, where: str) -> feed.Batch:
    try:
        inputs, targets = element
    except (TypeError, ValueError):
        raise ModelError(
            f"{where}: element {k} of the Grain dataset is a {type(element).__name__}; "
            "expected (inputs, targets) batches (map the dataset to that pair)"
        ) from None
    return sample_sets.as_list(inputs), sample_sets.targets_list(targets)
