"""Audit 9 (the training loop): score's loss checks, row checks of train/score/predict,
atomic rewrites of the CSV log and the history plot."""

from __future__ import annotations

import csv
import errno
import json
import types

import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import DTypeError, ModelError, ShapeError
from fnnc.io import Checkpoints
from fnnc.models import (
    CommandLayer,
    CSVLogger,
    Dense,
    EarlyStopping,
    Input,
    LearningRate,
    Model,
)
from fnnc.models.batches import progress
from fnnc.models.callbacks import Callback, CheckpointEvery
from fnnc.models.metrics import Accuracy, TopK

RNG = np.random.default_rng(9)
X = RNG.standard_normal((6, 3)).astype(np.float32)
Y = (3.0 * RNG.standard_normal((6, 1))).astype(np.float32)


@pytest.fixture(scope="module")
def regression() -> Model:
    x = Input()
    m = Model(x, Dense(1, name="out")(x), name="reg")
    m.compile(X, loss="mse", minimizer=optax.sgd(0.0))
    return m


def test_score_of_a_regression_loss_is_not_checked_as_class_labels(regression):
    # mse's targets are any numbers: score and train's validation checked them as class
    # indices of a 1-class output and refused 1.23 as 'needs class indices in [0, 1)'
    out = np.asarray(regression.evaluate(X), np.float64)
    got = regression.score(X, Y)
    np.testing.assert_allclose(got["loss"], np.mean((out - Y) ** 2), rtol=1e-6)
    with pytest.raises(ShapeError, match=r"score: loss 'mse' of output 0 float32\[6, 1\] "
                       r"against target 0 float32\[6\]") as e:  # fmt: skip
        regression.score(X, Y[:, 0])
    assert "class" not in str(e.value)
    with pytest.raises(DTypeError, match=r"score: loss 'mse' .* int32\[6, 1\]"):
        regression.score(X, np.round(Y).astype(np.int32))
    with pytest.raises(ShapeError, match="train validation: loss 'mse'"):
        regression.train((X, Y), batch_size=3, validation=(X, Y[:, 0]), verbose=False)


@pytest.fixture(scope="module")
def two_heads() -> Model:
    a, b = Input(name="a"), Input(name="b")
    m = Model([a, b], [Dense(1, name="o1")(a), Dense(1, name="o2")(b)], name="two")
    m.compile([X[:4], X[:4, :2]], loss=None, minimizer=optax.sgd(0.0))
    return m


def test_predict_refuses_inputs_of_different_rows(two_heads):
    # each input was batched apart: [x[:3], b[:6]] gave 3 and 4 rows (b's last 2 dropped)
    with pytest.raises(ModelError, match=r"predict: .*input 0 has 3, input 1 has 6"):
        two_heads.predict([X[:3], X[:, :2]], batch_size=4)
    w = {k: np.asarray(v, np.float64) for k, v in two_heads.parameters().items()}
    o1, o2 = two_heads.predict([X, X[:, :2]], batch_size=4)
    np.testing.assert_allclose(o1, X @ w["t-two-0-o1-0-0"].T + w["t-two-0-o1-0-1"], rtol=1e-5)
    np.testing.assert_allclose(
        o2, X[:, :2] @ w["t-two-0-o2-0-0"].T + w["t-two-0-o2-0-1"], rtol=1e-5
    )


def test_train_and_score_name_the_rows_of_each_array_and_refuse_a_scalar(regression):
    with pytest.raises(ModelError, match="input 0 has 6, target 0 has 5"):
        regression.train((X, Y[:5]), batch_size=3, verbose=False)
    with pytest.raises(ModelError, match=r"score: target 0 is a single value \(1\.5\)"):
        regression.score(X, 1.5)  # was len() of unsized object
    with pytest.raises(ModelError, match=r"train: input 0 is a single value"):
        regression.train((np.float32(1.0), Y), batch_size=3, verbose=False)


@pytest.mark.parametrize("size", [0, -1, 2.5])
def test_score_checks_its_batch_size(regression, size):
    # 0 raised range()'s ValueError, 2.5 a TypeError, -1 'the data gave no batches'
    with pytest.raises(ModelError, match=rf"score: batch_size={size}"):
        regression.score(X, Y, batch_size=size)


def _fail_after_first_row(monkeypatch):
    """Makes csv writers write one row, then fail as a full disk does."""
    real = csv.writer

    class Failing:
        def __init__(self, f):
            self.inner = real(f)

        def writerows(self, rows):
            self.inner.writerow(next(iter(rows)))
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(csv, "writer", Failing)


def test_csv_logger_trims_a_resumed_log_atomically(tmp_path, monkeypatch):
    # the trim rewrote the log in place: a failure (full disk, kill) after truncating it
    # left the header alone, every earlier epoch's row lost
    path = tmp_path / "log.csv"
    path.write_text("epoch,loss\r\n1,0.5\r\n2,0.25\r\n3,0.125\r\n")
    before = path.read_bytes()
    _fail_after_first_row(monkeypatch)
    loop = types.SimpleNamespace(progress=types.SimpleNamespace(epoch=2))
    with pytest.raises(ModelError, match="No space left"):
        CSVLogger(path, append=True).on_train_begin(loop)
    assert path.read_bytes() == before
    monkeypatch.undo()
    logger = CSVLogger(path, append=True)
    logger.on_train_begin(loop)
    logger.on_train_end(loop)
    assert path.read_bytes() == b"epoch,loss\r\n1,0.5\r\n2,0.25\r\n"


def test_plot_history_replaces_the_picture_atomically(tmp_path, monkeypatch):
    from matplotlib.figure import Figure  # the test extra installs it

    from fnnc.models.plots import plot_history

    def whole(fig, fname, *, format, **kwargs):  # stands in for rendering (seconds)
        with open(fname, "wb") as f:
            f.write(f"{format} picture".encode())

    def half(fig, fname, **kwargs):  # a kill or full disk in the middle of the write
        with open(fname, "wb") as f:
            f.write(b"png pic")
        raise OSError(errno.ENOSPC, "No space left on device")

    path = tmp_path / "h.png"
    history = {"epoch": [1, 2], "loss": [1.0, 0.5]}
    monkeypatch.setattr(Figure, "savefig", whole)
    plot_history(history, path)
    assert path.read_bytes() == b"png picture"
    monkeypatch.setattr(Figure, "savefig", half)
    with pytest.raises(OSError, match="No space"):
        plot_history(history, path)  # wrote half a file over the last picture
    assert path.read_bytes() == b"png picture" and sorted(tmp_path.iterdir()) == [path]
    monkeypatch.setattr(Figure, "savefig", whole)
    plot_history(history, tmp_path / "plain")  # no suffix: matplotlib's default, as before
    assert (tmp_path / "plain.png").read_bytes() == b"png picture"
    plot_history(history, tmp_path / "h.SVG")
    assert (tmp_path / "h.SVG").read_bytes() == b"svg picture"


def test_train_takes_none_for_the_targets_of_a_model_without_loss(two_heads):
    # (x, None) was len() of unsized object; a loss=None model trains on its first output
    w = {k: np.asarray(v, np.float64) for k, v in two_heads.parameters().items()}
    h = two_heads.train(([X[:4], X[:4, :2]], None), batch_size=4, verbose=False)
    first = X[:4] @ w["t-two-0-o1-0-0"].T + w["t-two-0-o1-0-1"]
    np.testing.assert_allclose(h["loss"], [np.mean(first)], rtol=1e-5)


def test_summary_of_a_compiled_model_refuses_inputs_its_parameters_do_not_fit(regression):
    # it tabulated t-reg-0-out-0-0 as f32[1,5] (21 parameters) while the model holds [1, 3]
    with pytest.raises(ModelError, match=r"summary: .*t-reg-0-out-0-0 of shape \[1, 3\]"):
        regression.summary([np.zeros((2, 5), np.float32)], print_fn=None)
    text = regression.summary([np.zeros((7, 3), np.float32)], print_fn=None)  # a new batch
    count = sum(np.asarray(v).size for v in regression.parameters().values())
    assert "f32[7,1]" in text and text.splitlines()[-1].startswith(f"total: {count} parameters")


@pytest.mark.parametrize("bad", [-0.1, float("nan"), "0.1", True])
def test_early_stopping_refuses_a_min_delta_that_is_not_a_number_at_least_0(bad):
    with pytest.raises(ModelError, match="EarlyStopping: min_delta="):
        EarlyStopping(min_delta=bad)


def test_early_stopping_counts_min_delta_in_the_direction_of_its_mode():
    # with min_delta=-0.1 a rise of 0.05 was an improvement and became the best: a slowly
    # worsening loss never stopped the run. The rule: improved if (best - v) * sign > delta.
    def epochs_run(values, **options):
        stopper, loop = EarlyStopping("m", patience=1, **options), types.SimpleNamespace(stop=0)
        for epoch, value in enumerate(values):
            stopper.on_epoch_end(loop, epoch, {"m": value})
            if loop.stop:
                return epoch + 1
        return len(values)

    assert epochs_run([1.0, 1.05, 1.1, 1.15, 1.2]) == 3
    assert epochs_run([1.0, 0.95, 0.9, 0.85, 0.8], min_delta=0.1) == 3
    assert epochs_run([1.0, 0.8, 0.6, 0.4, 0.2], min_delta=0.1) == 5
    assert epochs_run([0.5, 0.55, 0.58, 0.7], mode="max", min_delta=np.float32(0.1)) == 3


def test_early_stopping_takes_nan_as_no_improvement_and_resumes_as_it_ran():
    # a first NaN became the best, and nothing improves on NaN: the run stopped while the
    # metric fell; a checkpoint held that best as None, so a resumed run went on instead
    def run(values, stopper):
        loop = types.SimpleNamespace(stop=False)
        for epoch, value in enumerate(values):
            stopper.on_epoch_end(loop, epoch, {"m": value})
            if loop.stop:
                return epoch + 1
        return len(values)

    nan = float("nan")
    assert run([nan, 1.0, 0.9, 0.8, 0.7], EarlyStopping("m", patience=1)) == 5
    assert run([1.0, nan, 0.9, nan, nan, 0.5], EarlyStopping("m", patience=1)) == 5
    first = EarlyStopping("m", patience=1)
    run([nan], first)
    resumed = EarlyStopping("m", patience=1)
    resumed.load_state(json.loads(json.dumps(first.state())))
    assert (resumed.best, resumed.wait) == (first.best, first.wait) == (None, 1)
    assert run([nan], resumed) == 1  # the second NaN in a row: patience 1 is spent


def test_fit_takes_none_for_no_targets(two_heads, regression):
    # fit(x, None) passed None as one target: 'loss=None takes no targets, but 1 target(s)
    # were given', and for mse a DTypeError about an object[] target
    w = {k: np.asarray(v, np.float64) for k, v in two_heads.parameters().items()}
    loss = two_heads.fit([X[:4], X[:4, :2]], None)
    ran = two_heads.memory_plan()  # of the program fit just ran
    first = X[:4] @ w["t-two-0-o1-0-0"].T + w["t-two-0-o1-0-1"]
    np.testing.assert_allclose(float(loss), np.mean(first), rtol=1e-5)
    with pytest.raises(ModelError, match="no targets were given"):
        regression.fit(X, None)
    planned = two_heads.memory_plan([X[:4], X[:4, :2]], None)  # said '1 target(s) were given'
    assert planned.peak_bytes == ran.peak_bytes > 0


def test_predict_and_score_name_a_scalar_output_instead_of_numpy_s_concatenate_error():
    # a model outputting its loss as a scalar (loss=None reads the first output): predict,
    # score and train(validation=) raised NumPy's 'zero-dimensional arrays cannot be
    # concatenated' after evaluating every batch
    x = Input()
    y = Dense(1, name="o")(x)
    mean = CommandLayer(ops.reshape(shape=()))(CommandLayer(ops.reduce_mean(axes=(0, 1)))(y))
    m = Model(x, [y, mean], name="sc")
    m.compile(X[:4], loss=None, minimizer=optax.sgd(0.0))
    np.testing.assert_allclose(float(m.evaluate(X[:4])[1]), np.mean(m.evaluate(X[:4])[0]))
    with pytest.raises(ModelError, match=r"predict: output 1 of model .* is a scalar"):
        m.predict(X[:4], batch_size=4)
    with pytest.raises(ModelError, match=r"score: output 1 of model .* is a scalar"):
        m.score(X[:4], Y[:4])


def test_train_checks_its_seed_before_the_model_keeps_it(regression, tmp_path):
    # seed='a', 1.5 or -1 raised NumPy's errors after the model had kept the seed, so every
    # later train call failed too; np.int64(3) was kept as such and broke the checkpoint's
    # JSON metadata at the first save
    before = progress(regression).seed
    for bad in ("a", 1.5, -1, True):
        with pytest.raises(ModelError, match=r"train: seed=.*expected an int >= 0"):
            regression.train((X, Y), batch_size=3, seed=bad, verbose=False)
        assert regression.train_progress.seed == before
    saver = CheckpointEvery(tmp_path / "run.ckpt", steps=1)
    regression.train((X, Y), batch_size=3, seed=np.int64(3), callbacks=[saver], verbose=False)
    assert type(regression.train_progress.seed) is int and regression.train_progress.seed == 3
    with Checkpoints(tmp_path / "run.ckpt") as ckpt:
        assert ckpt.latest == regression.train_progress.step


def test_checkpoint_every_takes_numpy_step_counts_and_refuses_bools(regression, tmp_path):
    # steps=np.int64(2) was refused as 'not a positive int'; steps=True saved every step
    with pytest.raises(ModelError, match=r"steps must be a positive int, got True \(bool\)"):
        CheckpointEvery(tmp_path / "a.ckpt", steps=True)
    saver = CheckpointEvery(tmp_path / "b.ckpt", steps=np.int64(2))
    start = progress(regression).step
    regression.train((X, Y), epochs=2, batch_size=3, callbacks=[saver], verbose=False)
    with Checkpoints(tmp_path / "b.ckpt") as ckpt:
        assert ckpt.steps() == [s for s in range(start + 1, start + 5) if s % 2 == 0]


class Hooks(Callback):
    """Records which hooks ran; ``fail`` names one that raises."""

    def __init__(self, fail: str = ""):
        self.ran: list[str] = []
        self.fail = fail

    def on_train_begin(self, loop):
        self.ran.append("begin")
        if self.fail == "begin":
            raise RuntimeError("begin failed")

    def on_train_end(self, loop):
        self.ran.append("end")
        if self.fail == "end":
            raise RuntimeError("end failed")


def test_train_ends_every_callback_it_began_when_another_fails(regression, tmp_path):
    # a failing on_train_begin skipped every on_train_end (the callbacks begun before it
    # kept their files and checkpoints open), and a failing on_train_end skipped the rest
    first, failing, never = Hooks(), Hooks("begin"), Hooks()
    with pytest.raises(RuntimeError, match="begin failed"):
        regression.train(
            (X, Y), epochs=0, batch_size=3, callbacks=[first, failing, never], verbose=False
        )
    assert (first.ran, failing.ran, never.ran) == (["begin", "end"], ["begin"], [])
    saver, last = CheckpointEvery(tmp_path / "c.ckpt", steps=1), Hooks()
    with pytest.raises(RuntimeError, match="end failed"):
        regression.train(
            (X, Y), epochs=0, batch_size=3, callbacks=[Hooks("end"), last, saver], verbose=False
        )
    assert last.ran == ["begin", "end"] and saver.checkpoints is None  # closed


def test_train_and_score_refuse_a_dict_that_would_unpack_into_its_keys(regression):
    # {"x": X, "y": Y} unpacked into inputs "x" and targets "y"; an array of 2 rows into
    # its rows
    with pytest.raises(ModelError, match=r"train: expected \(inputs, targets\).*got a dict"):
        regression.train({"x": X, "y": Y}, batch_size=3, verbose=False)
    with pytest.raises(ModelError, match=r"score: expected \(inputs, targets\).*got a str"):
        regression.score("xy")
    with pytest.raises(ModelError, match=r"validation: expected .*got a ndarray"):  # 2 rows
        regression.train((X, Y), batch_size=3, validation=X[:2], verbose=False)


def test_metrics_name_a_missing_output_and_a_result_that_is_no_number(regression):
    # both raised bare IndexError / TypeError, in train after the epoch had trained
    with pytest.raises(ModelError, match=r"metric a2: output=2, but the model has 1 output"):
        regression.score(X, Y, metrics=[Accuracy(output=2, name="a2")])
    with pytest.raises(ModelError, match=r"metric 'mean' returned ndarray of shape \[1\]"):
        regression.score(X, Y, metrics={"mean": lambda out, target: out.mean(0)})
    with pytest.raises(ModelError, match=r"metric 'name' returned str"):
        regression.score(X, Y, metrics={"name": lambda out, target: "x"})
    logits = RNG.standard_normal((9, 4)).astype(np.float32)
    labels = RNG.integers(0, 4, 9)
    top2 = np.argsort(-logits, axis=1)[:, :2]
    got = TopK(np.int64(2), output=np.int64(0))(None, [logits], [labels])  # was refused
    assert got == np.mean((top2 == labels[:, None]).any(1))


def test_legacy_accuracy_reads_the_models_loss_as_score_does():
    # fnnc.models.train.accuracy called Accuracy without the model: a multi-label
    # (sigmoid_binary_crossentropy) output was measured by argmax, a one-unit one refused
    from fnnc.models.train import accuracy

    x = Input()
    m = Model(x, Dense(3, name="o")(x), name="multi")
    m.compile(X, loss="sigmoid_binary_crossentropy", minimizer=optax.sgd(0.0))
    targets = (RNG.standard_normal((6, 3)) > 0).astype(np.float32)
    w = {k: np.asarray(v, np.float64) for k, v in m.parameters().items()}
    logits = X @ w["t-multi-0-o-0-0"].T + w["t-multi-0-o-0-1"]
    assert accuracy(m, (X, targets)) == np.mean((logits > 0) == (targets > 0.5))


@pytest.mark.parametrize("name", ["loss", "val_loss"])
def test_learning_rate_refuses_a_name_train_already_records(regression, name):
    # LearningRate(name="loss") replaced the epoch's loss with the rate in the history, the
    # logs, EarlyStopping's monitor and the checkpoint metadata, silently
    with pytest.raises(ModelError, match=rf"LearningRate: name='{name}' is a metric train"):
        regression.train((X, Y), batch_size=3, validation=(X, Y), verbose=False,
                         callbacks=[LearningRate(0.1, name=name)])  # fmt: skip
    assert progress(regression).batch == 0  # refused at an epoch's end at the latest


def test_grain_batches_take_none_for_the_targets_of_a_model_without_loss(two_heads):
    # (inputs, None) elements gave fit one target None, and validation NumPy's error
    import grain

    w = {k: np.asarray(v, np.float64) for k, v in two_heads.parameters().items()}
    ds = grain.MapDataset.source([([X[:4], X[:4, :2]], None)])
    h = two_heads.train(ds, validation=ds, verbose=False)
    first = X[:4] @ w["t-two-0-o1-0-0"].T + w["t-two-0-o1-0-1"]
    np.testing.assert_allclose([h["loss"], h["val_loss"]], [[np.mean(first)]] * 2, rtol=1e-5)
