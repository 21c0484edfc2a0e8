"""Callbacks of :meth:`Model.train <fnnc.models.Model.train>`: small objects with hooks.

A callback subclasses :class:`Callback` and overrides any of ``on_train_begin``,
``on_step_end``, ``on_epoch_end`` and ``on_train_end``; each gets the running
:class:`~fnnc.models.training.TrainLoop` (``loop.model``, ``loop.progress``,
``loop.history``), and setting ``loop.stop = True`` ends training after the hook.

>>> import os, tempfile
>>> import numpy as np, optax
>>> from fnnc.models import Dense, Model, Input
>>> from fnnc.models.callbacks import CheckpointEvery, EarlyStopping
>>> x = Input()
>>> model = Model(x, Dense(2, name="fc")(x))
>>> xs = np.random.default_rng(0).standard_normal((32, 3)).astype(np.float32)
>>> ys = (xs[:, 0] > 0).astype(np.int32)
>>> model.compile(xs[:8], loss="softmax_crossentropy", minimizer=optax.adam(1e-2))
>>> path = os.path.join(tempfile.mkdtemp(), "run.ckpt")
>>> history = model.train((xs, ys), epochs=3, batch_size=8, validation=(xs, ys),
...     callbacks=[CheckpointEvery(path, per_epoch=True), EarlyStopping(patience=2)],
...     verbose=False)
>>> len(history["val_loss"]), model.train_progress.epoch
(3, 3)
"""

from __future__ import annotations

import math
import os
from typing import Any

from fnnc.errors import ModelError


class Callback:
    """Base class: every hook does nothing."""

    def on_train_begin(self, loop: Any) -> None:
        """Before the first step of a ``train`` call."""

    def on_step_end(self, loop: Any, step: int, loss: float) -> None:
        """After training step ``step`` (counted over every call, from 1)."""

    def on_epoch_end(self, loop: Any, epoch: int, logs: dict[str, float]) -> None:
        """After epoch ``epoch`` (from 0) with its metrics (``loss``, ``val_loss``, ...)."""

    def on_train_end(self, loop: Any) -> None:
        """After the last step (also when training stops on an error)."""


class CheckpointEvery(Callback):
    """Saves the model (parameters, optimizer state, RNG, epoch, data position) to a
    :class:`fnnc.io.Checkpoints` journal every ``steps`` steps or every epoch.

    Args:
        checkpoints: a path (opened for the run, closed after), a ``Checkpoints`` or a
            :class:`fnnc.io.ShardedCheckpoints`.
        steps: save after every ``steps``-th step.
        per_epoch: save after every epoch (its metrics go to the metadata).
        keep_last: retention when opening a path (see ``Checkpoints``).
        sharded: for a path: ``True`` opens a ``ShardedCheckpoints`` directory (each
            process writes its own shards through Orbax), ``False`` a ``Checkpoints``
            file; ``None`` (default) picks the sharded one for a model whose parameters
            are split over processes (FSDP, tensor parallel) or a path that is a
            directory already, else the SQLite file.

    ``model.train(data, epochs=E, resume=checkpoints)`` continues the run from the
    newest save, exactly as if it had not stopped.
    """

    def __init__(
        self,
        checkpoints: Any,
        *,
        steps: int | None = None,
        per_epoch: bool = False,
        keep_last: int | None = None,
        sharded: bool | None = None,
    ):
        if (steps is None) == (not per_epoch):
            raise ModelError("CheckpointEvery: give steps=N or per_epoch=True (one of them)")
        if steps is not None and (not isinstance(steps, int) or steps < 1):
            raise ModelError(f"CheckpointEvery: steps must be a positive int, got {steps!r}")
        self.target, self.steps, self.per_epoch = checkpoints, steps, per_epoch
        self.keep_last, self.sharded = keep_last, sharded
        self.checkpoints: Any = None
        self._owned = False

    def on_train_begin(self, loop: Any) -> None:
        from fnnc.io import Checkpoints, ShardedCheckpoints
        from fnnc.models.sharded_state import split_parameters

        if isinstance(self.target, (str, os.PathLike)):
            sharded = self.sharded
            if sharded is None:
                split = split_parameters(loop.model.engine)
                sharded = bool(split) or os.path.isdir(self.target)
            kind = ShardedCheckpoints if sharded else Checkpoints
            self.checkpoints, self._owned = kind(self.target, keep_last=self.keep_last), True
        else:
            self.checkpoints = self.target

    def on_step_end(self, loop: Any, step: int, loss: float) -> None:
        if self.steps is not None and step % self.steps == 0:
            finite = {"loss": loss} if math.isfinite(loss) else {}  # JSON holds no NaN
            self.checkpoints.save(step, loop.model, metadata=finite)

    def on_epoch_end(self, loop: Any, epoch: int, logs: dict[str, float]) -> None:
        if self.per_epoch:
            finite = {k: v for k, v in logs.items() if math.isfinite(v)}
            self.checkpoints.save(loop.progress.step, loop.model, metadata=finite)

    def on_train_end(self, loop: Any) -> None:
        if self._owned and self.checkpoints is not None:
            self.checkpoints.close()
            self.checkpoints, self._owned = None, False

    def latest(self) -> int | None:
        """The newest saved step, or ``None``."""
        return None if self.checkpoints is None else self.checkpoints.latest


class EarlyStopping(Callback):
    """Stops training when ``monitor`` has not improved for ``patience`` epochs.

    Args:
        monitor: a key of the epoch metrics (``val_loss`` needs ``validation=``).
        patience: epochs without improvement to allow.
        min_delta: the least change that counts as an improvement.
        mode: ``"min"``, ``"max"``, or ``"auto"`` (max for names with ``acc``).
    """

    def __init__(
        self, monitor: str = "val_loss", *, patience: int = 0, min_delta: float = 0.0,
        mode: str = "auto",
    ):  # fmt: skip
        if mode not in ("min", "max", "auto"):
            raise ModelError(f"EarlyStopping: mode must be 'min', 'max' or 'auto', got {mode!r}")
        if mode == "auto":
            mode = "max" if "acc" in monitor else "min"
        self.monitor, self.patience, self.min_delta, self.mode = monitor, patience, min_delta, mode
        self.best: float | None = None
        self.wait = 0
        self.stopped_epoch: int | None = None

    def on_train_begin(self, loop: Any) -> None:
        self.best, self.wait, self.stopped_epoch = None, 0, None

    def on_epoch_end(self, loop: Any, epoch: int, logs: dict[str, float]) -> None:
        if self.monitor not in logs:
            raise ModelError(
                f"EarlyStopping: no metric {self.monitor!r} in this epoch's metrics "
                f"{sorted(logs)}; pass validation= for val_* metrics, or monitor one of those"
            )
        value = logs[self.monitor]
        sign = 1.0 if self.mode == "min" else -1.0
        if self.best is None or sign * (self.best - value) > self.min_delta:
            self.best, self.wait = value, 0
            return
        self.wait += 1
        if self.wait > self.patience:
            loop.stop, self.stopped_epoch = True, epoch
