"""The training loop of :meth:`Model.train <fnnc.models.Model.train>`, and predict.

Epochs of fused steps over arrays, a :class:`fnnc.data.DataFrame` or a Grain
``MapDataset`` (see :mod:`fnnc.models.batches`), with per-epoch metrics, callbacks
(:mod:`fnnc.models.callbacks`), a stop on a NaN or infinite loss, and exact resumption
from a :class:`fnnc.io.Checkpoints` journal. A learning-rate schedule is an Optax one:

>>> import numpy as np, optax
>>> from fnnc.models import Dense, Input, Model
>>> x = Input()
>>> model = Model(x, Dense(3, name="fc")(x))
>>> xs = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
>>> ys = np.argmax(xs[:, :3], axis=1)
>>> schedule = optax.cosine_decay_schedule(0.05, decay_steps=16)
>>> model.compile(xs[:16], loss="softmax_crossentropy", minimizer=optax.adam(schedule))
>>> history = model.train((xs, ys), epochs=2, batch_size=16, validation=(xs, ys),
...                       verbose=False)
>>> sorted(history), model.train_progress.epoch, model.train_progress.step
(['epoch', 'loss', 'val_accuracy', 'val_loss'], 2, 8)
>>> model.predict(xs, batch_size=32).shape
(64, 3)
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from fnnc.errors import ModelError, NumericsError, ShapeError
from fnnc.models import batches as feed
from fnnc.models import checks, processes, sample_sets
from fnnc.models import metrics as metrics_
from fnnc.models.callbacks import (
    Callback,
    check_callbacks,
    hook_stage,
    in_hook_order,
    last_good_note,
    load_callback_states,
)
from fnnc.models.interrupts import deferred_interrupt
from fnnc.models.layer import is_int
from fnnc.models.progress import EpochLines
from fnnc.models.validation import outputs_and_targets, validation_batches


@dataclasses.dataclass
class TrainLoop:
    """What callbacks see of a running ``train`` call; ``stop = True`` ends it."""

    model: Any
    progress: feed.Progress
    history: dict[str, list[float]]
    batches_per_epoch: int
    target_epoch: int
    stop: bool = False
    callbacks: tuple[Callback, ...] = ()
    stop_on_nan: bool = True


def train(
    model: Any,
    data: Any,
    *,
    epochs: int = 1,
    batch_size: int = 32,
    validation: Any = None,
    metrics: Mapping[str, Callable[..., Any]] | Sequence[str] | None = None,
    callbacks: Sequence[Callback] | Callback = (),
    resume: Any = None,
    seed: int | None = None,
    stop_on_nan: bool = True,
    inputs: Any = None,
    targets: Any = None,
    progress: bool | None = None,
    verbose: bool = True,
) -> dict[str, list[float]]:
    """Trains a compiled model; returns the metrics of each epoch run (see ``Model.train``)."""
    _check_args(epochs, data, validation, inputs, targets)
    seed = _shuffle_seed(seed)  # before the model keeps it
    prog = feed.progress(model)
    # metrics are added before others read them and loggers record them; savers run last
    callbacks = in_hook_order(check_callbacks(callbacks))
    adders = sum(hook_stage(cb) == 0 for cb in callbacks)  # the first, in hook order
    if resume is not None:
        load_callback_states(callbacks, _restore(resume, model))
    if seed is not None:
        prog.seed = seed
    source = feed.batches(
        data, batch_size=batch_size, seed=prog.seed, inputs=inputs, targets=targets
    )
    if processes.spanned(model) > 1:  # a process with fewer batches would hang the others
        processes.agree(
            [len(source)], "train", "the number of batches per epoch",
            "give every process as many batches of as many rows: DataFrame.shard() "
            "(drop_remainder=True) splits a dataframe so, or pass equal shards of the arrays",
        )  # fmt: skip
    if isinstance(source, feed.FrameBatches) and inputs is None:
        _check_default_columns(model, source)
    if isinstance(source, feed.ArrayBatches):  # once per call, on the host
        checks.train_data(model, source.inputs, source.targets, batch_size)
    source.resume(prog)  # an epoch stopped in batches of another size
    if prog.batch >= len(source):  # saved after the last batch of its epoch
        prog.next_epoch()
    prog.batch_size = source.batch_size
    target = epochs if resume is not None else prog.epoch + epochs
    measure = _metrics(model, metrics, validation, (inputs, targets), data)
    history: dict[str, list[float]] = {"epoch": [], "loss": []}
    loop = TrainLoop(
        model, prog, history, len(source), target, callbacks=tuple(callbacks),
        stop_on_nan=stop_on_nan,
    )  # fmt: skip
    lines = None
    if verbose:
        lines = EpochLines(target, bars=sys.stderr.isatty() if progress is None else progress)
    begun: list[Any] = []  # ended in the finally below, even if a later one fails to begin
    try:
        for cb in callbacks:
            cb.on_train_begin(loop)
            begun.append(cb)
        # Labels of in-memory data were checked whole above; streamed batches are
        # checked as they are read ahead (on one process: fit checks what a data-parallel
        # step takes). Either way fit need not check them again.
        in_memory = isinstance(source, feed.ArrayBatches)
        check = None if in_memory or model.engine.parallel else _label_check(model)
        checks.trust_labels(model.engine, in_memory or check is not None)
        while prog.epoch < target and not loop.stop:
            epoch, started = prog.epoch, time.perf_counter()
            if lines is not None:
                lines.begin(epoch, len(source), prog.batch)
            saved = prog.data() if callable(prog.data) else prog.data
            batches = source.epoch(epoch, prog.batch, saved)
            ahead = _read_ahead(batches, check)
            while ahead is not None:
                if isinstance(ahead.error, ModelError):
                    where = f"train: epoch {epoch}, batch {prog.batch}"
                    raise ModelError(f"{where}: {ahead.error}") from None
                if ahead.error is not None:
                    raise ahead.error
                inputs_b, targets_b = ahead.batch
                where = f"train: epoch {epoch}, batch {prog.batch}"
                short = _short_batch(model, source, inputs_b)
                if short:
                    raise ShapeError(f"{where}: {short}")
                # the step counts once fit has applied it: a Ctrl-C in fit waits until
                # it is counted, one in the read-ahead or the wait for the loss finds
                # it counted, so the model and its progress agree (resume goes on exactly)
                with deferred_interrupt():
                    try:
                        loss = model.fit(inputs_b, targets_b)  # dispatched: runs in XLA
                    except (ModelError, ShapeError) as e:  # keeps what e kept (a loss's error)
                        raise type(e)(f"{where}: {e}") from e.__cause__
                    position = source.snapshot()  # of this batch, before reading the next
                    prog.step, prog.batch, prog.data = prog.step + 1, prog.batch + 1, position
                ahead = _read_ahead(batches, check)  # while the step runs
                value = float(loss)
                if stop_on_nan and not math.isfinite(value):
                    note = checks.batch_note(inputs_b, targets_b)
                    raise _nan_error(value, prog, callbacks, resume, note)
                # kept in checkpoints (a resumed epoch's mean is whole); weighed by the
                # batch's rows on the host, from its shape: no device sync
                prog.add_loss(value, _rows(inputs_b))
                if lines is not None:
                    lines.step()
                for cb in callbacks:
                    cb.on_step_end(loop, prog.step, value)
                if loop.stop:
                    break
            batches.close()
            if prog.batch < len(source):  # stopped inside the epoch
                break
            mean_loss = prog.mean_loss()
            prog.next_epoch()
            logs = {"loss": mean_loss, **measure()}
            history["epoch"].append(epoch + 1)
            _record(history, logs)
            for cb in callbacks[:adders]:  # first, so the line shows what they add ("lr")
                _epoch_end(cb, loop, epoch, logs)
            _record(history, logs)  # what they added, before the others read loop.history
            if lines is not None:
                lines.end(logs, time.perf_counter() - started)
            for cb in callbacks[adders:]:
                _epoch_end(cb, loop, epoch, logs)
            _record(history, logs)
    finally:
        checks.trust_labels(model.engine, False)
        if lines is not None:
            lines.close()
        _end(begun, loop)
    return history


def _end(callbacks: Sequence[Any], loop: TrainLoop) -> None:
    """Runs every callback's ``on_train_end`` (they close files and checkpoints), each
    even if one before it fails; then raises the first failure."""
    failed: BaseException | None = None
    for cb in callbacks:
        try:
            cb.on_train_end(loop)
        except BaseException as e:  # a Ctrl-C too: the others still close what they hold
            failed = failed or e
    if failed is not None:
        raise failed


def _record(history: dict[str, list[float]], logs: dict[str, Any]) -> None:
    """Appends the epoch's value of each metric of ``logs`` that ``history`` lacks for
    this epoch: what ``train`` measured, then what callbacks added (LearningRate's
    ``lr``), so a callback reading ``loop.history`` sees the epoch's metrics."""
    for key, value in logs.items():
        if len(history.setdefault(key, [])) < len(history["epoch"]):
            history[key].append(value)


def _epoch_end(callback: Any, loop: TrainLoop, epoch: int, logs: dict[str, Any]) -> None:
    """Runs ``callback``'s epoch end; a NumPy or JAX scalar it added to ``logs`` becomes
    a float before the next callback sees it (CSVLogger writes numbers, checkpoint
    metadata is JSON)."""
    callback.on_epoch_end(loop, epoch, logs)
    _as_floats(logs, callback, epoch)


def _as_floats(logs: dict[str, Any], callback: Any, epoch: int) -> None:
    """Turns each value of ``logs`` that is not a Python float (a NumPy or JAX scalar
    ``callback`` wrote) into one, in place; anything but a real scalar is an error."""
    for key, value in logs.items():
        if type(value) is float:
            continue
        scalar = isinstance(value, (int, float, np.generic, np.ndarray, jax.Array))
        array = np.asarray(value) if scalar else None
        if array is None or array.ndim != 0 or array.dtype.kind not in "biuf":
            what = f"{type(value).__name__}" + (
                f" of shape {array.shape} and dtype {array.dtype}" if array is not None else ""
            )
            raise ModelError(
                f"train: after {type(callback).__name__}.on_epoch_end of epoch {epoch + 1}, "
                f"the metric {key!r} is no number but {what}; expected one real number "
                f"(a Python, NumPy or JAX scalar); write e.g. logs[{key!r}] = float(value)"
            )
        logs[key] = float(array)


@dataclasses.dataclass
class _Ahead:
    """The next batch, or the error reading it gave (raised after the step before)."""

    batch: Any = None
    error: BaseException | None = None


def _read_ahead(batches: Any, check: Callable[[Any], None] | None) -> _Ahead | None:
    """The next batch of ``batches`` (``None`` at the end), checked by ``check``.
    ``train`` reads it while the step before runs, so a data pipeline's host work
    overlaps the step instead of adding to it; an error is kept until that step's
    callbacks have run."""
    try:
        batch = next(batches)
        if check is not None:
            check(batch)
        return _Ahead(batch)
    except StopIteration:
        return None
    except Exception as e:  # a DataError naming the batch, a bad label, a failing map
        return _Ahead(error=e)


def _short_batch(model: Any, source: Any, inputs: Any) -> str:
    """The error for a batch of a source that batches itself (``source.batch_size`` is
    None: a batched dataframe, a Grain dataset) whose rows do not divide over the
    data-parallel devices, most likely its short last batch ("" where they divide)."""
    par = model.engine.parallel
    if par is None or source.batch_size is not None or not inputs or not np.ndim(inputs[0]):
        return ""
    procs = processes.spanned(model)
    rows = len(inputs[0]) * procs
    if rows % par.size == 0:
        return ""
    each = f" ({len(inputs[0])} in each of {procs} processes)" if procs > 1 else ""
    return (
        f"the data, which batches itself, gave a batch of {rows} rows{each}, which does "
        f"not divide over the {par.size} devices of mesh axis {par.axis!r}; if it is the "
        "short last batch, drop it with batch(..., drop_remainder=True) (DataFrame.batch "
        f"or Grain's MapDataset.batch), else batch the data in multiples of {par.size} rows"
    )


def _label_check(model: Any) -> Callable[[Any], None]:
    """fit's check of a streamed batch's labels, run where ``train`` reads it."""
    engine = model.engine

    def check(batch: Any) -> None:
        inputs, targets = batch
        checks.targets(engine, engine._check_inputs(inputs), targets, "fit", force=True)

    return check


def _restore(resume: Any, model: Any) -> Any:
    """Restores the newest checkpoint of ``resume`` into ``model``; returns its metadata
    (None when there is none yet)."""
    from fnnc.io import Checkpoints, ShardedCheckpoints

    if isinstance(resume, (str, os.PathLike)):  # a directory is a sharded checkpoint
        kind = ShardedCheckpoints if os.path.isdir(resume) else Checkpoints
        with kind(resume) as ckpt:
            if ckpt.latest is not None:
                return ckpt.restore_into(model).metadata
    elif isinstance(resume, (Checkpoints, ShardedCheckpoints)):
        if resume.latest is not None:
            return resume.restore_into(model).metadata
    else:
        raise ModelError(
            f"train: resume= takes a checkpoint path, a fnnc.io.Checkpoints or a "
            f"fnnc.io.ShardedCheckpoints, got {type(resume).__name__}"
        )


def _nan_error(
    value: float, prog: Any, callbacks: Sequence[Any], resume: Any, note: str = ""
) -> NumericsError:
    where = last_good_note(callbacks)
    return NumericsError(
        f"train: the loss is {value} at step {prog.step} (epoch {prog.epoch}, batch "
        f"{prog.batch}); the weights it updated are not finite, so training stopped.{note} "
        f"{where}, then lower the learning rate (e.g. an optax schedule) or check the data; "
        "stop_on_nan=False trains on regardless"
    )


# -- metrics (fnnc.models.metrics) ----------------------------------------------------
def accuracy(outputs: Any, targets: Any) -> float:
    """Top-1 accuracy of ``outputs`` (logits) against integer labels, or one-hot or soft
    targets (mixup) of the outputs' shape, whose argmax is the label."""
    return metrics_.Accuracy()(None, [outputs], [targets])


def _rows(inputs: list[Any]) -> int:
    """The rows (samples) of a batch: its first input's leading size (1 for a scalar)."""
    shape = np.shape(inputs[0]) if inputs else ()
    return int(shape[0]) if shape else 1


def loss_value(model: Any, outputs: list[Any], targets: list[Any]) -> float:
    """The compiled loss of ``outputs`` against ``targets`` (a batch mean), run eagerly."""
    return metrics_.MeanLoss()(model, outputs, targets)


def _check_default_columns(model: Any, source: Any) -> None:
    """A dataframe read with the default columns (the last the target, the others the
    inputs) whose inputs do not fit the model: say which columns were taken and how to
    name them, before a step fails with a bare count."""
    want = len(model.engine.input_specs)
    if not want or len(source.inputs) == want:
        return
    raise ModelError(
        f"train: the dataframe has the columns {list(source.frame.columns)}; by default the last, "
        f"{source.targets}, is the target and the others, {source.inputs}, the model's "
        f"inputs, but the model takes {want} input(s). Name them: train(df, "
        f"inputs=[...], targets=[...])"
    )


def _check_args(epochs: Any, data: Any, validation: Any, inputs: Any, targets: Any) -> None:
    """Refuses what ``train`` would silently ignore: epochs below 0 (no epoch ran) and
    ``inputs=``/``targets=`` column names when no dataframe has columns to name."""
    if not is_int(epochs) or epochs < 0:
        raise ModelError(
            f"train: epochs={epochs!r} ({type(epochs).__name__}); expected an int >= 0, the "
            "epochs to run (with resume=, the epoch to run up to), e.g. epochs=10"
        )
    from fnnc.data import DataFrame

    if (inputs is not None or targets is not None) and not any(
        isinstance(d, DataFrame) for d in (data, validation)
    ):
        named = (
            "inputs=" if targets is None else "targets=" if inputs is None else "inputs=/targets="
        )
        raise ModelError(
            f"train: {named} name the columns of a fnnc.data.DataFrame, but the data is "
            f"{type(data).__name__}, which has no columns; pass the arrays themselves as "
            "data=(inputs, targets) and drop " + named
        )


def _shuffle_seed(seed: Any) -> int | None:
    """``train``'s ``seed`` as a Python int >= 0 (or None): the model keeps it in its
    progress, which checkpoints store as JSON, and every epoch's shuffle reads it."""
    if seed is None or (is_int(seed) and seed >= 0):
        return None if seed is None else int(seed)
    raise ModelError(
        f"train: seed={seed!r} ({type(seed).__name__}); expected an int >= 0, the shuffling "
        "seed (epoch e is shuffled from (seed, e)), e.g. seed=0"
    )


def _metrics(
    model: Any, metrics: Any, validation: Any, columns: Any, data: Any
) -> Callable[[], dict]:
    """A function giving the epoch's validation metrics (``val_loss``, ``val_accuracy``
    for a classification loss or when asked, and each other metric ``val_<name>``) over
    ``validation`` (arrays, a dataframe with ``columns = (inputs, targets)`` names, or a
    Grain dataset: :mod:`fnnc.models.validation`), measured as ``Model.score`` does.
    Without ``validation``, the ``metrics`` asked for are measured on the training
    ``data`` instead, as ``accuracy`` / ``<name>``."""
    found = metrics_.resolve(model, metrics, "train")
    prefix = "val_"
    if validation is None:
        if not metrics:
            return dict
        # no validation set: the metrics asked for are measured on the training data,
        # in test mode at the end of each epoch (one more pass over it), under their
        # own names; "loss" stays the epoch's running mean of the training steps
        validation, prefix = data, ""
        found.pop("loss")
    read = validation_batches(validation, inputs=columns[0], targets=columns[1])

    def measure() -> dict[str, float]:
        outs, val_targets = outputs_and_targets(model, read)
        values = metrics_.measure(model, outs, val_targets, found)
        return {f"{prefix}{name}": value for name, value in values.items()}

    return measure


def predict(model: Any, inputs: Any, *, batch_size: int = 256, all_outputs: bool = False) -> Any:
    """The model's outputs (test mode) over all samples of ``inputs`` in batches: one
    array for a one-output model, else a list (``all_outputs``: always a list)."""
    inputs = [np.asarray(x) for x in sample_sets.as_list(inputs)]
    procs = processes.spanned(model)
    if procs > 1:  # every process must run as many batches of as many rows
        processes.agree(
            [len(inputs[0]) if inputs and np.ndim(inputs[0]) else 0], "predict",
            "the number of rows to predict",
            "every process must pass as many rows (its share of the set: "
            "DataFrame.shard() or equal slices of the arrays)",
        )  # fmt: skip
    multiple = sample_sets.row_multiple(model)
    run = lambda xs: sample_sets.evaluate_rows(model, xs, multiple)
    outs = sample_sets.in_batches(run, inputs, batch_size, procs)
    return outs if all_outputs or len(outs) != 1 else outs[0]
