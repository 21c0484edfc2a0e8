"""Audit 11 (what surrounds Model.fit): class metrics refuse targets that do not pair
with the outputs, metrics and the loss of a set without targets."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.errors import ModelError
from fnnc.io import Checkpoints
from fnnc.models import Dense, EarlyStopping, Input, LearningRate, Model
from fnnc.models.batches import progress
from fnnc.models.callbacks import Callback, CheckpointEvery
from fnnc.models.metrics import Accuracy, BinaryAccuracy, TopK

RNG = np.random.default_rng(11)
X = RNG.standard_normal((6, 3)).astype(np.float32)


@pytest.fixture(scope="module")
def custom() -> Model:
    """Three classes, trained by a loss function: no named loss checks the labels."""
    x = Input()
    m = Model(x, Dense(3, name="out")(x), name="custom")
    m.compile(X, loss=lambda o, t: jnp.mean(o[0] ** 2), minimizer=optax.sgd(0.0))
    return m


def test_class_metrics_name_targets_that_do_not_pair_with_the_outputs(custom):
    # a [N, 2] target for a [N, 3] output raised NumPy's bare broadcasting error from
    # score, and from train's validation (the same metrics) after the epoch had trained
    out = np.asarray(custom.evaluate(X))
    labels = np.array([0, 1, 2, 2, 1, 0])
    want = np.mean(np.argmax(out, 1) == labels)
    top2 = np.mean([lab in np.argsort(-row)[:2] for row, lab in zip(out, labels)])
    got = custom.score(X, labels, metrics=["accuracy", "top_2_accuracy"])
    assert got["accuracy"] == pytest.approx(want) and got["top_2_accuracy"] == pytest.approx(top2)
    bad = np.zeros((6, 2), np.int32)
    shapes = r"output 0 is \[6, 3\] \(3 classes\) but its target is \[6, 2\]"
    with pytest.raises(ModelError, match=f"metric accuracy: {shapes}"):
        custom.score(X, bad, metrics=["accuracy"])
    with pytest.raises(ModelError, match=f"metric top_2_accuracy: {shapes}"):
        custom.score(X, bad, metrics=["top_2_accuracy"])


def test_class_metrics_refuse_sequences_against_one_label_per_sample_and_odd_labels():
    out = RNG.standard_normal((4, 2, 5)).astype(np.float32)
    seq = np.array([[0, 1], [2, 3], [4, 0], [1, 1]])
    want = np.mean(np.argmax(out, -1) == seq)
    assert Accuracy()(None, [out], [seq]) == pytest.approx(want)
    assert Accuracy()(None, [out], [np.eye(5)[seq]]) == pytest.approx(want)  # one-hot
    for metric in (Accuracy(), TopK(2)):
        with pytest.raises(ModelError, match=r"is \[4, 2, 5\] .* target is \[4\]; expected"):
            metric(None, [out], [seq[:, 0]])
        with pytest.raises(ModelError, match="holds <U1 values"):
            metric(None, [out[:, 0]], [np.array(list("abcd"))])
        with pytest.raises(ModelError, match=r"holds the label 1\.5 at sample 2; a class index is"):
            metric(None, [out[:, 0]], [np.array([0.0, 1.0, 1.5, 2.0])])  # astype made it 1
    with pytest.raises(ModelError, match=r"output 0 is a scalar \(float32\[\]\)"):
        Accuracy()(None, [np.float32(1.0)], [np.array(1)])
    floats = np.array([0.0, 4.0, np.nan, 2.0])  # whole floats are labels, NaN a miss
    hits = np.argmax(out[:, 0], -1) == np.array([0, 4, -1, 2])
    assert Accuracy()(None, [out[:, 0]], [floats]) == pytest.approx(np.mean(hits))


def test_a_set_without_targets_gives_user_metrics_none_and_a_named_loss_an_error():
    x = Input()
    m = Model(x, Dense(1, name="out")(x), name="free")
    m.compile(X, loss=None, minimizer=optax.sgd(0.0))
    out = np.asarray(m.evaluate(X), np.float64)
    seen = []

    def mean_out(outputs, targets):
        seen.append(targets)
        return float(np.mean(outputs))

    # fn(outputs, targets[0]) raised IndexError: list index out of range
    got = m.score((X, None), metrics={"mean_out": mean_out})
    assert got == pytest.approx({"loss": np.mean(out), "mean_out": np.mean(out)})
    assert seen == [None]
    x = Input()
    mse = Model(x, Dense(1, name="out")(x), name="mse")
    mse.compile(X, loss="mse", minimizer=optax.sgd(0.0))
    with pytest.raises(ModelError, match=r"score: loss=.mse. compares .* the set has none"):
        mse.score((X, None))


def test_a_metric_mapping_is_checked_before_train_runs_an_epoch(custom):
    # {'a': 5} raised "'int' object is not callable" after the epoch had trained, and
    # {3: fn} put the key 3 into the results, the history and the CSV header
    before = {k: np.asarray(v) for k, v in custom.parameters().items()}
    step = progress(custom).step
    labels = np.array([0, 1, 2, 2, 1, 0])
    with pytest.raises(ModelError, match=r"train: metric 'a' is int \(5\), not a function"):
        custom.train((X, labels), batch_size=3, metrics={"a": 5}, verbose=False)
    with pytest.raises(ModelError, match=r"score: a metric's name is a non-empty string.* got 3"):
        custom.score(X, labels, metrics={3: lambda o, t: 1.0})
    for name in (3, ""):  # a Metric object under a bad name too
        with pytest.raises(ModelError, match=r"score: a metric's name is a non-empty string"):
            custom.score(X, labels, metrics={name: Accuracy()})
    assert progress(custom).step == step
    for k, v in custom.parameters().items():
        np.testing.assert_array_equal(np.asarray(v), before[k])
    out = np.asarray(custom.evaluate(X), np.float64)
    got = custom.score(X, labels, metrics=[{"peak": lambda o, t: float(np.max(o))}])
    assert got["peak"] == pytest.approx(np.max(out))


def test_callback_arguments_of_the_wrong_kind_are_model_errors_when_made(tmp_path):
    # EarlyStopping(monitor=5) raised "argument of type 'int' is not iterable",
    # LearningRate(name=5) logged the rate under the key 5, and CheckpointEvery(None)
    # died at train's start with "'NoneType' object has no attribute 'latest'"
    with pytest.raises(ModelError, match=r"EarlyStopping: monitor=5 \(int\); expected the name"):
        EarlyStopping(monitor=5)
    with pytest.raises(ModelError, match=r"LearningRate: name=5 \(int\); expected a non-empty"):
        LearningRate(0.1, name=5)
    with pytest.raises(ModelError, match=r"CheckpointEvery: checkpoints=None \(NoneType\)"):
        CheckpointEvery(None, per_epoch=True)
    path = tmp_path / "run.ckpt"
    assert CheckpointEvery(path, per_epoch=True).target == path  # a PathLike is a path
    with Checkpoints(str(tmp_path / "open.ckpt")) as ckpt:
        assert CheckpointEvery(ckpt, steps=2).target is ckpt
    assert EarlyStopping(monitor="val_top_2_accuracy").mode == "max"
    assert LearningRate(0.1, name="rate").rate(3) == 0.1


def test_callbacks_see_this_epoch_s_added_metrics_in_loop_history(custom):
    # LearningRate's lr reached train's history only after every callback had run, so a
    # callback reading loop.history in on_epoch_end saw the previous epoch's rate
    seen = []

    class Reads(Callback):
        def on_epoch_end(self, loop, epoch, logs):
            seen.append({k: list(v) for k, v in loop.history.items()})

    def schedule(count):
        return 0.5 / (1.0 + count)

    start = progress(custom).step
    labels = np.array([0, 1, 2, 2, 1, 0])
    got = custom.train((X, labels), epochs=2, batch_size=3, verbose=False,
                       callbacks=[Reads(), LearningRate(schedule)])  # fmt: skip
    # sgd(0.0) keeps no update count: the rate is of the epoch's last step s, schedule(s - 1)
    want = [schedule(start + 2 - 1), schedule(start + 4 - 1)]
    assert got["lr"] == pytest.approx(want)
    assert seen == [{k: v[:1] for k, v in got.items()}, got]


@pytest.mark.parametrize("loss", [None, "mse"])
def test_score_of_a_bfloat16_model_averages_in_float64(loss):
    # np.mean summed the bfloat16 losses in bfloat16, which stops counting near 256:
    # score gave 3.09 for an mse of 10.69 (and 0.125 for the mean of 4096 ones)
    bf16 = jnp.bfloat16
    rows = np.random.default_rng(3).standard_normal((1024, 3))
    xs = (rows + 30.0).astype(bf16)
    ts = (rows[:, :1] + 3.0).astype(bf16)
    x = Input()
    m = Model(x, Dense(1, name="out")(x), name="bf16")
    m.compile(xs[:4], loss=loss, minimizer=optax.sgd(0.0))
    out = np.asarray(m.predict(xs, batch_size=1024), np.float64)
    if loss is None:
        got, want = m.score((xs, None), batch_size=1024)["loss"], np.mean(out)
    else:
        got = m.score(xs, ts, batch_size=1024)["loss"]
        want = np.mean((out - np.asarray(ts, np.float64)) ** 2)
    assert got == pytest.approx(want, rel=2e-3)  # bfloat16 per-row losses, a float64 mean


def test_inputs_given_as_nested_lists_are_told_to_be_one_array(custom):
    # score(x.tolist(), y) said only that 6 inputs of 3 rows disagree with 6 targets
    labels = np.array([0, 1, 2, 2, 1, 0])
    with pytest.raises(ModelError, match=r"input 5 has 3, target 0 has 6\); .*inputs came as a "
                       r"list of 6, and a list holds one array per input: make a nested list of "
                       r"numbers one array with np.asarray"):  # fmt: skip
        custom.score(X.tolist(), labels)
    with pytest.raises(ModelError) as e:  # two arrays of unequal rows: no list hint
        custom.score((X, X[:2]), labels)
    assert "nested list" not in str(e.value)
    out = np.asarray(custom.evaluate(X))
    got = custom.score(np.asarray(X.tolist(), np.float32), labels, metrics=["accuracy"])
    got = got["accuracy"]
    assert got == pytest.approx(np.mean(np.argmax(out, 1) == labels))


def test_binary_accuracy_takes_a_number_as_threshold_and_refuses_others():
    # BinaryAccuracy('0.5') was kept and failed NumPy's comparison when measured
    out = np.array([[0.2], [0.7], [0.5], [0.9]], np.float32)
    t = np.array([0, 1, 1, 0])
    want = np.mean((out[:, 0] > 0.5) == (t > 0.5))
    assert BinaryAccuracy(np.float32(0.5))(None, [out], [t]) == pytest.approx(want)
    for bad in ("0.5", float("nan"), True, [0.5]):
        with pytest.raises(ModelError, match=r"BinaryAccuracy: threshold=.* expected a number"):
            BinaryAccuracy(bad)
