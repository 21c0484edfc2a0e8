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
import numbers
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from fnnc.core.dtypes import is_inexact
from fnnc.core.params import require_flag
from fnnc.errors import ModelError, NumericsError
from fnnc.models.layer import is_int, real_scalar

CALLBACKS_KEY = "fnnc.callbacks"
"""The key of the callbacks' progress in a checkpoint's metadata (:class:`CheckpointEvery`)."""


class Callback:
    """Base class: every hook does nothing.

    A callback whose progress matters to the run (:class:`EarlyStopping`'s best value
    and wait) returns it from :meth:`state` and takes it back in :meth:`load_state`:
    :class:`CheckpointEvery` saves it with the model and ``train(resume=...)`` gives
    it back to the callback of the same class and position among those of its class.
    Each hook runs over the callbacks in one order, whatever order ``train`` got them
    in (:func:`in_hook_order`): those with ``adds_metrics = True`` first (they write
    into the epoch's ``logs``: :class:`~fnnc.models.LearningRate`; a value may be a
    Python, NumPy or JAX scalar, which ``train`` turns into a float before the next
    callback, the history and the loggers see it; ``train``'s epoch line is shown after
    them, so it holds what they add), then the others
    (:class:`EarlyStopping` can so monitor an added metric), then those with
    ``logs_metrics = True`` (they record ``logs``: ``CSVLogger``, ``TensorBoard``,
    ``PlotHistory``, so every metric of the epoch reaches them), and those with
    ``saves_the_run = True`` last, so what they save includes the others' work for that
    step or epoch. Callbacks of one stage keep the order they were given in.
    """

    adds_metrics = False
    logs_metrics = False
    saves_the_run = False

    def state(self) -> dict[str, Any] | None:
        """The callback's progress, JSON data kept in checkpoints; None for none."""
        return None

    def load_state(self, state: dict[str, Any]) -> None:
        """Takes back progress :meth:`state` gave, from a resumed checkpoint."""

    def on_train_begin(self, loop: Any) -> None:
        """Before the first step of a ``train`` call."""

    def on_step_end(self, loop: Any, step: int, loss: float) -> None:
        """After training step ``step`` (counted over every call, from 1)."""

    def on_epoch_end(self, loop: Any, epoch: int, logs: dict[str, float]) -> None:
        """After epoch ``epoch`` (from 0) with its metrics (``loss``, ``val_loss``, ...)."""

    def on_train_end(self, loop: Any) -> None:
        """After the last step (also when training stops on an error, or another
        callback's ``on_train_begin`` or ``on_train_end`` fails), for each callback whose
        ``on_train_begin`` finished."""


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
    newest save, exactly as if it had not stopped: the other callbacks' progress
    (:meth:`Callback.state`, e.g. :class:`EarlyStopping`'s) is saved too, under
    ``"fnnc.callbacks"`` in the metadata, and given back to the resumed run's callbacks.

    Before each save it checks that the parameters are finite (one reduction per
    parameter, on its devices): a NaN or infinite gradient with a finite loss (a
    ``jnp.where`` whose untaken branch is NaN) leaves them NaN while the loss the step
    reported was fine. Then training stops with a :class:`~fnnc.errors.NumericsError`
    naming the step and the last checkpoint saved with finite parameters, and nothing
    is saved; with ``train(..., stop_on_nan=False)`` the step is saved, but never named
    as a good one.
    """

    saves_the_run = True

    def __init__(
        self,
        checkpoints: Any,
        *,
        steps: int | None = None,
        per_epoch: bool = False,
        keep_last: int | None = None,
        sharded: bool | None = None,
    ):
        per_epoch = require_flag(per_epoch, "CheckpointEvery(per_epoch=...)", ModelError)
        if (steps is None) == (not per_epoch):
            raise ModelError("CheckpointEvery: give steps=N or per_epoch=True (one of them)")
        if steps is not None and (not is_int(steps) or steps < 1):  # True is no count
            raise ModelError(
                f"CheckpointEvery: steps must be a positive int, got {steps!r} "
                f"({type(steps).__name__})"
            )
        steps = None if steps is None else int(steps)
        if not isinstance(checkpoints, (str, os.PathLike)) and not hasattr(checkpoints, "save"):
            raise ModelError(
                f"CheckpointEvery: checkpoints={checkpoints!r:.60} ({type(checkpoints).__name__}); "
                "expected a path, a fnnc.io.Checkpoints or a fnnc.io.ShardedCheckpoints, e.g. "
                "CheckpointEvery('run.ckpt', per_epoch=True)"
            )
        if sharded is not None:
            sharded = require_flag(sharded, "CheckpointEvery(sharded=...)", ModelError)
        if keep_last is not None and (not is_int(keep_last) or keep_last < 1):
            raise ModelError(
                f"CheckpointEvery: keep_last={keep_last!r:.40} ({type(keep_last).__name__}); "
                "expected a positive int (the newest steps to keep) or None to keep every one"
            )
        self.target, self.steps, self.per_epoch = checkpoints, steps, per_epoch
        self.keep_last, self.sharded = keep_last, sharded
        self.checkpoints: Any = None
        self._owned = False
        self._good: int | None = None

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
        self._good = self.checkpoints.latest  # a step of an earlier run: trusted

    def on_step_end(self, loop: Any, step: int, loss: float) -> None:
        if self.steps is not None and step % self.steps == 0:
            finite = {"loss": loss} if math.isfinite(loss) else {}  # JSON holds no NaN
            self.save(loop, step, finite)

    def on_epoch_end(self, loop: Any, epoch: int, logs: dict[str, float]) -> None:
        if self.per_epoch:
            finite = {k: v for k, v in logs.items() if math.isfinite(v)}
            self.save(loop, loop.progress.step, finite)

    def save(self, loop: Any, step: int, metadata: dict[str, Any]) -> None:
        """Saves the model at ``step`` with ``metadata`` and the callbacks' progress,
        unless its parameters are not finite and ``loop.stop_on_nan`` (see the class)."""
        callbacks = getattr(loop, "callbacks", ())
        bad = nonfinite_parameters(loop.model)
        if bad and getattr(loop, "stop_on_nan", True):
            more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
            raise NumericsError(
                f"train: the parameters after step {step} are not finite ({', '.join(bad[:4])}"
                f"{more}) though the loss of step {step} was finite: most likely a gradient "
                "was NaN or infinite (e.g. a jnp.where whose untaken branch is NaN, a sqrt or "
                f"log at 0), so training stopped without saving step {step}. "
                f"{last_good_note(callbacks or [self])}; then fix the loss or lower the "
                "learning rate (stop_on_nan=False trains on regardless)"
            )
        states = callback_states(callbacks)
        if states:
            metadata = {**metadata, CALLBACKS_KEY: states}
        self.checkpoints.save(step, loop.model, metadata=metadata)
        if not bad:
            self._good = step

    def on_train_end(self, loop: Any) -> None:
        if self._owned and self.checkpoints is not None:
            self.checkpoints.close()
            self.checkpoints, self._owned = None, False

    def latest(self) -> int | None:
        """The newest saved step, or ``None``."""
        return None if self.checkpoints is None else self.checkpoints.latest

    def last_good(self) -> int | None:
        """The newest step saved with finite parameters (the newest step of the
        checkpoints before this run counts as one), or ``None``."""
        return self._good


_all_finite = jax.jit(lambda a: jnp.isfinite(a).all())


def nonfinite_parameters(model: Any) -> list[str]:
    """Ids of ``model``'s float parameters (internals included) holding a NaN or an
    infinity: one reduction on each parameter's devices, read back together."""
    values = model.engine.values
    floats = [p for p, v in values.items() if is_inexact(v.dtype)]
    finite = jax.device_get([_all_finite(values[p]) for p in floats])
    return [p for p, ok in zip(floats, finite) if not ok]


def last_good_note(callbacks: Sequence[Any]) -> str:
    """The sentence naming the newest checkpoint that ``callbacks``' savers wrote with
    finite parameters (how to restore it), or saying there is none."""
    savers = [cb for cb in callbacks if hasattr(cb, "last_good") and cb.checkpoints is not None]
    saved = [(cb.last_good(), cb.checkpoints) for cb in savers]
    saved = [(step, ckpt) for step, ckpt in saved if step is not None]
    if saved:
        step, ckpt = max(saved, key=lambda s: s[0])
        return (
            f"The last good checkpoint is step {step} in {ckpt.path}: restore it with "
            f"{type(ckpt).__name__}({ckpt.path!r}).restore_into(model, {step})"
        )
    if savers:
        return "No checkpoint with finite parameters was saved in this run"
    return "No checkpoint was saved in this run (add callbacks=[CheckpointEvery(...)])"


_HOOKS = ("on_train_begin", "on_step_end", "on_epoch_end", "on_train_end")


def _is_callback(cb: Any) -> bool:
    """A :class:`Callback` instance, or an object with all four hooks (duck-typed)."""
    if isinstance(cb, Callback):
        return True
    return not isinstance(cb, type) and all(callable(getattr(cb, h, None)) for h in _HOOKS)


def check_callbacks(callbacks: Any) -> list[Any]:
    """``callbacks`` as a list: one callback stands for ``[it]``; anything that is not a
    callback instance is a :class:`ModelError` naming its position and what to pass."""
    if _is_callback(callbacks):
        return [callbacks]
    if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Sequence):
        items: list[Any] = [callbacks]
        label = "callbacks"
    else:
        items, label = list(callbacks), ""
    for i, cb in enumerate(items):
        if _is_callback(cb):
            continue
        got = f"the class {cb.__name__}" if isinstance(cb, type) else type(cb).__name__
        fix = f" (instantiate it: {cb.__name__}(...))" if isinstance(cb, type) else ""
        raise ModelError(
            f"train: {label or f'callbacks[{i}]'} is {got}{fix}; expected a "
            "fnnc.models.Callback instance (e.g. EarlyStopping(patience=2)) or a list of them"
        )
    return items


def hook_stage(callback: Any) -> int:
    """Where ``callback`` runs among the others (see :class:`Callback`): 0 adds metrics,
    1 the rest, 2 logs metrics, 3 saves the run. A callback that is no
    :class:`Callback` subclass (any object with the hooks) may set the same flags."""
    if getattr(callback, "saves_the_run", False):
        return 3
    if getattr(callback, "logs_metrics", False):
        return 2
    return 0 if getattr(callback, "adds_metrics", False) else 1


def in_hook_order(callbacks: Sequence[Any]) -> list[Any]:
    """``callbacks`` in the order their hooks run: by :func:`hook_stage`, stably."""
    return sorted(callbacks, key=hook_stage)


def _keys(callbacks: Sequence[Callback]) -> list[str]:
    """``<class name>/<position among callbacks of that class>`` per callback."""
    seen: dict[str, int] = {}
    keys = []
    for cb in callbacks:
        name = type(cb).__name__
        keys.append(f"{name}/{seen.get(name, 0)}")
        seen[name] = seen.get(name, 0) + 1
    return keys


def callback_states(callbacks: Sequence[Callback]) -> dict[str, Any]:
    """The progress of each of ``callbacks`` that has some, keyed as :func:`_keys`."""
    states = {k: getattr(cb, "state", lambda: None)() for k, cb in zip(_keys(callbacks), callbacks)}
    return {k: v for k, v in states.items() if v is not None}


def load_callback_states(callbacks: Sequence[Callback], metadata: Any) -> None:
    """Gives each of ``callbacks`` its progress saved in a checkpoint's ``metadata``."""
    saved = metadata.get(CALLBACKS_KEY, {}) if isinstance(metadata, dict) else {}
    for key, cb in zip(_keys(callbacks), callbacks):
        if key in saved and hasattr(cb, "load_state"):
            cb.load_state(saved[key])


class EarlyStopping(Callback):
    """Stops training when ``monitor`` has not improved for ``patience`` epochs.

    Its progress (the best value, the epochs waited) belongs to the run, not to one
    ``train`` call: consecutive ``train`` calls given the same EarlyStopping continue
    counting (``train(epochs=1)`` in a loop stops as one ``train(epochs=E)`` would), a
    run resumed from a :class:`CheckpointEvery` checkpoint takes it back from there, and
    :meth:`reset` starts it afresh. A NaN value is an epoch without improvement (as in
    Keras), never the best. Once it has stopped a run, a further ``train`` call
    stops after its first epoch unless that epoch improves on the best.

    Args:
        monitor: a key of the epoch metrics (``val_loss`` needs ``validation=``).
        patience: epochs without improvement to allow.
        min_delta: the least change that counts as an improvement, a number >= 0 (in
            the direction ``mode`` says: a fall for ``"min"``, a rise for ``"max"``).
        mode: ``"min"``, ``"max"``, or ``"auto"`` (max for names with ``acc``).
    """

    def __init__(
        self, monitor: str = "val_loss", *, patience: int = 0, min_delta: float = 0.0,
        mode: str = "auto",
    ):  # fmt: skip
        if not isinstance(monitor, str):  # 'acc' in 5 raised a bare TypeError
            raise ModelError(
                f"EarlyStopping: monitor={monitor!r} ({type(monitor).__name__}); expected the "
                "name of an epoch metric, e.g. monitor='val_loss'"
            )
        if mode not in ("min", "max", "auto"):
            raise ModelError(f"EarlyStopping: mode must be 'min', 'max' or 'auto', got {mode!r}")
        if not is_int(patience) or patience < 0:
            raise ModelError(
                f"EarlyStopping: patience={patience!r} ({type(patience).__name__}); expected an "
                "int >= 0, the epochs without improvement to allow, e.g. patience=2"
            )
        if real_scalar(min_delta):  # a 0-d NumPy or JAX number
            min_delta = float(min_delta)
        number = isinstance(min_delta, numbers.Real) and not isinstance(min_delta, bool)
        if not number or not math.isfinite(min_delta) or min_delta < 0:
            # a negative one counted a worse value as an improvement and made it the best,
            # so a slowly worsening metric never stopped the run
            raise ModelError(
                f"EarlyStopping: min_delta={min_delta!r} ({type(min_delta).__name__}); expected "
                "a number >= 0, the least change that counts as an improvement (in the "
                "direction mode says), e.g. min_delta=1e-3"
            )
        if mode == "auto":
            mode = "max" if "acc" in monitor else "min"
        self.monitor, self.min_delta, self.mode = monitor, float(min_delta), mode
        self.patience = int(patience)
        self.best: float | None = None
        self.wait = 0
        self.stopped_epoch: int | None = None

    def reset(self) -> None:
        """Forgets the best value and the wait: the next epoch starts a new count."""
        self.best, self.wait, self.stopped_epoch = None, 0, None

    def state(self) -> dict[str, Any]:
        finite = self.best is not None and math.isfinite(self.best)  # JSON holds no NaN
        return {"best": self.best if finite else None, "wait": self.wait}

    def load_state(self, state: dict[str, Any]) -> None:
        self.best, self.wait = state["best"], int(state["wait"])

    def on_train_begin(self, loop: Any) -> None:
        self.stopped_epoch = None

    def on_epoch_end(self, loop: Any, epoch: int, logs: dict[str, float]) -> None:
        if self.monitor not in logs:
            raise ModelError(
                f"EarlyStopping: no metric {self.monitor!r} in this epoch's metrics "
                f"{sorted(logs)}; pass validation= for val_* metrics, or monitor one of those"
            )
        value = logs[self.monitor]
        sign = 1.0 if self.mode == "min" else -1.0
        # NaN is never an improvement nor the best: as the best, no later value could
        # improve on it, and a checkpoint (JSON, no NaN) would resume it as no best at all
        if not math.isnan(value) and (
            self.best is None or sign * (self.best - value) > self.min_delta
        ):
            self.best, self.wait = value, 0
            return
        self.wait += 1
        if self.wait > self.patience:
            loop.stop, self.stopped_epoch = True, epoch
