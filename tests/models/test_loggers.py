"""Logging callbacks: TensorBoard event files read back with TensorBoard's own reader,
CSV rows, the learning rate of an Optax schedule, and the history plot."""

from __future__ import annotations

import csv

import numpy as np
import optax
import pytest

from fnnc.errors import ModelError
from fnnc.models import (
    CSVLogger,
    Dense,
    EarlyStopping,
    Input,
    LearningRate,
    Model,
    PlotHistory,
    TensorBoard,
    minimizers,
)
from fnnc.models.callbacks import Callback

RNG = np.random.default_rng(2)
X = RNG.standard_normal((24, 4)).astype(np.float32)
Y = (X[:, 0] + X[:, 1] > 0).astype(np.int32)
SCHEDULE = optax.linear_schedule(0.2, 0.0, transition_steps=6)


def model() -> Model:
    x = Input()
    m = Model(x, Dense(2, name="fc")(x))
    m.compile(X[:8], loss="softmax_crossentropy", minimizer=optax.sgd(SCHEDULE))
    return m


class StepLosses(Callback):
    def __init__(self):
        self.losses = []

    def on_step_end(self, loop, step, loss):
        self.losses.append((step, loss))


def test_tensorboard_log_holds_the_history_read_back_by_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = StepLosses()
    callbacks = [LearningRate(SCHEDULE), TensorBoard(tmp_path / "tb", per_step=True), steps]
    history = model().train(
        (X, Y), epochs=3, batch_size=8, validation=(X, Y), callbacks=callbacks, verbose=False
    )
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = events.Tags()["tensors"]
    assert sorted(tags) == ["loss", "lr", "step/loss", "val_accuracy", "val_loss"]

    def read(tag):
        got = events.Tensors(tag)
        return [e.step for e in got], [float(e.tensor_proto.float_val[0]) for e in got]

    for key in ("loss", "val_loss", "val_accuracy", "lr"):
        epochs, values = read(key)
        assert epochs == history["epoch"] == [1, 2, 3]
        assert values == [float(np.float32(v)) for v in history[key]]  # TensorBoard's float32
    # the rate of the last update of each epoch (steps 3, 6, 9 use counts 2, 5, 8)
    assert history["lr"] == pytest.approx([0.2 * 4 / 6, 0.2 * 1 / 6, 0.0])
    step_numbers, step_values = read("step/loss")
    assert step_numbers == [s for s, _ in steps.losses] == list(range(1, 10))
    assert step_values == [float(np.float32(v)) for _, v in steps.losses]
    np.testing.assert_allclose(
        np.mean(np.reshape([v for _, v in steps.losses], (3, 3)), 1), history["loss"], rtol=1e-6
    )


def test_csv_rows_read_back_exactly_and_append_after_a_resume(tmp_path):
    path = tmp_path / "log.csv"
    m = model()
    first = m.train((X, Y), epochs=2, batch_size=8, validation=(X, Y),
                    callbacks=[CSVLogger(path)], verbose=False)  # fmt: skip
    later = m.train((X, Y), epochs=1, batch_size=8, validation=(X, Y),
                    callbacks=[CSVLogger(path, append=True)], verbose=False)  # fmt: skip
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["epoch", "loss", "val_loss", "val_accuracy"]
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
    for key in ("loss", "val_loss", "val_accuracy"):
        assert [float(r[key]) for r in rows] == first[key] + later[key]
    with pytest.raises(ModelError, match=r"CSVLogger: .* adds \['lr'\]"):
        m.train((X, Y), epochs=1, batch_size=8, verbose=False,
                callbacks=[LearningRate(SCHEDULE), CSVLogger(path, append=True)])  # fmt: skip


def test_history_plot_draws_every_metric_to_a_png(tmp_path):
    from matplotlib.image import imread

    from fnnc.models.plots import plot_history

    path = tmp_path / "history.png"
    m = model()
    history = m.train((X, Y), epochs=3, batch_size=8, validation=(X, Y),
                      callbacks=[PlotHistory(path)], verbose=False)  # fmt: skip
    image = imread(path)
    assert image.shape[:2] == (320, 800) and image.std() > 0.05  # two panels drawn
    fig = plot_history(history)
    loss, acc = fig.axes
    assert [line.get_label() for line in loss.lines] == ["loss", "val_loss"]
    assert [line.get_label() for line in acc.lines] == ["val_accuracy"]
    for line in [*loss.lines, *acc.lines]:
        assert list(line.get_xdata()) == [1, 2, 3]
        assert list(line.get_ydata()) == history[line.get_label()]
    with pytest.raises(ModelError, match="no metrics to draw"):
        plot_history({"epoch": []})


@pytest.mark.parametrize("k", [1, 2, 3])
def test_learning_rate_is_the_rate_of_the_last_update_under_accumulation(k):
    """With gradient accumulation the schedule advances once per k steps: after 6 steps
    the last update was update 6 // k, made at SCHEDULE(6 // k - 1), as optax.MultiSteps'
    inner step count says; a fixed rate is logged as given."""
    x = Input()
    m = Model(x, Dense(2, name="fc")(x))
    accumulated = minimizers.with_gradient_accumulation(minimizers.sgd(SCHEDULE), k)
    m.compile(X[:8], loss="softmax_crossentropy", minimizer=accumulated)
    h = m.train((X, Y), epochs=2, batch_size=8, callbacks=[LearningRate(SCHEDULE)], verbose=False)
    assert m.train_progress.step == 6
    assert h["lr"] == [float(SCHEDULE(3 // k - 1)), float(SCHEDULE(6 // k - 1))]
    multi = optax.MultiSteps(optax.sgd(SCHEDULE), k)
    m.compile(X[:8], loss="softmax_crossentropy", minimizer=multi.gradient_transformation())
    h = m.train((X, Y), epochs=1, batch_size=8, callbacks=[LearningRate(SCHEDULE)], verbose=False)
    assert h["lr"] == [float(SCHEDULE(3 // k - 1))]
    h = m.train((X, Y), epochs=1, batch_size=8, callbacks=[LearningRate(0.5)], verbose=False)
    assert h["lr"] == [0.5]


def test_csv_logger_into_a_missing_folder_names_the_path(tmp_path):
    """The FileNotFoundError of open() at train begin is a ModelError naming the file and
    its missing folder; made, the same logger writes the header and one row per epoch."""
    path = tmp_path / "logs" / "log.csv"
    m = model()
    with pytest.raises(ModelError, match=r"CSVLogger: cannot open .*log\.csv.* does not exist"):
        m.train((X, Y), epochs=1, batch_size=8, callbacks=[CSVLogger(path)], verbose=False)
    (tmp_path / "logs").mkdir()
    history = m.train((X, Y), epochs=1, batch_size=8, callbacks=[CSVLogger(path)], verbose=False)
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["epoch", "loss"] and float(rows[1][1]) == history["loss"][0]


class AddsSteps:
    """A callback that is no Callback subclass, adding a metric (the flag says so)."""

    adds_metrics = True

    def on_train_begin(self, loop):
        pass

    def on_step_end(self, loop, step, loss):
        pass

    def on_epoch_end(self, loop, epoch, logs):
        logs["steps"] = float(loop.progress.step)

    def on_train_end(self, loop):
        pass


@pytest.mark.parametrize("adders_first", [True, False])
def test_loggers_see_added_metrics_whatever_the_callbacks_order(tmp_path, adders_first):
    """LearningRate (and any callback flagged adds_metrics) runs before the loggers and
    EarlyStopping, given first or last: the CSV, the plot's history and TensorBoard all
    hold lr, each epoch's SCHEDULE(3 * epoch - 1) (3 steps an epoch, closed form)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    csv_path, plot = tmp_path / "log.csv", PlotHistory(tmp_path / "h.png")
    stop = EarlyStopping(monitor="lr", patience=5)
    adders = [LearningRate(SCHEDULE), AddsSteps()]
    others = [CSVLogger(csv_path), TensorBoard(tmp_path / "tb"), plot, stop]
    callbacks = adders + others if adders_first else others + adders
    history = model().train((X, Y), epochs=2, batch_size=8, callbacks=callbacks, verbose=False)
    want_lr = [0.2 * (1 - 2 / 6), 0.2 * (1 - 5 / 6)]  # linear 0.2 -> 0 over 6 updates
    assert history["lr"] == pytest.approx(want_lr) and history["steps"] == [3.0, 6.0]
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["epoch", "loss", "lr", "steps"]
    assert [float(r["lr"]) for r in rows] == history["lr"]
    assert [float(r["steps"]) for r in rows] == [3.0, 6.0]
    assert plot.history["lr"] == history["lr"] and plot.history["steps"] == [3.0, 6.0]
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert sorted(events.Tags()["tensors"]) == ["loss", "lr", "steps"]
    assert stop.best == pytest.approx(want_lr[1])  # EarlyStopping saw lr too


class NormAndMax(Callback):
    """Adds two metrics as they come out of NumPy and JAX: np.float32 and a 0-d Array."""

    adds_metrics = True

    def on_epoch_end(self, loop, epoch, logs):
        import jax.numpy as jnp

        w = loop.model.parameters()["t-fc-0-0"]
        logs["wnorm"] = np.linalg.norm(np.asarray(w))
        logs["wmax"] = jnp.max(w)


def test_numpy_and_jax_metric_values_reach_history_csv_and_checkpoints_as_floats(tmp_path):
    """The history, the CSV and the per-epoch checkpoint metadata all hold Python floats,
    equal to NumPy's norm and max of the weights after each epoch (the oracle)."""
    from fnnc.io import Checkpoints
    from fnnc.models import CheckpointEvery

    csv_path, ckpt_path = tmp_path / "log.csv", tmp_path / "run.ckpt"
    seen = []

    class Weights(Callback):
        def on_epoch_end(self, loop, epoch, logs):
            seen.append(np.asarray(loop.model.parameters()["t-fc-0-0"]))
            assert type(logs["wnorm"]) is float and type(logs["wmax"]) is float

    callbacks = [Weights(), CSVLogger(csv_path), CheckpointEvery(ckpt_path, per_epoch=True),
                 NormAndMax(), EarlyStopping("wmax", patience=5)]  # fmt: skip
    history = model().train((X, Y), epochs=2, batch_size=8, callbacks=callbacks, verbose=False)
    want_norm = [float(np.linalg.norm(w)) for w in seen]
    want_max = [float(np.max(w)) for w in seen]
    assert history["wnorm"] == want_norm and history["wmax"] == want_max
    assert all(type(v) is float for k in ("wnorm", "wmax") for v in history[k])
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["wnorm"]) for r in rows] == want_norm
    assert [float(r["wmax"]) for r in rows] == want_max
    with Checkpoints(ckpt_path) as ckpt:
        meta = ckpt.restore(ckpt.latest).metadata
    assert meta["wnorm"] == want_norm[-1] and meta["wmax"] == want_max[-1]


def test_a_metric_that_is_no_scalar_names_the_callback_and_the_metric():
    class Vector(Callback):
        adds_metrics = True

        def on_epoch_end(self, loop, epoch, logs):
            logs["w"] = np.zeros(3, np.float32)

    with pytest.raises(ModelError, match=r"after Vector.on_epoch_end of epoch 1, the metric 'w' "
                       r"is no number but ndarray of shape \(3,\)"):  # fmt: skip
        model().train((X, Y), epochs=1, batch_size=8, callbacks=[Vector()], verbose=False)


@pytest.mark.parametrize("adders_first", [True, False])
def test_the_epoch_line_shows_the_metrics_callbacks_add(capsys, adders_first):
    """The plain epoch line (progress=False) holds lr and steps, each epoch's
    SCHEDULE(3 * epoch - 1) and 3 * epoch, formatted as format_logs does."""
    adders = [LearningRate(SCHEDULE), AddsSteps()]
    callbacks = [*adders, StepLosses()] if adders_first else [StepLosses(), *adders]
    history = model().train((X, Y), epochs=2, batch_size=8, callbacks=callbacks, progress=False)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    for epoch, line in enumerate(lines):
        lr, loss = 0.2 * (1 - (3 * epoch + 2) / 6), history["loss"][epoch]
        want = f"epoch {epoch + 1}/2: loss {loss:.4f}, lr {lr:.4f}, steps {3.0 * (epoch + 1):.4f}"
        assert line.startswith(want + " ("), line


def test_plot_history_pads_a_metric_missing_from_later_calls_with_nan(tmp_path):
    """A call with validation= then one without: the plot's history has val_loss for
    epoch 1 and NaN for epoch 2 (and lr, added only by the second, NaN then a value),
    each as the two calls' histories say."""
    path = tmp_path / "h.png"
    plot = PlotHistory(path)
    m = model()
    first = m.train((X, Y), epochs=1, batch_size=8, validation=(X, Y), callbacks=[plot],
                    verbose=False)  # fmt: skip
    second = m.train((X, Y), epochs=1, batch_size=8, verbose=False,
                     callbacks=[plot, LearningRate(SCHEDULE)])  # fmt: skip
    h = plot.history
    assert h["epoch"] == [1, 2] and h["loss"] == first["loss"] + second["loss"]
    assert h["val_loss"][0] == first["val_loss"][0] and np.isnan(h["val_loss"][1])
    assert h["val_accuracy"][0] == first["val_accuracy"][0] and np.isnan(h["val_accuracy"][1])
    assert np.isnan(h["lr"][0]) and h["lr"][1] == second["lr"][0]
    assert path.stat().st_size > 0


class Crash(Exception):
    pass


class CrashAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, loop, step, loss):
        if step == self.step:
            raise Crash(f"simulated crash at step {step}")


def test_csv_append_on_a_resume_drops_the_epochs_past_the_checkpoint(tmp_path):
    """A run crashing at step 8 (3 steps an epoch, epoch 2 logged) saved last at step 5,
    inside epoch 2; resumed with append=True, the log holds epochs 1-4 once each, with
    the losses of an uninterrupted run (the oracle)."""
    from fnnc.models import CheckpointEvery

    path, ckpt = tmp_path / "log.csv", tmp_path / "run.ckpt"
    callbacks = [CSVLogger(path), CheckpointEvery(ckpt, steps=5), CrashAt(8)]
    with pytest.raises(Crash):
        model().train((X, Y), epochs=4, batch_size=8, callbacks=callbacks, verbose=False)
    with open(path, newline="") as f:
        assert [r[0] for r in csv.reader(f)] == ["epoch", "1", "2"]
    resumed = model().train((X, Y), epochs=4, batch_size=8, resume=ckpt, verbose=False,
                            callbacks=[CSVLogger(path, append=True)])  # fmt: skip
    assert resumed["epoch"] == [2, 3, 4]
    whole = model().train((X, Y), epochs=4, batch_size=8, verbose=False)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4]
    assert [float(r["loss"]) for r in rows] == whole["loss"]
