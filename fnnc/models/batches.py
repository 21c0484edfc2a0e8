"""Where training batches come from, and where a run is: the model's training progress.

:func:`batches` turns what :meth:`Model.train <fnnc.models.Model.train>` was given into
a :class:`Batches` source: in-memory arrays, a :class:`fnnc.data.DataFrame`, or a
``grain.MapDataset`` of ``(inputs, targets)`` batches. Every source reads epoch ``e``
in an order drawn from ``(seed, e)`` alone, so a run continues one sequence however it
is split into calls, and it can start an epoch at any batch (a resumed checkpoint).

:class:`Progress` is what the model remembers between calls: the epoch in progress,
the batches of it done, the steps done, the shuffling seed and the data position. A
checkpoint of a model stores it (JSON, in the metadata) and restoring sets it back.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from fnnc.errors import DataError, ModelError
from fnnc.models.sample_sets import as_list, check_batch_size, split, targets_list

Batch = tuple[list[Any], list[Any]]


@dataclasses.dataclass
class Progress:
    """Where a model's training is (kept on the model as ``model.train_progress``).

    Attributes:
        epoch: the epoch in progress (the epochs completed, when ``batch`` is 0).
        batch: batches of ``epoch`` done.
        step: training steps done over every call.
        seed: the shuffling seed (epoch ``e`` is shuffled from ``(seed, e)``).
        data: the data position inside the epoch: JSON, or a function returning it.
        batch_size: the samples per batch of ``batch``, where ``train`` batches the
            data (arrays, unbatched dataframes); ``None`` where the source does (Grain,
            batched dataframes) or in a checkpoint saved before it was recorded.
        loss_sum, loss_count, loss_rows: the sum (in order, float64) of the training
            losses of ``epoch`` so far, each times its batch's rows, their number and
            the rows, so that the epoch's loss is the mean over its rows (a short last
            batch weighs its rows, as Keras's), and an epoch resumed from a checkpoint
            reports it over all its batches, as the uninterrupted run does.
    """

    epoch: int = 0
    batch: int = 0
    step: int = 0
    seed: int = 0
    data: Any = None
    batch_size: int | None = None
    loss_sum: float = 0.0
    loss_count: int = 0
    loss_rows: int = 0

    def to_json(self) -> dict[str, Any]:
        data = self.data() if callable(self.data) else self.data
        return {"epoch": self.epoch, "batch": self.batch, "step": self.step, "seed": self.seed,
                "data": data, "batch_size": self.batch_size, "loss_sum": _finite(self.loss_sum),
                "loss_count": self.loss_count, "loss_rows": self.loss_rows}  # fmt: skip

    def load(self, saved: dict[str, Any]) -> None:
        self.epoch, self.batch = int(saved["epoch"]), int(saved["batch"])
        self.step, self.seed, self.data = int(saved["step"]), int(saved["seed"]), saved["data"]
        size = saved.get("batch_size")  # absent in checkpoints of older versions
        self.batch_size = None if size is None else int(size)
        # absent in older checkpoints: the epoch's mean is then of the resumed batches
        total = saved.get("loss_sum", 0.0)  # None: not finite (checkpoint JSON has no NaN)
        self.loss_sum = math.nan if total is None else float(total)
        self.loss_count = int(saved.get("loss_count", 0))
        self.loss_rows = int(saved.get("loss_rows", 0))  # 0: older, unweighted losses

    def position(self) -> Any:
        """:attr:`data` as JSON (calling it where it is a function)."""
        return self.data() if callable(self.data) else self.data

    def next_epoch(self) -> None:
        self.epoch, self.batch, self.data = self.epoch + 1, 0, None
        self.loss_sum, self.loss_count, self.loss_rows = 0.0, 0, 0

    def add_loss(self, value: float, rows: int = 1) -> None:
        """Counts one step's training loss (a mean over its ``rows``) into the epoch's
        mean over rows; losses loaded without rows weigh as this step's."""
        if self.loss_count and not self.loss_rows:
            self.loss_sum, self.loss_rows = self.loss_sum * rows, self.loss_count * rows
        self.loss_sum += value * rows
        self.loss_count, self.loss_rows = self.loss_count + 1, self.loss_rows + rows

    def mean_loss(self) -> float:
        """The training loss of the epoch so far, the mean over its rows (NaN before
        its first step)."""
        if self.loss_rows:
            return self.loss_sum / self.loss_rows
        return self.loss_sum / self.loss_count if self.loss_count else math.nan


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def progress(model: Any) -> Progress:
    """The :class:`Progress` of ``model`` (made at its first use)."""
    found = model.__dict__.get("train_progress")
    if found is None:
        found = model.__dict__["train_progress"] = Progress()
    return found


class Batches:
    """A source of training batches: ``len(source)`` per epoch, read by :meth:`epoch`.
    ``batch_size``: the samples per batch where ``train``'s ``batch_size`` applies."""

    batch_size: int | None = None

    def __len__(self) -> int:
        raise NotImplementedError

    def resume(self, progress: Progress) -> None:
        """Fits ``progress`` (an epoch stopped at a batch, maybe in batches of another
        size) to this source's batches: sets its ``batch`` and ``data`` to where this
        source continues the epoch, or raises :class:`ModelError` where it cannot."""

    def epoch(self, epoch: int, start: int, saved: Any) -> Iterator[Batch]:
        """Batches ``start, start + 1, ...`` of ``epoch``; ``saved`` is the position a
        :meth:`snapshot` taken at ``start`` gives (or ``None``)."""
        raise NotImplementedError

    def snapshot(self) -> Callable[[], Any]:
        """The JSON position after the last batch given (``None``: epoch and batch say
        it), as a function to call later: ``train`` takes it before reading ahead."""
        return _nothing


def _nothing() -> None:
    return None


class ArrayBatches(Batches):
    """Samples of in-memory arrays in a permutation drawn from ``(seed, epoch)``; the
    last partial batch is dropped (every sample is still seen over epochs).

    An epoch begun in batches of another size (a resumed run given another
    ``batch_size``) continues at the same sample of the same permutation: the batches
    are then shifted by an offset, kept in the data position as ``{"samples": s}``
    (the samples of the epoch done), and the samples after the last full batch are
    dropped as at any epoch's end. Aligned epochs keep no position (``None``).
    """

    def __init__(self, data: Any, batch_size: int, seed: int):
        inputs, targets = split(data, "train")
        n = len(inputs[0])
        if n < batch_size:
            raise ModelError(f"train: {n} samples are fewer than batch_size={batch_size}")
        self.inputs, self.targets, self.n = inputs, targets, n
        self.batch_size, self.seed = batch_size, seed
        self._samples: int | None = None  # after the last batch given, when shifted

    def __len__(self) -> int:
        return self.n // self.batch_size

    def resume(self, progress: Progress) -> None:
        saved = progress.position()
        shifted = isinstance(saved, dict) and "samples" in saved
        before = progress.batch_size or self.batch_size
        if not (progress.batch or shifted) or before == self.batch_size:
            return
        done = int(saved["samples"]) if shifted else progress.batch * before
        # start + (batches left) == len(self): train's end-of-epoch check holds as is
        progress.batch = len(self) - max(self.n - done, 0) // self.batch_size
        aligned = done == progress.batch * self.batch_size
        progress.data = None if aligned else {"samples": done}

    def epoch(self, epoch: int, start: int, saved: Any) -> Iterator[Batch]:
        order = np.random.default_rng((self.seed, epoch)).permutation(self.n)
        bs = self.batch_size
        shifted = isinstance(saved, dict) and "samples" in saved
        offset = int(saved["samples"]) - start * bs if shifted else 0
        for k in range(start, len(self)):
            idx = order[offset + k * bs : offset + (k + 1) * bs]
            self._samples = offset + (k + 1) * bs if offset else None
            yield [x[idx] for x in self.inputs], [t[idx] for t in self.targets]

    def snapshot(self) -> Callable[[], Any]:
        samples = self._samples
        return _nothing if samples is None else lambda: {"samples": samples}


class FrameBatches(Batches):
    """A :class:`fnnc.data.DataFrame`: epoch ``e`` is ``df.iterator(columns, seed=seed,
    epoch=e)``; an unbatched frame is shuffled (unless it has a shuffle) and batched with
    ``drop_remainder=True``; a batched one is read as it is."""

    def __init__(
        self, frame: Any, batch_size: int, seed: int, inputs: Any = None, targets: Any = None
    ):
        from fnnc.data.stages import Group, Shuffle

        own = [s for s in frame._stages if isinstance(s, Group)]
        batched = bool(own)
        if not own:
            if not any(isinstance(s, Shuffle) for s in frame._stages):
                frame = frame.shuffle()
            if len(frame) >= batch_size:  # else no batch: train's error below, not batch's
                frame, batched = frame.batch(batch_size, drop_remainder=True), True
            self.batch_size = batch_size
        columns = frame.columns
        if inputs is None:
            inputs = columns[:-1] if targets is None else [c for c in columns if c not in targets]
        if targets is None:
            targets = [c for c in columns if c not in as_list(inputs)]
        self.inputs, self.targets = as_list(inputs), as_list(targets)
        if not self.inputs:
            raise ModelError(
                f"train: the dataframe has columns {list(columns)}; name the model's inputs "
                "and targets with train(df, inputs=[...], targets=[...])"
            )
        self.frame, self.seed, self.it = frame, seed, None
        if len(frame) == 0 or not batched:
            made = (
                f"its own {own[-1].describe()}, so train's batch_size does not apply"
                if own
                else f"batch_size={batch_size}, drop_remainder=True"
            )
            raise ModelError(
                f"train: the dataframe gives no batches ({made}): {frame!r}; give it more "
                "rows or batch it smaller"
            )

    def __len__(self) -> int:
        return len(self.frame)

    def resume(self, progress: Progress) -> None:
        before = progress.batch_size
        if not progress.batch or before in (None, self.batch_size) or self.batch_size is None:
            return
        saved = progress.position()
        if isinstance(saved, dict) and saved.get("position", 0) >= saved.get("stop", 1):
            progress.next_epoch()  # saved after its epoch's last batch
            return
        # The reading position is a batch count of the pipeline batched in the old size;
        # continuing in another would repeat or skip samples.
        raise ModelError(
            f"train: the run stopped inside epoch {progress.epoch} after {progress.batch} "
            f"batches of {before} samples of this dataframe; it continues only in "
            f"batches of {before}, got batch_size={self.batch_size}. Finish the epoch "
            f"with batch_size={before} (epochs={progress.epoch + 1} with resume=), then "
            f"train on with batch_size={self.batch_size}"
        )

    def epoch(self, epoch: int, start: int, saved: Any) -> Iterator[Batch]:
        n_in = len(self.inputs)
        it = self.frame.iterator([*self.inputs, *self.targets], seed=self.seed, epoch=epoch)
        if start and saved is not None:
            it.set_state(saved)
        elif start:
            it.take(start)
        self.it = it
        try:
            for k in range(start, len(self)):
                try:
                    row = next(it)
                except StopIteration:
                    return
                except DataError as e:
                    raise DataError(f"train: epoch {epoch}, batch {k}: {e}") from e
                yield list(row[:n_in]), list(row[n_in:])
        finally:
            it.close()

    def snapshot(self) -> Callable[[], Any]:
        return _nothing if self.it is None else self.it.snapshot()


class GrainBatches(Batches):
    """A ``grain.MapDataset`` whose elements are ``(inputs, targets)`` batches (targets
    ``None`` for a ``loss=None`` model): epoch
    ``e`` reads indices ``e * len .. (e + 1) * len`` of ``ds.repeat()``, where Grain's
    shuffles reshuffle per epoch."""

    def __init__(self, dataset: Any):
        self.dataset, self.n = dataset.repeat(), len(dataset)

    def __len__(self) -> int:
        return self.n

    def epoch(self, epoch: int, start: int, saved: Any) -> Iterator[Batch]:
        for k in range(start, self.n):
            element = self.dataset[epoch * self.n + k]
            try:
                inputs, targets = element
            except (TypeError, ValueError):
                raise ModelError(
                    f"train: element {k} of the Grain dataset is a {type(element).__name__}; "
                    "expected (inputs, targets) batches (map the dataset to that pair)"
                ) from None
            yield as_list(inputs), targets_list(targets)


def batches(
    data: Any, *, batch_size: int, seed: int, inputs: Any = None, targets: Any = None
) -> Batches:
    """The :class:`Batches` for what ``train`` was given."""
    from fnnc.data import DataFrame

    batch_size = check_batch_size(batch_size, "train")
    if isinstance(data, DataFrame):
        return FrameBatches(data, batch_size, seed, inputs, targets)
    import grain

    if isinstance(data, grain.MapDataset):
        return GrainBatches(data)
    if isinstance(data, grain.IterDataset):
        raise ModelError(
            "train: a grain.IterDataset cannot restart an epoch at a batch; pass the "
            "grain.MapDataset before to_iter_dataset(), or a fnnc.data.DataFrame"
        )
    return ArrayBatches(data, batch_size, seed)
