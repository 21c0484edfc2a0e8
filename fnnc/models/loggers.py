"""Callbacks that log a training run: TensorBoard, CSV, the learning rate, a plot.

Each is a :class:`~fnnc.models.callbacks.Callback` for ``Model.train(callbacks=...)``
and records the epoch metrics ``train`` computes (``loss``, ``val_loss``,
``val_accuracy``, ...), one row or point per epoch, at the epoch number (1, 2, ...)
as ``history["epoch"]`` counts, so a resumed run continues its curves.

- :class:`TensorBoard` writes event files with TensorBoard's own writer
  (``tensorboard.summary.Writer``: NumPy only, no TensorFlow or PyTorch); the package
  that writes them is the one that shows them (``tensorboard --logdir DIR``) and reads
  them back (``EventAccumulator``). It is an optional extra:
  ``pip install "fnnc[tensorboard]"``.
- :class:`CSVLogger` appends one row per epoch to a CSV file (Keras's name).
- :class:`LearningRate` adds the learning rate of a schedule to the metrics (``lr``),
  so the history, the CSV and TensorBoard have it; list it before the loggers.
- :class:`PlotHistory` redraws the history as a PNG every epoch
  (:func:`fnnc.models.plots.plot_history`; matplotlib, ``pip install "fnnc[plot]"``).

>>> import csv, os, tempfile
>>> import numpy as np, optax
>>> from fnnc.models import CSVLogger, Dense, Input, LearningRate, Model
>>> x = Input()
>>> model = Model(x, Dense(2, name="fc")(x))
>>> xs = np.random.default_rng(0).standard_normal((32, 3)).astype(np.float32)
>>> schedule = optax.linear_schedule(0.1, 0.0, transition_steps=8)
>>> model.compile(xs[:8], loss="softmax_crossentropy", minimizer=optax.sgd(schedule))
>>> path = os.path.join(tempfile.mkdtemp(), "log.csv")
>>> h = model.train((xs, (xs[:, 0] > 0).astype(np.int32)), epochs=2, batch_size=8,
...                 callbacks=[LearningRate(schedule), CSVLogger(path)], verbose=False)
>>> with open(path) as f:
...     rows = list(csv.DictReader(f))
>>> [r["epoch"] for r in rows], [round(float(r["lr"]), 4) for r in rows], h["lr"] == [
...     float(r["lr"]) for r in rows]
(['1', '2'], [0.0625, 0.0125], True)
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from fnnc.core.files import atomic_write
from fnnc.core.params import require_flag
from fnnc.errors import ModelError
from fnnc.models.callbacks import Callback
from fnnc.models.checkpoint_state import current_states


def _need(module: str, extra: str, who: str) -> Any:
    """Imports optional ``module``, or says which extra installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ModelError(
            f"{who} needs the optional package {module.split('.')[0]!r}, which is not "
            f'installed; pip install "fnnc[{extra}]"'
        ) from None


class TensorBoard(Callback):
    """Writes the epoch metrics (and, with ``per_step``, each step's loss) as
    TensorBoard scalars to event files in ``log_dir``.

    Args:
        log_dir: the run's folder (made if missing); ``tensorboard --logdir`` it.
        per_step: also write ``step/loss`` at every training step (global step).

    Tags are the metric names (``loss``, ``val_loss``, ``lr``, ...) at the epoch
    number; values are stored as float32, TensorBoard's scalar type.
    """

    logs_metrics = True

    def __init__(self, log_dir: str | os.PathLike[str], *, per_step: bool = False):
        per_step = require_flag(per_step, "TensorBoard(per_step=...)", ModelError)
        self.log_dir, self.per_step = os.fspath(log_dir), per_step
        self.writer: Any = None

    def on_train_begin(self, loop: Any) -> None:
        summary = _need("tensorboard.summary", "tensorboard", "TensorBoard")
        os.makedirs(self.log_dir, exist_ok=True)
        self.writer = summary.Writer(self.log_dir)

    def on_step_end(self, loop: Any, step: int, loss: float) -> None:
        if self.per_step:
            self.writer.add_scalar("step/loss", loss, step)

    def on_epoch_end(self, loop: Any, epoch: int, logs: dict[str, float]) -> None:
        for key, value in logs.items():
            self.writer.add_scalar(key, value, epoch + 1)
        self.writer.flush()  # a run watched live, or killed, shows every finished epoch

    def on_train_end(self, loop: Any) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class CSVLogger(Callback):
    """Writes one CSV row per epoch: ``epoch`` then the metrics, in the order of the
    first epoch's (values as Python writes floats, so they read back exactly).

    Args:
        path: the CSV file.
        append: add to an existing file (a resumed run) instead of starting anew; the
            header is written only to an empty file. Rows of epochs past the model's
            progress (``model.train_progress.epoch``: written after the checkpoint the
            run resumed from) are dropped first, as the run writes them again, so no
            epoch is logged twice.
    """

    logs_metrics = True

    def __init__(self, path: str | os.PathLike[str], *, append: bool = False):
        append = require_flag(append, "CSVLogger(append=...)", ModelError)
        self.path, self.append = os.fspath(path), append
        self._file: Any = None
        self._writer: Any = None
        self._keys: list[str] | None = None

    def on_train_begin(self, loop: Any) -> None:
        self._keys = None
        try:
            if self.append and os.path.isfile(self.path) and os.path.getsize(self.path) > 0:
                header = _keep_epochs_up_to(self.path, loop.progress.epoch)
                self._keys = header[1:] if header else None
            self._file = open(self.path, "a" if self.append else "w", newline="")  # noqa: SIM115
        except OSError as e:
            folder = os.path.dirname(os.path.abspath(self.path))
            why = (
                f"the folder {folder} does not exist; create it first"
                if not os.path.isdir(folder)
                else f"{e.strerror or e}; check that it is a writable file path"
            )
            raise ModelError(f"CSVLogger: cannot open {self.path} to write the log: {why}") from e

    def on_epoch_end(self, loop: Any, epoch: int, logs: dict[str, float]) -> None:
        if self._keys is None:
            self._keys = list(logs)
            csv.writer(self._file).writerow(["epoch", *self._keys])
        missing = [k for k in logs if k not in self._keys]
        if missing:
            raise ModelError(
                f"CSVLogger: {self.path} has the columns {self._keys}; this epoch adds "
                f"{missing}. Log to a new file (or append=False) when the metrics change"
            )
        row = [epoch + 1, *(repr(logs.get(k, math.nan)) for k in self._keys)]
        csv.writer(self._file).writerow(row)
        self._file.flush()

    def on_train_end(self, loop: Any) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _keep_epochs_up_to(path: str, epoch: int) -> list[str] | None:
    """Drops the rows of the CSV log ``path`` for epochs past ``epoch`` (written after
    the checkpoint a run resumed from: the resumed run writes them again); returns the
    header."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, body = (rows[0], rows[1:]) if rows else (None, [])
    kept = [r for r in body if not (r and r[0].isdigit() and int(r[0]) > epoch)]
    if len(kept) < len(body):  # replaced whole: a crash in the rewrite keeps the old log
        text = io.StringIO(newline="")
        csv.writer(text).writerows([header, *kept])
        atomic_write(path, text.getvalue())
    return header


class LearningRate(Callback):
    """Adds ``lr``, the learning rate of the epoch's last update, to the epoch metrics.

    The schedule is evaluated where the minimizer last evaluated it: at the update
    count of its state minus one (the last integer ``count`` in the optimizer state of
    the model's first trainable parameter; Optax's schedules read that count). So with
    :func:`~fnnc.models.minimizers.with_gradient_accumulation` or ``optax.MultiSteps``,
    which update every ``k`` steps, it is the rate of the last real update, not of the
    step count. A minimizer keeping no count falls back to the training step: the
    update of step ``s``, from 1, at ``schedule(s - 1)``.

    Args:
        schedule: the Optax schedule given to the minimizer (a function of the update
            count), or a fixed rate.
        name: the metric's name.
    """

    adds_metrics = True

    def __init__(self, schedule: Callable[[int], Any] | float, *, name: str = "lr"):
        if not callable(schedule) and not isinstance(schedule, (int, float)):
            raise ModelError(
                "LearningRate: pass the Optax schedule given to the minimizer (e.g. "
                f"optax.cosine_decay_schedule(...)) or a number, got {type(schedule).__name__}"
            )
        if not isinstance(name, str) or not name:  # the key of the history and the CSV
            raise ModelError(
                f"LearningRate: name={name!r} ({type(name).__name__}); expected a non-empty "
                "string, the metric's key, e.g. name='lr'"
            )
        self.schedule, self.name = schedule, name

    def rate(self, step: int) -> float:
        """The rate of the update of step ``step`` (from 1)."""
        if callable(self.schedule):
            return float(self.schedule(max(step - 1, 0)))
        return float(self.schedule)

    def on_train_begin(self, loop: Any) -> None:
        if self.name in ("loss", "epoch") or self.name in loop.history:
            self._taken(self.name)

    def on_epoch_end(self, loop: Any, epoch: int, logs: dict[str, float]) -> None:
        if self.name in logs:  # a metric train measured (val_loss, accuracy) or another adder's
            self._taken(self.name)
        count = _update_count(loop.model) if callable(self.schedule) else None
        logs[self.name] = self.rate(loop.progress.step if count is None else count)

    def _taken(self, name: str) -> None:
        raise ModelError(
            f"LearningRate: name={name!r} is a metric train already records ('loss', 'epoch', "
            "the val_ metrics, your metrics, another LearningRate's); the rate would replace "
            "it in the history, the logs and what EarlyStopping and the checkpoints read. "
            "Give it its own name, e.g. LearningRate(schedule, name='lr')"
        )


def _update_count(model: Any) -> int | None:
    """How many updates the minimizer of ``model``'s first trainable parameter has
    made: the last integer scalar ``count`` of its optimizer state (the innermost
    transformation's, under accumulation), or None when it keeps none."""
    engine = model.engine
    pids = engine.trainable()
    state = current_states(engine, pids[:1]).get(pids[0]) if pids else None
    counts = [
        leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]
        if jax.tree_util.keystr(path).endswith(".count")
        and np.ndim(leaf) == 0
        and np.issubdtype(np.asarray(leaf).dtype, np.integer)
    ]
    return int(counts[-1]) if counts else None


class PlotHistory(Callback):
    """Draws the metrics of every epoch so far to a PNG file after each epoch
    (:func:`fnnc.models.plots.plot_history`), across ``train`` calls. A metric missing
    from some epochs (``val_loss`` of a call without ``validation=``) is NaN there: a
    gap in its line.

    Args:
        path: the PNG file, rewritten each epoch.
    """

    logs_metrics = True

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        self.history: dict[str, list[float]] = {"epoch": []}

    def on_train_begin(self, loop: Any) -> None:
        _need("matplotlib", "plot", "PlotHistory")

    def on_epoch_end(self, loop: Any, epoch: int, logs: dict[str, float]) -> None:
        from fnnc.models.plots import plot_history

        self.history["epoch"].append(epoch + 1)
        epochs = len(self.history["epoch"])
        # NaN before a metric's first epoch and where one is gone (no validation=); keys in
        # first-seen order (a set's would reorder the plot's lines from run to run)
        for key in dict.fromkeys([*self.history, *logs]):
            if key != "epoch":
                values = self.history.setdefault(key, [])
                values.extend([math.nan] * (epochs - 1 - len(values)))
                values.append(logs.get(key, math.nan))
        plot_history(self.history, self.path)
