"""Model.score and the metric objects train(validation=...) shares, against NumPy."""

from __future__ import annotations

import io
import time

import numpy as np
import optax
import pytest

from fnnc.data import DataFrame
from fnnc.errors import DataError, ModelError
from fnnc.models import Dense, Input, Model, ReLU
from fnnc.models.metrics import Accuracy, BinaryAccuracy, MeanLoss, Metric, TopK
from fnnc.models.progress import EpochLines

RNG = np.random.default_rng(1)
X = RNG.standard_normal((40, 4)).astype(np.float32)
Y = np.argmax(X[:, :3] + 0.5 * X[:, 3:], axis=1).astype(np.int32) % 5


def model() -> Model:
    x = Input()
    m = Model(x, Dense(5, name="out")(ReLU()(Dense(8, name="h")(x))))
    m.compile(X[:8], loss="softmax_crossentropy", minimizer=optax.adam(0.05))
    return m


def np_cross_entropy(logits, labels):
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-np.mean(logp[np.arange(len(labels)), labels]))


def np_top_k(logits, labels, k):
    top = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    return float(np.mean((top == labels[:, None]).any(-1)))


class MaxProb(Metric):
    name = "max_prob"

    def __call__(self, model, outputs, targets):
        z = np.exp(outputs[0] - outputs[0].max(-1, keepdims=True))
        return float(np.mean(z.max(-1) / z.sum(-1)))


def test_score_gives_loss_and_metrics_as_numpy_computes_them_and_as_train_logs():
    m = model()
    history = m.train(
        (X, Y), epochs=2, batch_size=8, validation=(X, Y), verbose=False,
        metrics=["accuracy", TopK(3), MaxProb(), "top_2_accuracy"],
    )  # fmt: skip
    got = m.score(X, Y, metrics=["accuracy", TopK(3), MaxProb(), "top_2_accuracy"], batch_size=7)
    logits = m.predict(X)
    assert list(got) == ["loss", "accuracy", "top_3_accuracy", "max_prob", "top_2_accuracy"]
    np.testing.assert_allclose(got["loss"], np_cross_entropy(logits, Y), rtol=1e-5)
    assert got["accuracy"] == float(np.mean(np.argmax(logits, -1) == Y))
    assert got["top_3_accuracy"] == np_top_k(logits, Y, 3)
    assert got["top_2_accuracy"] == np_top_k(logits, Y, 2)
    assert 0 < got["max_prob"] <= 1
    # train measured the same set with the same objects after its last epoch
    assert {k: history[f"val_{k}"][-1] for k in got} == pytest.approx(got, rel=1e-6)
    # a dataframe (last column the target) gives the same numbers as the arrays
    frame = m.score(DataFrame.from_arrays(x=X, y=Y), metrics={"max_prob": MaxProb()})
    assert frame == pytest.approx({k: got[k] for k in ("loss", "accuracy", "max_prob")})


def test_score_defaults_and_bad_metrics():
    m = model()
    got = m.score((X, Y))
    assert list(got) == ["loss", "accuracy"]  # a classification loss adds accuracy
    own = m.score((X, Y), metrics={"first": lambda out, y: float(out[0, 0])})
    assert own["first"] == pytest.approx(float(m.predict(X)[0, 0]))
    one_hot = m.score((X, np.eye(5, dtype=np.float32)[Y]), metrics=[Accuracy()])
    assert one_hot["accuracy"] == got["accuracy"]
    mixed = m.score((X, Y), metrics=["accuracy", {"first": lambda out, y: float(out[0, 0])}])
    assert mixed == {**got, "first": own["first"]}  # a list may hold {"name": fn} too
    with pytest.raises(ModelError, match=r"score: unknown metric 'f1'.*top_<k>_accuracy"):
        m.score((X, Y), metrics=["f1"])
    with pytest.raises(ModelError, match=r"k=9 but output 0 has only 5 classes"):
        m.score((X, Y), metrics=[TopK(9)])
    with pytest.raises(ModelError, match=r"callable metric needs a name"):
        m.score((X, Y), metrics=[lambda o, t: 0.0])


def test_each_epoch_keeps_its_own_line_in_a_terminal(capsys):
    m = model()
    m.train((X, Y), epochs=3, batch_size=8, validation=(X, Y), progress=True)
    err = capsys.readouterr().err
    finals = [line.rsplit("\r", 1)[-1] for line in err.split("\n") if line.strip()]
    for e in (1, 2, 3):
        mine = [f for f in finals if f.startswith(f"epoch {e}/3")]
        assert len(mine) == 1 and "5/5" in mine[0] and "val_accuracy" in mine[0], finals


def test_the_first_epochs_rate_leaves_the_compiling_step_out():
    out = io.StringIO()
    lines = EpochLines(target=1, bars=True, stream=out)
    lines.begin(0, 4, 0)
    time.sleep(0.5)  # the first step compiles
    lines.step()
    for _ in range(3):
        lines.step()
    meter = lines._bar.format_dict
    assert meter["n"] == 4 and meter["initial"] == 1 and meter["elapsed"] < 0.25
    lines.end({"loss": 1.0}, 0.6)
    assert "epoch 1/1" in out.getvalue() and "loss 1.0000" in out.getvalue()


def test_score_data_errors_say_score_for_every_form_of_data():
    """score's own set is named "score" in its errors (not train's validation data):
    labels out of range, a set with no rows, mismatched arrays, a dataframe without
    the named columns."""
    m = model()
    bad = Y.copy()
    bad[3] = 7
    with pytest.raises(ModelError, match=r"^score: target 0 holds the label 7"):
        m.score(X, bad)
    with pytest.raises(ModelError, match=r"^score: .*no batches"):
        m.score(X[:0], Y[:0])
    with pytest.raises(ModelError, match=r"^score: "):
        m.score(X, Y[:-1])
    frame = DataFrame.from_arrays(x=X, y=Y)
    with pytest.raises(DataError, match=r"^score: .*no column 'nope'"):
        m.score(frame, inputs=["nope"], targets=["y"])


@pytest.mark.parametrize("loss", ["sigmoid_binary_crossentropy", "binary_crossentropy"])
def test_accuracy_of_one_unit_is_binary_accuracy(loss):
    """argmax over one unit is always 0: 'accuracy' used to report 1.0 for any model."""
    y = (X[:, :1] > 0).astype(np.float32)
    x = Input()
    out = Dense(1, name="fc")(x)
    if loss == "binary_crossentropy":  # probabilities: threshold 0.5
        from fnnc.models import Activation

        out = Activation("sigmoid")(out)
    m = Model(x, out)
    m.compile(X[:8], loss=loss, minimizer=optax.sgd(0.0))
    w = m.parameters()["t-fc-0-0"]
    m.set_parameters({"t-fc-0-0": -np.abs(np.asarray(w))})  # wrong on purpose, mostly
    pred = np.asarray(m.predict(X)).reshape(-1)
    threshold = 0.0 if loss == "sigmoid_binary_crossentropy" else 0.5
    want = float(np.mean((pred > threshold) == (y[:, 0] > 0.5)))
    assert want < 0.9
    assert m.score(X, y, metrics=["accuracy"])["accuracy"] == pytest.approx(want)
    hist = m.train(
        (X, y), epochs=1, batch_size=8, validation=(X, y), metrics=["accuracy"], verbose=False
    )
    assert hist["val_accuracy"][-1] == pytest.approx(want)


def test_binary_accuracy_threshold_and_clear_refusals():
    out, y = np.array([[2.0], [-1.0], [0.5], [0.2]]), np.array([1, 1, 0, 0])
    assert BinaryAccuracy(0.0)(None, [out], [y]) == 0.25
    assert BinaryAccuracy(0.4)(None, [out], [y]) == 0.5
    with pytest.raises(ModelError, match="does not say whether it is a logit"):
        Accuracy()(None, [out], [y])  # no model, no loss: the threshold is unknown
    with pytest.raises(ModelError, match="one unit, a binary output"):
        TopK(1)(None, [out], [y])


def test_top_k_counts_nan_outputs_as_misses():
    """NaN compares false with everything: a diverged model scored a perfect top-k."""
    nan = np.full((4, 3), np.nan, np.float32)
    assert TopK(2)(None, [nan], [np.array([0, 1, 2, 0])]) == 0.0
    part = np.array([[np.nan, 1.0, 0.0], [0.0, 1.0, 2.0]], np.float32)
    # row 0: the NaN ranks first (as argmax takes it), so label 1 is second: a top-2 hit
    assert TopK(2)(None, [part], [np.array([1, 0])]) == 0.5


def test_saturated_probabilities_score_as_fit_trains_them():
    """fit fuses sigmoid + binary_crossentropy and softmax + categorical_crossentropy
    (finite); score and val_loss compute the loss on the probabilities, where a
    saturated correct output (sigmoid 1.0, a softmax 0 off the label) was 0 * log 0,
    NaN. Both now agree with -log of the true probability (NumPy, float64)."""
    from fnnc.models import Activation

    xb = np.array([[3.0], [-3.0], [2.0], [-2.0]], np.float32)
    yb = (xb > 0).astype(np.float32)
    x = Input()
    m = Model(x, Activation("sigmoid")(Dense(1, name="fc")(x)))
    m.compile(xb, loss="binary_crossentropy", minimizer=optax.sgd(0.0))
    m.set_parameters({"t-fc-0-0": np.full((1, 1), 10, np.float32), "t-fc-0-1": np.zeros(1)})
    assert m.predict(xb)[0, 0] == 1.0  # sigmoid(30) rounds to 1 in float32
    z = 10 * xb.astype(np.float64)
    want = float(np.mean(np.logaddexp(0, np.where(yb > 0, -z, z))))  # ~5e-10
    hist = m.train((xb, yb), epochs=1, batch_size=4, validation=(xb, yb), verbose=False)
    for got in (float(m.fit(xb, yb)), m.score(xb, yb)["loss"], *hist["loss"], *hist["val_loss"]):
        assert abs(got - want) < 1e-8
    xc, yc = np.array([[1.0], [-1.0]], np.float32), np.array([0, 1], np.int32)
    x = Input()
    c = Model(x, Activation("softmax")(Dense(2, name="fc")(x)))
    c.compile(xc, loss="categorical_crossentropy", minimizer=optax.sgd(0.0))
    c.set_parameters({"t-fc-0-0": np.array([[60.0], [-60.0]], np.float32), "t-fc-0-1": np.zeros(2)})
    assert (c.predict(xc) == 0).sum() == 2  # exp(-120) underflows: one 0 per row, off the label
    want = float(np.mean(np.logaddexp(0, -120.0)))  # -log softmax at the label, ~1e-52
    hist = c.train((xc, yc), epochs=1, batch_size=2, validation=(xc, yc), verbose=False)
    for got in (float(c.fit(xc, yc)), c.score(xc, yc)["loss"], *hist["loss"], *hist["val_loss"]):
        assert abs(got - want) < 1e-8


@pytest.mark.parametrize("loss", ["mse", "smooth_l1"])
def test_float64_targets_that_fit_takes_also_score(loss):
    """NumPy's default float64 targets: fit compiles them as float32, score and
    train(validation=) passed them raw to the loss (a DTypeError: one dtype)."""
    y = np.random.default_rng(2).standard_normal((40, 2))  # float64
    x = Input()
    m = Model(x, Dense(2, name="o")(x))
    m.compile(X[:8], loss=loss, minimizer=optax.sgd(0.0))
    float(m.fit(X[:8], y[:8]))
    d = m.predict(X).astype(np.float64) - y.astype(np.float32)
    if loss == "mse":
        want = float(np.mean(d**2))
    else:  # NNC's smooth L1 on the sample's L1 distance, beta 1
        l1, sq = np.abs(d).sum(-1), (d**2).sum(-1)
        want = float(np.mean(np.where(l1 < 1, 0.5 * sq, l1 - 0.5)))
    assert m.score(X, y, batch_size=16)["loss"] == pytest.approx(want, rel=1e-5)
    hist = m.train((X, y), epochs=1, batch_size=8, validation=(X, y), verbose=False)
    assert hist["val_loss"][-1] == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("loss", ["sigmoid_binary_crossentropy", "binary_crossentropy"])
def test_accuracy_of_multi_label_targets_is_entry_by_entry(loss):
    """A binary loss over [N, C] multi-label targets: independent units, so "accuracy"
    is the fraction of the N * C entries on the right side of the threshold (Keras's
    binary_accuracy), not argmax(outputs) == argmax(targets) as before."""
    from fnnc.models import Activation

    y = (X @ np.random.default_rng(3).standard_normal((4, 3)) > 0).astype(np.float32)
    x = Input()
    out = Dense(3, name="fc")(x)
    if loss == "binary_crossentropy":
        out = Activation("sigmoid")(out)
    m = Model(x, out)
    m.compile(X[:8], loss=loss, minimizer=optax.sgd(0.0))
    pred = np.asarray(m.predict(X))
    threshold = 0.0 if loss == "sigmoid_binary_crossentropy" else 0.5
    want = float(np.mean((pred > threshold) == (y > 0.5)))
    assert want != float(np.mean(pred.argmax(1) == y.argmax(1)))
    assert m.score(X, y, metrics=["accuracy"])["accuracy"] == pytest.approx(want)
    hist = m.train(
        (X, y), epochs=1, batch_size=8, validation=(X, y), metrics=["accuracy"], verbose=False
    )
    assert hist["val_accuracy"][-1] == pytest.approx(want)


def test_class_labels_outside_the_outputs_are_refused_and_nan_labels_miss():
    """A label outside [0, C): TopK raised NumPy's IndexError (7) or took -1 as the last
    class (a hit), Accuracy counted either as a silent miss. A NaN label is a miss."""
    out = np.array([[0.1, 0.2, 0.7], [0.6, 0.3, 0.1], [0.2, 0.5, 0.3]], np.float32)
    for metric in (TopK(2), Accuracy()):
        for bad, at in ((7, 0), (-1, 2)):
            labels = np.array([2, 0, 1])
            labels[at] = bad
            with pytest.raises(
                ModelError,
                match=rf"^metric {metric.name}: target 0 holds the "
                rf"label {bad} at sample {at}, but output 0 has 3 classes",
            ):
                metric(None, [out], [labels])
    nan = np.array([np.nan, 0.0, 2.0])
    for k, metric in ((1, Accuracy()), (1, TopK(1)), (2, TopK(2))):
        want = np_top_k(out[1:], np.array([0, 2]), k) * 2 / 3  # row 0 a miss
        assert metric(None, [out], [nan]) == pytest.approx(want)
    x = Input()
    m = Model(x, Dense(3, name="o")(x))  # a loss of its own: no label check before the metric
    m.compile(X[:8], loss=lambda o, t: (o[0] ** 2).mean() + 0 * t[0].sum(), minimizer=optax.sgd(0))
    labels = np.arange(40) % 3
    labels[5] = 3
    with pytest.raises(ModelError, match=r"^metric top_2_accuracy: .* label 3 at sample 5"):
        m.score(X, labels, metrics=["top_2_accuracy"])


class L1(Metric):
    name = "loss"

    def __call__(self, model, outputs, targets):
        return float(np.mean(np.abs(outputs[0])))


@pytest.mark.parametrize(
    "metrics, name",
    [({"loss": lambda out, y: float(np.mean(np.abs(out)))}, "loss"), ([L1()], "loss"),
     ({"epoch": lambda out, y: 7.0}, "epoch")],
)  # fmt: skip
def test_a_metric_named_as_the_models_own_numbers_is_refused(metrics, name):
    """A metric called 'loss' replaced the model's loss in score and val_loss (what
    EarlyStopping and checkpoints read); 'epoch' corrupted train's epoch numbers. Both
    are refused, naming the metric; the MeanLoss itself ('loss') is the model's loss,
    cross-entropy as NumPy computes it."""
    m = model()
    with pytest.raises(ModelError, match=rf"score: a metric named '{name}' .* name yours"):
        m.score(X, Y, metrics=metrics)
    with pytest.raises(ModelError, match=rf"train: a metric named '{name}'"):
        m.train((X, Y), epochs=1, batch_size=8, validation=(X, Y), metrics=metrics,
                verbose=False)  # fmt: skip
    assert m.train_progress.step == 0  # refused before any step
    got = m.score(X, Y, metrics=["loss", MeanLoss()])
    np.testing.assert_allclose(got["loss"], np_cross_entropy(m.predict(X), Y), rtol=1e-5)
