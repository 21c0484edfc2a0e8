"""Audit of issue 27 (docs and the habits users bring) against the issue's own words.

Promises checked here, each from a side the existing tests do not take:

- ``model.summary()``: layers, output shapes, parameter ids, counts and bytes (closed
  forms: ``in*out + out`` per Dense, itemsize per dtype), printed by default and
  returned; non-trainable parameters counted apart; ``from_flax`` models (Flax's own
  shapes as the oracle); a useful ``repr`` for Model, Sequential and ``from_flax``.
- Loss and metrics on a labelled set in one call (``Model.score``), beside NNC's
  ``evaluate``: NumPy oracles for MSE, cross-entropy, accuracy and top-k; the same
  numbers in any batch size and data form; nothing trained; metric objects (``Accuracy``,
  ``TopK``, ``MeanLoss``, ``Metric`` subclasses, plain callables) shared with
  ``train(validation=...)``.
- Logging callbacks: TensorBoard read back with TensorBoard's ``EventAccumulator`` over a
  resumed run; clear errors when the optional extras are missing, which are extras and
  not core dependencies; CSV across a mid-epoch interrupt and resume equal to an
  uninterrupted run; the learning rate of a fixed rate; the history plot as a PNG;
  Keras-style per-epoch lines outside a terminal.
- The per-node profile: ``fnnc.graph.profile`` keeps its trace in ``log_dir``, maps time
  to named nodes and commands; ``Model.profile`` of the forward pass changes nothing.
- The CLI: ``python -m fnnc inspect run.ckpt | head -2`` in a real shell pipe, ``--help``
  of every command without reStructuredText, checkpoint rows in numeric step order.
- The README: every example listed, the suite's time and the quick subset stated, the
  resume demo's schedule still moving in its resumed epoch; the docs site's layout.
"""

from __future__ import annotations

import csv
import math
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import grain
import jax
import numpy as np
import optax
import pytest

from fnnc.data import DataFrame
from fnnc.errors import GraphError, ModelError
from fnnc.models import (
    CheckpointEvery,
    CSVLogger,
    Dense,
    Input,
    LearningRate,
    Model,
    PlotHistory,
    ReLU,
    Sequential,
    TensorBoard,
)
from fnnc.models.callbacks import Callback
from fnnc.models.metrics import Accuracy, MeanLoss, Metric, TopK
from tests.helpers import subprocess_env

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(27)
X = RNG.standard_normal((24, 3)).astype(np.float32)
LABELS = (np.argmax(X @ RNG.standard_normal((3, 5)), axis=1)).astype(np.int32)
TARGETS = RNG.standard_normal((24, 2)).astype(np.float32)


def mlp(loss: str = "softmax_crossentropy", out: int = 5, lr: Any = 0.05, name: str = ""):
    """A compiled 3 -> 4 -> out MLP (Adam at rate or Optax schedule ``lr``)."""
    x = Input()
    model = Model(x, Dense(out, name="out")(ReLU()(Dense(4, name="h")(x))), name=name)
    model.compile(X[:8], loss=loss, minimizer=optax.adam(lr))
    return model


def parameters_of(model: Model) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in model.parameters().items()}


def np_softmax_crossentropy(logits: np.ndarray, labels: np.ndarray) -> float:
    z = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-np.mean(logp[np.arange(len(labels)), labels]))


def np_top_k(logits: np.ndarray, labels: np.ndarray, k: int) -> float:
    top = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    return float(np.mean((top == labels[:, None]).any(-1)))


class StopAt(Callback):
    """Stops training after step ``at`` (a kill mid-epoch, without the kill)."""

    def __init__(self, at: int):
        self.at = at

    def on_step_end(self, loop, step, loss):
        loop.stop = step == self.at


# ---------------------------------------------------------------- summary and repr


def summary_rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def is_param_row(row: list[str]) -> bool:
    """A row (or continuation row) naming a parameter: id, type, count, bytes last."""
    return len(row) >= 4 and row[-4].startswith("t-")


def test_summary_prints_by_default_and_returns_the_table_with_closed_form_counts(capsys):
    """summary() with no print_fn prints to stdout and returns that text; counts and
    bytes are in*out + out per Dense and 4 bytes per float32."""
    x = Input()
    model = Model(x, Dense(7, name="b")(ReLU()(Dense(5, name="a")(x))), name="net")
    text = model.summary(np.zeros((6, 3), np.float32))
    assert capsys.readouterr().out == text + "\n"
    rows = summary_rows(text)
    assert rows[0] == ["Model", "'net':", "1", "input,", "1", "output"]
    body = rows[2:-1]
    layers = [r[:2] for r in body if not r[0].startswith("t-")]
    assert layers == [
        ["input[0]", "f32[6,3]"],
        ["Dense('a')", "f32[6,5]"],
        ["relu", "f32[6,5]"],
        ["Dense('b')", "f32[6,7]"],
    ]
    params = {r[-4]: (r[-3], int(r[-2]), int(r[-1])) for r in body if is_param_row(r)}
    assert sorted(params.values()) == sorted(
        [
            ("f32[5,3]", 15, 60),
            ("f32[5]", 5, 20),
            ("f32[7,5]", 35, 140),
            ("f32[7]", 7, 28),
        ]
    )
    total = 3 * 5 + 5 + 5 * 7 + 7
    assert rows[-1][:2] == ["total:", str(total)] and rows[-1][-2:] == [str(4 * total), "bytes"]


def test_summary_ids_match_the_compiled_parameters():
    """Every parameter id the summary names is one of model.parameters(), with its size."""
    model = mlp(name="m")
    text = model.summary(print_fn=None)
    params = model.parameters()
    listed = {r[-4]: int(r[-2]) for r in summary_rows(text)[2:-1] if is_param_row(r)}
    assert listed == {k: int(np.asarray(v).size) for k, v in params.items()}


def test_summary_bytes_follow_the_parameter_dtype():
    """Parameters made in float16 count 2 bytes each."""
    x = Input()
    model = Model(x, Dense(4, name="d")(x))
    text = model.summary(np.zeros((2, 3), np.float16), print_fn=None)
    rows = summary_rows(text)
    params = {r[-3]: (int(r[-2]), int(r[-1])) for r in rows[2:-1] if is_param_row(r)}
    assert params == {"f16[4,3]": (12, 24), "f16[4]": (4, 8)}
    assert rows[-1][-2:] == [str(2 * 16), "bytes"]


def test_summary_counts_non_trainable_parameters_apart():
    """A frozen layer (is_trainable=False) is counted as non-trainable in the totals."""
    x = Input()
    model = Model(x, Dense(2, name="top")(Dense(4, name="frozen", is_trainable=False)(x)))
    model.compile(X[:8], loss="mse", minimizer=optax.sgd(0.1))
    last = model.summary(print_fn=None).splitlines()[-1]
    frozen, top = 3 * 4 + 4, 4 * 2 + 2
    assert f"{frozen + top} parameters" in last
    assert f"{top} trainable" in last and f"{frozen} non-trainable" in last


def test_summary_and_repr_of_a_from_flax_model_follow_flax_shapes():
    """A from_flax nnx.Linear's summary lists its kernel and bias with Flax's sizes."""
    from flax import nnx

    module = nnx.Linear(3, 6, rngs=nnx.Rngs(0))
    model = Model.from_flax(module, name="lin")
    text = model.summary(np.zeros((5, 3), np.float32), print_fn=None)  # not compiled
    rows = summary_rows(text)
    assert rows[3][:2] == ["FlaxLayer('lin')", "f32[5,6]"]
    sizes = sorted(int(r[-2]) for r in rows[3:-1])
    assert sizes == sorted([module.kernel.get_value().size, module.bias.get_value().size])
    assert rows[-1][:2] == ["total:", str(3 * 6 + 6)]
    assert "object at 0x" not in repr(model) and "'lin'" in repr(model)
    model.compile(np.zeros((5, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
    assert "24 parameters" in repr(model)
    compiled = model.summary(print_fn=None)
    assert "(kernel)" in compiled and "(bias)" in compiled  # Flax paths beside the ids


def test_summary_before_compile_changes_no_ids_and_no_initial_weights():
    """Calling summary(inputs) on an uncompiled model (twice) leaves the ids and initial
    weights compile then makes exactly those of a model never summarised."""

    def make() -> Model:
        x = Input()
        return Model(x, Dense(2, name="out")(ReLU()(Dense(4, name="h")(x))), name="s")

    looked = make()
    first = looked.summary(X[:8], print_fn=None)
    assert looked.summary(X[:8], print_fn=None) == first
    looked.compile(X[:8], loss="mse", minimizer=optax.sgd(0.1))
    plain = make()
    plain.compile(X[:8], loss="mse", minimizer=optax.sgd(0.1))
    a, b = parameters_of(looked), parameters_of(plain)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert looked.summary(print_fn=None) == first


def test_repr_of_sequential_is_useful_before_and_after_compile():
    """repr(Sequential) is not <... object at 0x...>; compiled, it counts parameters."""
    model = Sequential([Dense(4, name="a"), ReLU(), Dense(3, name="b")])
    before = repr(model)
    assert "object at 0x" not in before and "not compiled" in before
    model.compile(X[:8], loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    after = repr(model)
    assert f"{3 * 4 + 4 + 4 * 3 + 3} parameters" in after
    assert "f32[8,3]" in after and "softmax_crossentropy" in after


# ---------------------------------------------------------------- score and metrics


def test_score_of_an_mse_model_is_numpys_mean_squared_error_and_adds_no_accuracy():
    """score(x, y) on an MSE model: {"loss": mean squared error} (no classification
    accuracy), equal to the loss train logs on the same data at learning rate 0."""
    model = mlp(loss="mse", out=2, lr=0.0)
    got = model.score(X, TARGETS)
    assert list(got) == ["loss"]
    err = model.predict(X).astype(np.float64) - TARGETS
    np.testing.assert_allclose(got["loss"], np.mean(err**2), rtol=1e-5)
    history = model.train((X, TARGETS), epochs=1, batch_size=8, validation=(X, TARGETS),
                          verbose=False)  # fmt: skip
    assert history["val_loss"] == [pytest.approx(got["loss"], rel=1e-6)]
    assert history["loss"] == [pytest.approx(got["loss"], rel=1e-5)]  # nothing moved


def test_score_is_the_same_in_every_batch_size_and_data_form():
    """score(x, y), score((x, y)), a DataFrame (columns picked by name) and a Grain
    dataset of batches give the same numbers, in any batch size."""
    model = mlp()
    first = model.score(X, LABELS)
    logits = model.predict(X)
    np.testing.assert_allclose(first["loss"], np_softmax_crossentropy(logits, LABELS), rtol=1e-5)
    assert first["accuracy"] == float(np.mean(np.argmax(logits, -1) == LABELS))
    for batch_size in (1, 5, 7, 24, 1000):
        assert model.score((X, LABELS), batch_size=batch_size) == pytest.approx(first, rel=1e-6)
    frame = DataFrame.from_arrays(x=X, y=LABELS)
    assert model.score(frame, batch_size=5) == pytest.approx(first, rel=1e-6)
    noisy = DataFrame.from_arrays(a=X, other=TARGETS, y=LABELS)
    picked = model.score(noisy, inputs=["a"], targets=["y"])
    assert picked == pytest.approx(first, rel=1e-6)
    batches = grain.MapDataset.source(list(range(4))).map(
        lambda i: (X[6 * i : 6 * i + 6], LABELS[6 * i : 6 * i + 6])
    )
    assert model.score(batches) == pytest.approx(first, rel=1e-6)


def test_score_trains_nothing_and_evaluate_stays_the_forward_pass():
    """score changes no parameter and no training progress; evaluate(x) is still the
    forward pass (outputs, not a dict)."""
    model = mlp()
    model.train((X, LABELS), epochs=1, batch_size=8, verbose=False)
    before, step = parameters_of(model), model.train_progress.step
    model.score(X, LABELS, metrics=["top_2_accuracy"])
    after = parameters_of(model)
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert model.train_progress.step == step
    out = np.asarray(model.evaluate(X[:8]))
    assert out.shape == (8, 5)


def test_top_k_metric_objects_and_names_match_numpy_for_every_k():
    """TopK(k) and "top_<k>_accuracy" equal NumPy's top-k hit rate; TopK(1) is Accuracy."""
    model = mlp()
    logits = model.predict(X)
    objects = model.score(X, LABELS, metrics=[TopK(k) for k in (2, 3, 4, 5)])
    named = model.score(X, LABELS, metrics=[f"top_{k}_accuracy" for k in (2, 3, 4, 5)])
    for k in (2, 3, 4, 5):
        assert (
            objects[f"top_{k}_accuracy"]
            == named[f"top_{k}_accuracy"]
            == np_top_k(logits, LABELS, k)
        )
    assert objects["top_5_accuracy"] == 1.0  # 5 classes
    one = model.score(X, LABELS, metrics=[TopK(1, name="top1"), Accuracy(name="acc")])
    assert one["top1"] == one["acc"] == np_top_k(logits, LABELS, 1)


def test_metric_objects_called_directly_match_numpy():
    """Accuracy, TopK and MeanLoss are usable objects: called on outputs and targets."""
    model = mlp()
    logits = model.predict(X)
    assert Accuracy()(model, [logits], [LABELS]) == float(np.mean(logits.argmax(-1) == LABELS))
    assert TopK(3)(model, [logits], [LABELS]) == np_top_k(logits, LABELS, 3)
    np.testing.assert_allclose(
        MeanLoss()(model, [logits], [LABELS]), np_softmax_crossentropy(logits, LABELS), rtol=1e-5
    )
    assert (Accuracy().name, TopK(3).name, MeanLoss().name) == (
        "accuracy",
        "top_3_accuracy",
        "loss",
    )


def mean_abs_logit(outputs, targets):
    return float(np.mean(np.abs(outputs)))


class Confident(Metric):
    """The fraction of samples whose top softmax probability exceeds one half."""

    name = "confident"

    def __call__(self, model, outputs, targets):
        z = np.exp(outputs[0] - outputs[0].max(-1, keepdims=True))
        return float(np.mean(z.max(-1) / z.sum(-1) > 0.5))


def test_own_metrics_are_shared_between_score_and_train_validation():
    """A named callable and a Metric subclass give train's val_<name> and score's <name>
    the same values; a callable is keyed by its function name."""
    model = mlp()
    metrics = [mean_abs_logit, Confident(), MeanLoss()]
    history = model.train((X, LABELS), epochs=2, batch_size=8, validation=(X, LABELS),
                          metrics=metrics, verbose=False)  # fmt: skip
    got = model.score(X, LABELS, metrics=metrics)
    assert {"loss", "mean_abs_logit", "confident"} <= set(got)
    logits = model.predict(X)
    assert got["mean_abs_logit"] == pytest.approx(float(np.mean(np.abs(logits))), rel=1e-6)
    z = np.exp(logits - logits.max(-1, keepdims=True))
    assert got["confident"] == float(np.mean(z.max(-1) / z.sum(-1) > 0.5))
    for name, value in got.items():
        assert history[f"val_{name}"][-1] == pytest.approx(value, rel=1e-6), name


def test_score_with_an_unknown_metric_name_says_which_names_exist():
    """A misspelt metric name is a ModelError that lists the known names."""
    model = mlp()
    with pytest.raises(ModelError, match=r"unknown metric 'accuracy_top3'.*'accuracy'"):
        model.score(X, LABELS, metrics=["accuracy_top3"])


def test_score_errors_name_score_not_train_validation():
    """A data mistake in score(x, y) is reported as score's, not as train's validation."""
    model = mlp()
    with pytest.raises(ModelError) as count:
        model.score(X, LABELS[:-1])
    with pytest.raises(ModelError) as label:
        model.score(X, np.full_like(LABELS, 9))
    for err in (count, label):
        text = str(err.value)
        assert "score" in text and "train" not in text, text


# ---------------------------------------------------------------- logging callbacks


class StepLosses(Callback):
    """Records (step, loss) of every training step."""

    def __init__(self):
        self.losses: list[tuple[int, float]] = []

    def on_step_end(self, loop, step, loss):
        self.losses.append((step, loss))


def test_logs_of_an_interrupted_and_resumed_run_hold_the_uninterrupted_history(tmp_path):
    """A run stopped inside epoch 2 and resumed (fresh model, resume=) into the same
    TensorBoard folder (per_step) and CSVLogger(append=True) file, with LearningRate of
    its Optax schedule: TensorBoard's EventAccumulator reads epochs 1..3 and steps 1..9,
    the CSV one row per epoch, all with an uninterrupted run's values (the resumed
    epoch's loss averages all its batches, not only the resumed ones)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    schedule = optax.linear_schedule(0.1, 0.0, transition_steps=9)
    data = dict(epochs=3, batch_size=8, validation=(X, LABELS), verbose=False)
    steps = StepLosses()
    whole = mlp(lr=schedule).train((X, LABELS), **data, callbacks=[LearningRate(schedule), steps])
    ckpt, logs, log = str(tmp_path / "run.ckpt"), tmp_path / "tb", tmp_path / "log.csv"

    def loggers():
        return [
            LearningRate(schedule),
            TensorBoard(logs, per_step=True),
            CSVLogger(log, append=True),
        ]

    first = mlp(lr=schedule).train(
        (X, LABELS), **data, callbacks=[CheckpointEvery(ckpt, steps=1), *loggers(), StopAt(5)]
    )
    assert first["epoch"] == [1]
    resumed = mlp(lr=schedule).train((X, LABELS), **data, resume=ckpt, callbacks=loggers())
    assert resumed["epoch"] == [2, 3]
    for key in ("loss", "val_loss", "val_accuracy", "lr"):
        assert resumed[key] == whole[key][1:], key
    # the rate of each epoch's last update: steps 3, 6, 9 use counts 2, 5, 8
    assert whole["lr"] == pytest.approx([0.1 * 7 / 9, 0.1 * 4 / 9, 0.1 * 1 / 9], rel=1e-6)
    events = EventAccumulator(str(logs))
    events.Reload()
    for tag in ("loss", "val_loss", "val_accuracy", "lr"):
        read = events.Tensors(tag)
        assert [e.step for e in read] == [1, 2, 3], tag
        values = [float(e.tensor_proto.float_val[0]) for e in read]
        assert values == [float(np.float32(v)) for v in whole[tag]], tag
    read = events.Tensors("step/loss")
    assert [e.step for e in read] == [s for s, _ in steps.losses] == list(range(1, 10))
    assert [float(e.tensor_proto.float_val[0]) for e in read] == [
        float(np.float32(v)) for _, v in steps.losses
    ]
    with open(log, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["epoch", "loss", "val_loss", "val_accuracy", "lr"]
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
    for key in ("loss", "val_loss", "val_accuracy", "lr"):
        assert [float(r[key]) for r in rows] == whole[key], key


def test_tensorboard_without_its_package_names_the_extra(monkeypatch, tmp_path):
    """TensorBoard is an optional extra: without the package, train raises a ModelError
    that says how to install it."""
    monkeypatch.setitem(sys.modules, "tensorboard.summary", None)
    model = mlp()
    with pytest.raises(ModelError, match=r"fnnc\[tensorboard\]"):
        model.train((X, LABELS), epochs=1, batch_size=8, verbose=False,
                    callbacks=[TensorBoard(tmp_path / "tb")])  # fmt: skip


def test_plot_history_without_matplotlib_names_the_extra(monkeypatch, tmp_path):
    """PlotHistory needs matplotlib, an optional extra: without it, a ModelError says so."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    model = mlp()
    with pytest.raises(ModelError, match=r"fnnc\[plot\]"):
        model.train((X, LABELS), epochs=1, batch_size=8, verbose=False,
                    callbacks=[PlotHistory(tmp_path / "h.png")])  # fmt: skip


def test_loggers_packages_are_optional_extras_and_not_imported_by_fnnc():
    """tensorboard and matplotlib are not core dependencies but optional extras, and
    importing fnnc and fnnc.models loads neither."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"]).lower()
    assert "tensorboard" not in core and "matplotlib" not in core
    extras = project["optional-dependencies"]
    assert any(d.startswith("tensorboard") for d in extras["tensorboard"])
    assert any(d.startswith("matplotlib") for d in extras["plot"])
    code = (
        "import sys, fnnc, fnnc.models, fnnc.graph\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorboard', 'matplotlib')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=subprocess_env(), timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_learning_rate_of_a_fixed_rate_and_plot_and_csv_in_one_run(tmp_path):
    """LearningRate(0.05) logs lr 0.05 each epoch into the history and the CSV (listed
    before the logger), and PlotHistory leaves a PNG file."""
    from matplotlib.image import imread

    model = mlp()
    log, png = tmp_path / "log.csv", tmp_path / "history.png"
    loggers = [LearningRate(0.05), CSVLogger(log), PlotHistory(png)]
    history = model.train((X, LABELS), epochs=2, batch_size=8, verbose=False, callbacks=loggers)
    assert history["lr"] == [0.05, 0.05]
    with open(log, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["epoch", "loss", "lr"]
    assert [float(r["lr"]) for r in rows] == [0.05, 0.05]
    assert [float(r["loss"]) for r in rows] == history["loss"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert imread(png).ndim == 3
    with pytest.raises(ModelError, match="LearningRate"):
        LearningRate("cosine")


def test_per_epoch_lines_outside_a_terminal_keep_each_epochs_metrics(capsys):
    """Outside a terminal, train prints one line per epoch ("epoch e/N: ...") with that
    epoch's metrics (as the history holds them) that is not overwritten; verbose=False
    prints nothing."""
    model = mlp()
    history = model.train((X, LABELS), epochs=3, batch_size=8, validation=(X, LABELS),
                          progress=False)  # fmt: skip
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("epoch ")]
    assert len(lines) == 3 and "\r" not in err
    for e, line in enumerate(lines):
        assert line.startswith(f"epoch {e + 1}/3: ")
        for key in ("loss", "val_loss", "val_accuracy"):
            assert f"{key} {history[key][e]:.4f}" in line, (key, line)
    model.train((X, LABELS), epochs=1, batch_size=8, verbose=False)
    assert capsys.readouterr().err == ""


def test_a_resumed_epochs_bar_leaves_its_compiling_step_out_of_the_rate():
    """A resumed epoch (2 of 4 batches done before) opens its bar after the first,
    compiling step: the rate counts only the steps after it."""
    import io
    import time

    from fnnc.models.progress import EpochLines

    out = io.StringIO()
    lines = EpochLines(target=2, bars=True, stream=out)
    lines.begin(1, 4, 2)
    time.sleep(0.3)  # the first step of the call compiles
    lines.step()
    lines.step()
    meter = lines._bar.format_dict
    assert meter["total"] == 4 and meter["initial"] == 3 and meter["n"] == 4
    assert meter["elapsed"] < 0.2
    lines.end({"loss": 0.25}, 0.5)
    assert "epoch 2/2" in out.getvalue() and "loss 0.2500" in out.getvalue()


# ---------------------------------------------------------------- per-node profile


def test_graph_profile_keeps_its_trace_in_log_dir_and_names_nodes_and_commands(tmp_path):
    """profile(program, ..., log_dir=) leaves jax.profiler's trace there; rows are the
    graph's named nodes with their commands; the command table sums to the total."""
    from fnnc import ops
    from fnnc.graph import GraphBuilder, compile, profile

    b = GraphBuilder()
    x, w = b.input((128, 64), name="x"), b.input((96, 64), name="w")
    y = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w, name="fc"), name="act")
    program = compile(b.build([y]))
    report = profile(program, np.ones((128, 64), np.float32), np.ones((96, 64), np.float32),
                     runs=2, log_dir=tmp_path / "trace")  # fmt: skip
    assert list((tmp_path / "trace").rglob("*.xplane.pb"))
    assert report.node("fc").command == "gemm" and report.node("fc").seconds > 0
    assert report.node("act").command == "relu"
    assert report.runs == 2 and report.platform == jax.default_backend()
    assert math.isclose(sum(report.commands.values()), report.seconds, rel_tol=1e-9)
    text = str(report)
    assert re.search(r"^fc +gemm +1 ", text, re.M)
    assert re.search(r"^gemm +[\d.]+ +[\d.]+$", text, re.M)
    with pytest.raises(GraphError, match="no node named 'nope'"):
        report.node("nope")


def test_model_profile_of_the_forward_pass_changes_nothing():
    """model.profile(x) (no targets) profiles evaluate and leaves the weights as they were;
    its rows are the model's layers."""
    model = mlp(name="p")
    before = parameters_of(model)
    report = model.profile(X[:8], runs=2)
    after = parameters_of(model)
    assert all(np.array_equal(before[k], after[k]) for k in before)
    timed = {r.name for r in report.nodes if r.seconds > 0}
    assert any(name.endswith("h-0") for name in timed) or any("out" in n for n in timed), timed
    assert "optimizer" not in {r.name for r in report.nodes}


# ---------------------------------------------------------------- CLI


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    from fnnc.io.cli import main

    try:
        status = main(list(args))
    except SystemExit as e:
        status = e.code
    out = capsys.readouterr()
    return status, out.out, out.err


def test_help_of_every_command_is_plain_text_without_restructuredtext(capsys):
    """--help of python -m fnnc, inspect and convert shows no reST markup."""
    for args in (["--help"], ["inspect", "--help"], ["convert", "--help"], ["inspect", "-h"]):
        status, out, _ = run_cli(capsys, *args)
        assert status == 0 and out.startswith("usage: python -m fnnc"), (args, out)
        for markup in ("``", ":mod:", ":func:", ":class:", ":meth:", ".. ", ">>>"):
            assert markup not in out, (args, markup, out)


def test_checkpoint_rows_and_steps_sort_numerically(tmp_path, capsys):
    """inspect lists __ckpt-N__ rows and other numbered names by number, not as text."""
    from fnnc.io import Checkpoints, TensorFile

    path = tmp_path / "run.ckpt"
    with Checkpoints(path) as ckpt:
        for step in (10, 2, 100, 9):
            ckpt.save(step, {"b": np.ones(1, np.float32), "a": np.ones(2, np.float32)})
    with TensorFile(path) as f:
        for i in (10, 2, 1):
            f.write(f"t-fc-0-{i}", np.zeros(1, np.float32))
    status, out, err = run_cli(capsys, "inspect", str(path))
    assert status == 0, err
    names = [line.split()[0] for line in out.splitlines()[2:] if not line.startswith("checkpoint")]
    ckpt_rows = [n for n in names if n.startswith("__ckpt-")]
    steps = [int(re.match(r"__ckpt-(\d+)__", n).group(1)) for n in ckpt_rows]
    assert steps == [2, 2, 9, 9, 10, 10, 100, 100]
    assert [n for n in names if n.startswith("t-")] == ["t-fc-0-1", "t-fc-0-2", "t-fc-0-10"]
    assert "checkpoint steps: 2, 9, 10, 100" in out


def test_inspect_piped_into_head_in_a_shell_ends_without_a_traceback(tmp_path):
    """`python -m fnnc inspect run.ckpt | head -2` in bash: two lines, nothing on stderr."""
    from fnnc.io import Checkpoints

    path = tmp_path / "run.ckpt"
    with Checkpoints(path) as ckpt:  # 1,600 rows: more than a pipe buffers (64 KiB)
        for step in range(1, 5):
            ckpt.save(step, {f"layer{i}.weight_with_a_long_name": np.zeros(1, np.float32)
                             for i in range(400)})  # fmt: skip
    cmd = (
        f"{sys.executable} -m fnnc inspect {path} 2>{tmp_path / 'err'} | head -2; "
        'echo "inspect exited ${PIPESTATUS[0]}" >&2'
    )
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True,
                         env=subprocess_env(), timeout=120)  # fmt: skip
    assert out.returncode == 0
    assert out.stderr.strip() == "inspect exited 141"  # the pipe did break: head left early
    assert len(out.stdout.splitlines()) == 2 and out.stdout.startswith(f"{path}: ")
    err = (tmp_path / "err").read_text()
    assert err == "", err


# ---------------------------------------------------------------- README and docs


README = (ROOT / "README.md").read_text()


def test_readme_lists_every_example():
    """Every examples/*.py is named in the README."""
    missing = [p.name for p in (ROOT / "examples").glob("*.py") if p.name not in README]
    assert not missing


def test_readme_states_the_suites_cost_and_a_registered_quick_subset():
    """The README says how long the suite takes and documents `-m quick`, a marker the
    test configuration registers."""
    assert re.search(r"suite[^.]*\d+ minutes", README)
    assert "-m quick" in README
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"][
        "markers"
    ]
    assert any(m.startswith("quick") for m in markers)


def test_readme_gives_one_command_to_build_the_docs_and_the_site_has_every_guide():
    """The README names the docs build command; mkdocs.yml is strict and its navigation
    has a getting-started page, the API reference and a guide per feature of the issue."""
    assert "mkdocs build --strict" in README
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^strict: true", config, re.M) and "mkdocstrings" in config
    nav = config.split("nav:", 1)[1].lower()
    topics = [
        "getting started", "commands and backends", "graphs, tracing and passes",
        "dynamic graph", "models and training", "data", "checkpoints and resuming",
        "multi-device and multi-process", "mixed precision", "memory",
        "autotune and cpu library sets", "pallas kernels and gpus", "nnc interop",
        "errors and the numerics check", "api reference",
    ]  # fmt: skip
    assert [t for t in topics if t not in nav] == []
    for page in re.findall(r":\s*(\S+\.md)", config):
        assert (ROOT / "docs" / page).is_file(), page
    gpus = (ROOT / "docs" / "guides" / "gpus.md").read_text()
    assert "pip install" in gpus and "cuda" in gpus  # the install extra


def test_readme_resume_demo_schedule_still_moves_in_the_resumed_epoch():
    """The README demo's warmup-cosine schedule (3 epochs of 4 steps) does not reach 0
    before the resumed third epoch, so that epoch differs from the second."""
    found = re.search(r"schedule = (optax\.warmup_cosine_decay_schedule\([^)]*\))", README)
    assert found, "the README's resume demo schedule"
    schedule = eval(found.group(1), {"optax": optax})  # the README's own code
    third_epoch = [float(schedule(count)) for count in range(8, 12)]
    assert all(rate > 0 for rate in third_epoch), third_epoch
    assert "resume=" in README
