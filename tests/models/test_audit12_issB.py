"""Audit 12 (issues 5, 6, 15, 16, 29): cnnp models as the issues word them."""

from __future__ import annotations

import re

import jax
import numpy as np
import optax
import pytest

from fnnc.models import Dense, ModelError, Sequential


def test_is_trainable_inherit_spelled_as_the_issue_or_nnc_inherits_a_frozen_parent():
    """Issue 5: ``is_trainable`` is "True, False, inherit". ``"inherit"`` (and NNC's -1)
    was kept as a truthy value, so such a layer inside a frozen model trained; the oracle
    is the unchanged weights (SGD would move every one of them)."""
    x = np.ones((2, 4), np.float32)
    model = Sequential(
        [Dense(3, name="a", is_trainable="inherit"), Dense(2, name="b", is_trainable=-1)],
        name="seq",
        is_trainable=False,
    )
    model.compile(x, loss="mse", minimizer=optax.sgd(0.1))
    before = {k: np.asarray(v) for k, v in model.parameters().items()}
    model.fit(x, np.full((2, 2), 5.0, np.float32))
    after = model.parameters()
    assert len(before) == 4
    assert all(np.array_equal(before[k], np.asarray(after[k])) for k in before)
    assert [
        layer.is_trainable for layer in (Dense(1, is_trainable=1), Dense(1, is_trainable=0))
    ] == [
        True,
        False,
    ]


@pytest.mark.parametrize("value", ["false", "no", 2, 0.5, [True]])
def test_is_trainable_of_another_kind_is_a_model_error_naming_the_layer(value):
    """``is_trainable="false"`` was truthy: the layer trained. Now a ModelError."""
    with pytest.raises(ModelError, match=r"Dense\('fc'\): is_trainable=.*expected True, False"):
        Dense(2, name="fc", is_trainable=value)
    layer = Dense(2, name="fc")
    with pytest.raises(ModelError, match="is_trainable="):
        layer.is_trainable = value
    assert layer.is_trainable is None


@pytest.fixture(scope="module")
def adam_model():
    x = np.ones((2, 3), np.float32)
    model = Sequential([Dense(2, name="fc")], name="net")
    model.compile(x, loss="mse", minimizer=optax.adam(0.1))
    model.fit(x, np.zeros((2, 2), np.float32))
    return model, x


@pytest.mark.parametrize(
    "call",
    [
        lambda m, x: m.set_minimizer(optax.adam(0.1), reset="no"),
        lambda m, x: m.evaluate(x, is_test="false"),
        lambda m, x: m.evaluate(x, requires_grad="no"),
        lambda m, x: m.train((x, x[:, :2]), epochs=1, batch_size=2, progress="no"),
        lambda m, x: m.train((x, x[:, :2]), epochs=1, batch_size=2, verbose="no"),
        lambda m, x: m.train((x, x[:, :2]), epochs=1, batch_size=2, stop_on_nan="no"),
    ],
    ids=["reset", "is_test", "requires_grad", "progress", "verbose", "stop_on_nan"],
)
def test_switch_arguments_given_as_strings_are_model_errors_and_change_nothing(adam_model, call):
    """``set_minimizer(reset="no")`` was truthy and dropped Adam's moments (issue 5:
    "optimizer state is never silently reset"); ``evaluate(is_test="false")`` ran in test
    mode. Each is now a ModelError naming the argument; the Adam state is
    unchanged (the oracle: the state before the call)."""
    model, x = adam_model
    before = jax.tree.map(np.asarray, model.engine.optimizer_state("t-net-0-fc-0-0"))
    with pytest.raises(ModelError, match=r"takes True or False.*, got str"):
        call(model, x)
    after = jax.tree.map(np.asarray, model.engine.optimizer_state("t-net-0-fc-0-0"))
    assert jax.tree.all(jax.tree.map(np.array_equal, before, after))
    assert int(np.asarray(jax.tree.leaves(after)[0])) >= 1  # Adam has stepped: not reset


def test_file_and_callback_switches_given_as_strings_are_named_errors(adam_model, tmp_path):
    """``CSVLogger(append="no")`` appended, ``CheckpointEvery(per_epoch="no")`` saved each
    epoch, ``read(strict="no")`` / ``set_parameters(strict="no")`` were strict,
    ``TensorFile(readonly="no")`` refused writes: any str was True. Each is now named."""
    from fnnc.errors import TensorFileError
    from fnnc.io import SafetensorsFile, TensorFile
    from fnnc.models import CheckpointEvery, CSVLogger, TensorBoard

    model, _ = adam_model
    path = tmp_path / "m.sqlite3"
    model.write(path)
    calls = {
        "CSVLogger(append": lambda: CSVLogger(tmp_path / "h.csv", append="no"),
        "TensorBoard(per_step": lambda: TensorBoard(tmp_path / "tb", per_step="no"),
        "CheckpointEvery(per_epoch": lambda: CheckpointEvery(tmp_path / "c", per_epoch="no"),
        "CheckpointEvery(sharded": lambda: CheckpointEvery(tmp_path / "c", steps=1, sharded="no"),
        "read(strict": lambda: model.read(path, strict="no"),
        "set_parameters(strict": lambda: model.set_parameters({}, strict="no"),
        "parameters(gather": lambda: model.parameters(gather="no"),
        "export(check": lambda: model.export(tmp_path / "m.jax", check="no"),
    }
    for what, call in calls.items():
        with pytest.raises(ModelError, match=rf"^{re.escape(what)}=\.\.\.\) takes True or False"):
            call()
    for cls in (TensorFile, SafetensorsFile):
        with pytest.raises(TensorFileError, match=r"readonly=\.\.\.\) takes True or False"):
            cls(path, readonly="no")
    with pytest.raises(ModelError, match=r"keep_last='2' \(str\); expected a positive int"):
        CheckpointEvery(tmp_path / "c", steps=1, keep_last="2")
    assert not (tmp_path / "m.jax").exists() and not (tmp_path / "h.csv").exists()
    assert CSVLogger(tmp_path / "h.csv", append=0).append is False  # NNC's int flags stay
    assert TensorFile(path, readonly=1).readonly is True


def test_compile_takes_the_issue_s_input_specs_keyword():
    """Issue 5 words it ``compile(input_specs, loss=, minimizer=)``; ``input_specs=`` was a
    raw TypeError. One SGD step on ``mse`` matches the closed form (w starts at ``w0``)."""
    import jax

    x = np.ones((2, 3), np.float32)
    model = Sequential([Dense(1, name="fc", no_bias=True)])
    model.compile(
        input_specs=[jax.ShapeDtypeStruct((2, 3), np.float32)],
        loss="mse",
        minimizer=optax.sgd(0.1),
    )
    w0 = np.asarray(model.parameters()["t-fc-0-0"], np.float64)
    model.fit(x, np.zeros((2, 1), np.float32))
    grad = 2 * (x.astype(np.float64) @ w0.T).mean() * np.ones_like(w0)  # d mean((xw)^2)/dw
    np.testing.assert_allclose(model.parameters()["t-fc-0-0"], w0 - 0.1 * grad, rtol=1e-5)
    for args, kwargs in (((), {"loss": "mse"}), ((x,), {"input_specs": x})):
        with pytest.raises(ModelError, match="give the input specs once"):
            Sequential([Dense(2)]).compile(*args, **kwargs)


def test_train_verbose_takes_keras_levels(adam_model, monkeypatch):
    """Keras's ``verbose=2`` is one log line per epoch and no bar, even on a terminal;
    0 and 1 are False and True; other ints and strings are named errors."""
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    model, _ = adam_model
    data = (np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32))
    shown = {}
    for level in (0, 1, 2):
        screen = Terminal()
        monkeypatch.setattr(sys, "stderr", screen)
        model.train(data, epochs=1, batch_size=2, verbose=level)
        shown[level] = screen.getvalue()
    assert shown[0] == ""
    assert "epoch" in shown[1] and "step" in shown[1]  # tqdm's bar, with its unit
    assert shown[2].count("epoch") == 1 and "step" not in shown[2] and ": loss " in shown[2]
    for bad in (3, "2"):
        with pytest.raises(ModelError, match=r"train\(verbose=\.\.\.\) takes True or False"):
            model.train(data, epochs=1, batch_size=2, verbose=bad)


def test_model_memory_is_the_fit_steps_program_memory_and_freezing_shrinks_it():
    """Issue 5: "check it with ``Program.memory()``" had no public way to reach the fit
    step's Program. ``Model.memory(inputs, targets)`` is XLA's analysis of it: freezing a
    64->256 dense drops at least its Adam moments (2 x 256 x 65 float32)."""
    from fnnc.models import Input, Model, ReLU

    x, y = np.ones((8, 64), np.float32), np.zeros(8, np.int32)

    def make(frozen):
        xi = Input()
        h = Dense(256, name="big", is_trainable=not frozen)(xi)
        model = Model(xi, Dense(3, name="out")(ReLU()(h)))
        model.compile(x, loss="softmax_crossentropy", minimizer=optax.adam(1e-3))
        return model

    trainable, frozen = make(False), make(True)
    with pytest.raises(ModelError, match=r"memory needs a training step"):
        frozen.memory()
    saved = trainable.memory(x, y).peak_estimate_bytes - frozen.memory(x, y).peak_estimate_bytes
    assert saved >= 2 * 256 * 65 * 4
    assert frozen.memory().peak_estimate_bytes == frozen.memory(x, y).peak_estimate_bytes
