"""Model mistakes name the user's input, label or layer (issue 16), checked on the host."""

import re

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import config, ops
from fnnc.errors import ModelError, NumericsError
from fnnc.models import (
    BuildContext,
    CommandLayer,
    Conv,
    Dense,
    EarlyStopping,
    Embedding,
    Input,
    Model,
    checks,
)

RNG = np.random.default_rng(0)
XS = RNG.standard_normal((16, 4)).astype(np.float32)
YS = (np.arange(16) % 3).astype(np.int32)


def _classifier():
    x = Input(name="x")
    model = Model(x, Dense(3, name="fc")(x), name="clf")
    model.compile(XS[:8], loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    return model


@pytest.fixture(scope="module")
def clf():
    return _classifier()


def _xent(logits, labels):
    """NumPy softmax cross-entropy, batch mean: the oracle."""
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-np.mean(logp[np.arange(len(labels)), labels]))


def test_wrong_feature_count_names_the_input_not_the_weight(clf) -> None:
    wide = np.zeros((8, 5), np.float32)
    for call in (lambda: clf.evaluate(wide), lambda: clf.fit(wide, YS[:8])):
        with pytest.raises(ModelError) as e:
            call()
        text = str(e.value)
        assert "input 0 (x) is float32[8, 5], compiled for float32[8, 4]" in text
        assert "Layer Dense('fc') has parameter t-clf-0-fc-0-0 of shape [3, 4]" in text
        assert "[3, 5]" in text and "build a new model" in text


def test_fit_without_targets_says_targets_are_missing(clf) -> None:
    with pytest.raises(ModelError, match=r"loss='softmax_crossentropy' .* no targets were given"):
        clf.fit([XS[:8]])


@pytest.mark.parametrize(("bad", "at"), [(7, 5), (-1, 2)])
def test_fit_rejects_labels_out_of_range(clf, bad: int, at: int) -> None:
    labels = YS[:8].copy()
    labels[at] = bad
    before = clf.parameters()["t-clf-0-fc-0-0"]
    with pytest.raises(ModelError) as e:
        clf.fit(XS[:8], labels)
    text = str(e.value)
    assert f"fit: target 0 holds the label {bad} at sample {at};" in text
    assert "class indices in [0, 3) for the model's 3 output classes" in text
    assert "y - 1" in text  # what to do
    np.testing.assert_array_equal(clf.parameters()["t-clf-0-fc-0-0"], before)  # no step ran


def test_fit_rejects_fractional_labels_and_takes_whole_float_ones(clf) -> None:
    model = clf
    labels = YS[:8].astype(np.float32)
    labels[3] = 1.7
    with pytest.raises(ModelError, match=r"the label 1\.7 at sample 3; .*whole number"):
        model.fit(XS[:8], labels)
    expected = _xent(np.asarray(model.evaluate(XS[:8])), YS[:8])
    loss = float(model.fit(XS[:8], YS[:8].astype(np.float32)))  # 2.0 is class 2
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_one_hot_float_targets_are_not_taken_for_labels(clf) -> None:
    expected = _xent(np.asarray(clf.evaluate(XS[8:])), YS[8:])
    loss = float(clf.fit(XS[8:], np.eye(3, dtype=np.float32)[YS[8:]]))
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_binary_targets_outside_0_1_are_named() -> None:
    x = Input()
    model = Model(x, Dense(2, name="fc")(x))
    model.compile(XS[:8], loss="sigmoid_binary_crossentropy", minimizer=optax.sgd(0.1))
    targets = np.zeros((8, 2), np.float32)
    targets[6, 1] = 2.0
    with pytest.raises(ModelError, match=r"label 2 at sample 6, at \[6, 1\]; .* in \[0, 1\]"):
        model.fit(XS[:8], targets)


def test_train_checks_the_whole_dataset_before_a_step(clf) -> None:
    model = clf
    labels = YS.copy()
    labels[13] = 3
    with pytest.raises(ModelError, match=r"^train: target 0 holds the label 3 at sample 13;"):
        model.train((XS, labels), batch_size=8, verbose=False)
    assert model.train_progress.step == 0
    with pytest.raises(ModelError, match=r"^train validation: target 0 holds the label 3"):
        model.train((XS, YS), batch_size=8, validation=(XS, labels), verbose=False)


def test_nan_in_train_data_warns_and_the_nan_loss_names_the_batch() -> None:
    model = _classifier()
    xs = XS.copy()
    xs[11, 2] = np.nan
    warning = r"input 0 \(x\) holds 1 NaN and 0 infinite value\(s\) \(the first at sample 11, "
    with (
        pytest.warns(RuntimeWarning, match=warning + r"at \[11, 2\]"),
        pytest.raises(NumericsError) as e,
    ):
        model.train((xs, YS), batch_size=8, verbose=False)
    assert "The data is the cause: input 0 of this batch holds 1 NaN" in str(e.value)


def test_bfloat16_data_and_labels_are_checked_as_float32_ones_are() -> None:
    """NumPy counts bfloat16 as no float kind: its NaNs went unreported and its labels
    unchecked."""
    xs = XS.astype(jnp.bfloat16)
    xs[11, 2] = np.nan
    assert checks.nonfinite(xs).startswith("1 NaN and 0 infinite value(s) (the first at sample 11")
    scores = (16, 3)
    checks.labels("softmax_crossentropy", scores, np.eye(3, dtype=jnp.bfloat16)[YS], "train")
    with pytest.raises(ModelError, match=r"^train: target 0 holds the label 3 at sample 13"):
        checks.labels(
            "softmax_crossentropy",
            scores,
            (YS + (np.arange(16) == 13) * 2).astype(jnp.bfloat16),
            "train",
        )
    with pytest.raises(ModelError, match=r"a class index is a whole number"):
        checks.labels("softmax_crossentropy", scores, (YS + 0.5).astype(jnp.bfloat16), "train")


def test_numerics_check_in_fit_names_the_layer_node() -> None:
    x = Input(name="x")
    net = Model(x, CommandLayer(ops.ewlog(), name="log")(Dense(3, name="fc")(x)), name="net")
    xs, ts = np.ones((4, 2), np.float32), np.zeros((4, 3), np.float32)
    net.compile(xs, loss="mse", minimizer=optax.sgd(0.1))
    weight = -np.ones((3, 2), np.float32)  # fc gives -2 everywhere: log of it is NaN
    net.set_parameters({"t-net-0-fc-0-0": weight})
    with config.override(numerics=True), pytest.raises(NumericsError) as e:
        net.fit(xs, ts)
    text = str(e.value)
    assert text.startswith("model Model('net') fit: Program: node 1 (net-0-log-0, ewlog)")
    assert re.search(r"input +%\d+ \(net-0-fc-0\): f32\[4,3\] min=-2 max=-2 .* nan=0", text)
    np.testing.assert_array_equal(net.parameters()["t-net-0-fc-0-0"], weight)  # not donated
    assert np.isnan(float(net.fit(xs, ts)))  # off by default: no check


def test_conv_and_model_without_lists(clf) -> None:
    x = Input()
    conv = Model(x, Conv(4, 3, name="c")(x))  # a 3x3 kernel; one input, one output
    ctx = BuildContext(False)  # a build only: no parameter values, nothing compiled
    out = conv.build(ctx, ctx.b.input((1, 5, 5, 2), np.float32), nested=False)
    assert out.shape == (1, 5, 5, 4)  # "SAME" padding
    assert {k: p.shape for k, p in ctx.params.items()} == {
        "t-c-0-0": (4, 3, 3, 2),
        "t-c-0-1": (4,),
    }
    params = clf.parameters()  # clf is Model(x, y) without lists: y = x W^T + b
    w, b = np.asarray(params["t-clf-0-fc-0-0"]), np.asarray(params["t-clf-0-fc-0-1"])
    np.testing.assert_allclose(np.asarray(clf.evaluate(XS[:8])), XS[:8] @ w.T + b, rtol=1e-5)


def test_targets_a_named_loss_would_ignore_are_refused(clf) -> None:
    with pytest.raises(
        ModelError, match=r"loss='softmax_crossentropy' takes 1 target .* 3 target\(s\)"
    ):
        clf.fit(XS[:8], [YS[:8], YS[:8] + 1, np.ones((8, 7), np.float32)])
    with pytest.raises(ModelError, match=r"takes 1 target .* but 2 target\(s\) were given"):
        clf.train((XS, [YS, YS]), batch_size=8, verbose=False)
    x = Input()
    noop = Model(x, Dense(1, name="fc")(x))
    noop.compile(XS[:8], loss=None, minimizer=optax.sgd(0.1))
    with pytest.raises(
        ModelError, match=r"loss=None takes no targets, but 1 target\(s\) were given"
    ):
        noop.fit(XS[:8], YS[:8])
    expected = _xent(np.asarray(clf.evaluate(XS[:8])), YS[:8])  # one target still fits
    np.testing.assert_allclose(float(clf.fit(XS[:8], [YS[:8]])), expected, rtol=1e-5)


def test_a_plain_list_of_labels_says_to_make_it_one_array(clf) -> None:
    """fit(x, [0, 1, 2, ...]) was "8 target(s) were given" (a list is a list of
    targets), train and score a raw TypeError; a loss function may still take scalars."""
    labels = [int(v) for v in YS[:8]]
    said = r"targets is a list of 8 numbers \[0, 1, 2, \.\.\.\], but a list holds one array"
    with pytest.raises(ModelError, match=rf"^fit: {said}.*np\.asarray\(the_list\)"):
        clf.fit(XS[:8], labels)
    with pytest.raises(ModelError, match=rf"^train: {said}"):
        clf.train((XS[:8], labels), batch_size=4, verbose=False)
    with pytest.raises(ModelError, match=rf"^score: {said}"):
        clf.score(XS[:8], labels)
    expected = _xent(np.asarray(clf.evaluate(XS[:8])), YS[:8])
    np.testing.assert_allclose(float(clf.fit(XS[:8], np.asarray(labels))), expected, rtol=1e-5)
    x = Input()
    own = Model(x, Dense(3, name="fc")(x))
    own.compile(XS[:8], loss=lambda o, t: jnp.mean(o[0]) * t[0] + t[1], minimizer=optax.sgd(0))
    mean = float(np.mean(np.asarray(own.evaluate(XS[:8]))))
    np.testing.assert_allclose(float(own.fit(XS[:8], [2.0, 1.0])), 2 * mean + 1, rtol=1e-5)


def _stopper() -> Model:
    x = Input(name="x")
    model = Model(x, Dense(3, name="fc")(x))
    model.compile(XS[:8], loss="softmax_crossentropy", minimizer=optax.sgd(1e3))
    return model


def test_one_callback_alone_is_a_list_of_it_and_others_are_named() -> None:
    alone = _stopper().train(
        (XS, YS), epochs=6, batch_size=8, verbose=False,
        callbacks=EarlyStopping(monitor="loss", patience=0),
    )  # fmt: skip
    listed = _stopper().train(
        (XS, YS), epochs=6, batch_size=8, verbose=False,
        callbacks=[EarlyStopping(monitor="loss", patience=0)],
    )  # fmt: skip
    assert alone == listed and alone["epoch"] == [1, 2]  # the loss rose in epoch 2: stop
    model = _stopper()
    expect = r"^train: callbacks\[1\] is str; expected a fnnc.models.Callback instance"
    with pytest.raises(ModelError, match=expect):
        model.train((XS, YS), callbacks=[EarlyStopping(), "early"], verbose=False)
    with pytest.raises(
        ModelError, match=r"callbacks\[0\] is the class EarlyStopping .*EarlyStopping\("
    ):
        model.train((XS, YS), callbacks=[EarlyStopping], verbose=False)
    with pytest.raises(ModelError, match=r"^train: callbacks is str;"):
        model.train((XS, YS), callbacks="early", verbose=False)
    assert model.train_progress.step == 0  # refused before a step


def test_train_refuses_what_it_would_ignore() -> None:
    from fnnc.data import DataFrame

    model = _stopper()
    before = np.asarray(model.parameters()["t-fc-0-0"])
    for epochs in (-1, 1.5, True):
        with pytest.raises(ModelError, match=rf"^train: epochs={epochs!r} .* an int >= 0"):
            model.train((XS, YS), epochs=epochs, verbose=False)
    with pytest.raises(ModelError, match=r"^train: inputs= name the columns of a .*DataFrame"):
        model.train((XS, YS), inputs="a", verbose=False)
    with pytest.raises(ModelError, match=r"^train: targets= .* drop targets="):
        model.train((XS, YS), targets="b", verbose=False)
    np.testing.assert_array_equal(model.parameters()["t-fc-0-0"], before)  # no step ran
    for patience in (-1, 1.5, "2"):
        with pytest.raises(ModelError, match=r"EarlyStopping: patience=.* an int >= 0"):
            EarlyStopping(patience=patience)
    # inputs= naming a validation dataframe's columns is used, as the arrays are
    frame = DataFrame.from_arrays(a=XS, b=YS)
    by_frame = _stopper().train(
        (XS, YS), validation=frame, inputs="a", targets="b", batch_size=8, verbose=False
    )
    by_arrays = _stopper().train((XS, YS), validation=(XS, YS), batch_size=8, verbose=False)
    np.testing.assert_allclose(by_frame["val_loss"], by_arrays["val_loss"], rtol=1e-6)


def test_one_parameter_id_alone_is_not_a_sequence_of_characters() -> None:
    import jax

    model = _stopper()
    model.set_minimizer(optax.sgd(0.0))
    model.set_minimizer(optax.sgd(0.1), params="t-fc-0-0")  # the weight alone learns
    p = {k: np.asarray(v) for k, v in model.parameters().items()}

    def xent(w, b):
        return -jnp.mean(jax.nn.log_softmax(XS[:8] @ w.T + b[None])[np.arange(8), YS[:8]])

    grad = jax.grad(xent)(p["t-fc-0-0"], p["t-fc-0-1"])
    model.fit(XS[:8], YS[:8])
    after = model.parameters()
    np.testing.assert_allclose(after["t-fc-0-0"], p["t-fc-0-0"] - 0.1 * grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(after["t-fc-0-1"], p["t-fc-0-1"])
    with pytest.raises(ModelError, match=r"^set_minimizer: params=3 \(int\); expected a parameter"):
        model.set_minimizer(optax.sgd(0.1), params=3)


def test_set_parameters_names_the_id_and_what_was_given() -> None:
    model = _stopper()
    with pytest.raises(ModelError, match=r"^set_parameters: expected a dict .* got list"):
        model.set_parameters([np.ones((3, 4), np.float32)])
    with pytest.raises(ModelError, match=r"t-fc-0-0 \(layer Dense\('fc'\)\) is float32\[3, 4\]; "
                       r"the value given is 'abc' \(str of <U3\), not numbers"):  # fmt: skip
        model.set_parameters({"t-fc-0-0": "abc"})
    with pytest.raises(ModelError, match=r"t-fc-0-0 .* \(list of object\), not numbers"):
        model.set_parameters({"t-fc-0-0": [[1.0, 2.0], [3.0]]})
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    model.set_parameters({"t-fc-0-0": w.tolist()})  # nested lists of numbers are arrays
    np.testing.assert_array_equal(model.parameters()["t-fc-0-0"], w)


def test_loss_function_errors_state_the_calling_convention() -> None:
    ys = RNG.standard_normal((8, 3)).astype(np.float32)
    for loss, cause in (
        (lambda o, t: jnp.mean((o - t) ** 2), TypeError),  # lists, not arrays
        (lambda o: o[0].sum(), TypeError),  # one argument
    ):
        x = Input()
        model = Model(x, Dense(3, name="fc")(x))
        model.compile(XS[:8], loss=loss, minimizer=optax.sgd(0.1))
        with pytest.raises(ModelError, match=r"^the loss function <lambda> raised TypeError") as e:
            model.fit(XS[:8], ys)
        assert isinstance(e.value.__cause__, cause)
        text = str(e.value)
        assert "fn(outputs, targets) with two lists of arrays, outputs [float32[8, 3]]" in text
    x = Input()  # the convention kept: lists, the mean squared error by NumPy
    model = Model(x, Dense(3, name="fc")(x))
    model.compile(XS[:8], loss=lambda o, t: jnp.mean((o[0] - t[0]) ** 2), minimizer=optax.sgd(0))
    want = np.mean((np.asarray(model.evaluate(XS[:8])) - ys) ** 2)
    np.testing.assert_allclose(float(model.fit(XS[:8], ys)), want, rtol=1e-5)


def test_input_declarations_are_checked_on_every_build():
    x = Input((None, 4), np.int32, name="feat")
    model = Model(x, Embedding(5, 2, name="e")(x), name="m")
    want = (
        r"model Model\('m'\): input 0 \(feat\) is declared Input\(shape \[None, 4\], dtype int32\)"
    )
    with pytest.raises(ModelError, match=want + r" and is given float32\[2, 3, 5\]"):
        model.compile(np.zeros((2, 3, 5), np.float32))
    with pytest.raises(ModelError, match=want + r" and is given int32\[2, 5\]"):
        model.compile(np.zeros((2, 5), np.int32))
    for n in (2, 5):  # None: any batch size; a new size recompiles and checks again
        ids = np.arange(4 * n, dtype=np.int32).reshape(n, 4) % 5
        model.compile(ids)
        table = np.asarray(model.parameters()["t-m-0-e-0-0"])
        np.testing.assert_array_equal(np.asarray(model.evaluate(ids)), table[ids])
    with pytest.raises(ModelError, match=r"input 0 is declared Input\(shape \[3\], dtype any\)"):
        inner = Input((3,))
        outer = Input()
        Model(outer, Model(inner, Dense(2)(inner), name="inner")(outer)).compile(XS)


def test_sharding_rules_without_a_mesh_say_to_pass_one():
    """Megatron rules split over a 'model' axis: with no mesh= the error says so, not
    that the default one-axis data mesh lacks the axis."""
    x = Input()
    model = Model(x, Dense(2, name="d")(x))
    with pytest.raises(ModelError, match=r"parameter_sharding='megatron' gives sharding rules.*"
                       r"no mesh= was given.*jax\.make_mesh"):  # fmt: skip
        model.compile(np.ones((2, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1),
                      parameter_sharding="megatron")  # fmt: skip
