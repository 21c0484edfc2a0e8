"""Audit of issue 15 (training for real: dataframe on Grain, resumable runs, callbacks,
predict), from the issue text.

Checks: the dataframe (columns, ``map``, ``shuffle``, ``batch``, ``sample``, iterators,
``to_grain``, seeded order, JSON iterator position, ``shard``, NNC tensor-file rows and
memory-mapped arrays); ``Model.train`` on arrays, a dataframe and a Grain dataset, epochs
reshuffled from ``(seed, epoch)`` so repeated calls continue, metrics per epoch, one log
line per epoch off a terminal; callbacks (``CheckpointEvery`` every N steps or per epoch,
``EarlyStopping`` on a validation metric, the NaN stop naming the step and the last good
checkpoint); ``Checkpoints.save(step, model)`` rows ``<id>/<field>`` shown by ``inspect``,
``train(resume=)`` continuing to epoch E (bitwise equal to an uninterrupted run, with
dropout and a shuffled, augmented dataframe), ``restore_into``; ``predict(x, batch_size=)``
and the Keras conveniences; ``to_nnx``; and the bad-input errors the issue lists.
"""

from __future__ import annotations

import json

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.data import DataError, DataFrame
from fnnc.errors import CheckpointError, FnncError, ModelError, NumericsError
from fnnc.io import Checkpoints, TensorFile
from fnnc.models import (
    CheckpointEvery,
    Conv,
    Dense,
    Dropout,
    EarlyStopping,
    Flatten,
    Input,
    Model,
    ReLU,
    Sequential,
)

RNG = np.random.default_rng(15)
X = RNG.standard_normal((24, 4)).astype(np.float32)
Y = (np.argmax(X[:, :3], axis=1)).astype(np.int32)


def mlp(hidden=6, lr=0.05, dropout=0.25):
    x = Input()
    h = Dropout(dropout)(ReLU()(Dense(hidden, name="fc1")(x)))
    model = Model(x, Dense(3, name="fc2")(h))
    model.compile(X[:8], loss="softmax_crossentropy", minimizer=optax.adam(lr))
    return model


def same_parameters(a, b):
    pa, pb = a.parameters(), b.parameters()
    return pa.keys() == pb.keys() and all(np.array_equal(pa[k], pb[k]) for k in pa)


def quiet(model, data, **kw):
    return model.train(data, batch_size=8, verbose=False, **kw)


# -- the dataframe ---------------------------------------------------------------------
def test_map_shuffle_batch_iterate_a_permutation_of_the_rows():
    """map derives a column, shuffle permutes, batch stacks; one epoch sees every row once."""
    df = DataFrame.from_arrays(x=np.arange(10, dtype=np.float32), y=np.arange(10) % 2)
    df = df.map(lambda v: v * 10, "x", "x10").shuffle().batch(4)
    assert df.columns == ("x", "y", "x10") and len(df) == 3
    batches = list(df.iterator(("x", "x10"), seed=1))
    xs = np.concatenate([b[0] for b in batches])
    assert sorted(xs.tolist()) == list(range(10)) and xs.tolist() != list(range(10))
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), xs * 10)


def test_order_is_deterministic_from_seed_and_epoch():
    """The same (seed, epoch) replays the order; another epoch or seed changes it."""
    df = DataFrame.from_arrays(x=np.arange(20)).shuffle()

    def order(seed, epoch):
        return [int(v) for v in df.iterator("x", seed=seed, epoch=epoch)]

    assert order(3, 0) == order(3, 0)
    assert order(3, 0) != order(3, 1)
    assert order(3, 1) != order(4, 1)
    assert sorted(order(3, 1)) == list(range(20))


def test_iterator_position_is_json_and_resumes_with_the_next_rows():
    """get_state() is JSON; set_state on a new iterator continues with exactly the rows
    the first one would have given, across the epoch boundary too."""
    df = DataFrame.from_arrays(x=np.arange(12)).shuffle().batch(5)
    it = df.iterator("x", seed=2, epochs=2)
    for _ in range(2):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    rest = [b.tolist() for b in it]
    resumed = df.iterator("x", seed=2, epochs=2)
    resumed.set_state(state)
    assert [b.tolist() for b in resumed] == rest and len(rest) == 4


def test_shard_gives_disjoint_shares_that_cover_the_rows():
    """shard(index, count) without dropping covers every row once across the shards."""
    df = DataFrame.from_arrays(x=np.arange(10)).shuffle()
    shares = [
        [int(v) for v in df.shard(i, 3, drop_remainder=False).iterator("x", seed=5)]
        for i in range(3)
    ]
    assert sorted(v for share in shares for v in share) == list(range(10))
    dropped = [list(df.shard(i, 3).iterator("x", seed=5)) for i in range(3)]
    assert {len(s) for s in dropped} == {3}


def test_sample_groups_rows_and_reduces_them():
    """sample(n, fn): every n rows become one, fn getting each input column's list."""
    df = DataFrame.from_arrays(x=np.arange(7)).sample(3, lambda xs: int(sum(xs)), inputs="x")
    assert list(df.iterator("sample")) == [3, 12, 6]


def test_to_grain_is_a_grain_map_dataset_of_one_epoch():
    """to_grain: a grain.MapDataset whose elements are the dataframe's rows."""
    df = DataFrame.from_arrays(x=np.arange(6), y=np.arange(6) * 2).batch(3)
    ds = df.to_grain(("x", "y"))
    assert isinstance(ds, grain.MapDataset) and len(ds) == 2
    x, y = ds[1]
    np.testing.assert_array_equal(x, [3, 4, 5])
    np.testing.assert_array_equal(y, [6, 8, 10])


def test_rows_of_an_nnc_tensor_file_and_a_memmap_stream(tmp_path):
    """from_tensor_file reads one tensor per row; from_arrays takes an np.memmap as is."""
    path = str(tmp_path / "rows.sqlite3")
    rows = [RNG.standard_normal(3).astype(np.float32) for _ in range(5)]
    with TensorFile(path) as f:
        for i, r in enumerate(rows):
            f.write(f"x-{i}", r)
    df = DataFrame.from_tensor_file(path, "x-{}")
    got = list(df.iterator("tensor"))
    assert len(got) == 5
    for g, r in zip(got, rows):
        np.testing.assert_array_equal(g, r)
    mm_path = tmp_path / "big.npy"
    np.save(mm_path, np.arange(40, dtype=np.float32).reshape(10, 4))
    mm = np.load(mm_path, mmap_mode="r")
    batches = list(DataFrame.from_arrays(x=mm).batch(4).iterator("x"))
    np.testing.assert_array_equal(np.concatenate(batches), np.asarray(mm))


# -- Model.train ------------------------------------------------------------------------
def test_train_takes_arrays_a_dataframe_and_a_grain_dataset_alike():
    """Unshuffled, the same batches give the same parameters from each kind of data."""
    frame = DataFrame.from_arrays(x=X, y=Y).batch(8)
    data = grain.MapDataset.source(list(range(3))).map(
        lambda i: (X[8 * i : 8 * i + 8], Y[8 * i : 8 * i + 8])
    )
    a, b = mlp(dropout=0.0), mlp(dropout=0.0)
    quiet(a, frame, epochs=2)
    quiet(b, data, epochs=2)
    assert same_parameters(a, b)


def test_two_calls_of_one_epoch_on_a_dataframe_continue_the_shuffled_sequence():
    """train(df, epochs=1) twice equals train(df, epochs=2): epoch 2 is reshuffled from
    (seed, 1), not replayed from epoch 0."""
    frame = DataFrame.from_arrays(x=X, y=Y).shuffle()
    a, b = mlp(), mlp()
    quiet(a, frame, epochs=2)
    quiet(b, frame, epochs=1)
    quiet(b, frame, epochs=1)
    assert same_parameters(a, b)
    first = DataFrame.from_arrays(x=X, y=Y).shuffle().batch(8).iterator("y", epoch=0)
    second = DataFrame.from_arrays(x=X, y=Y).shuffle().batch(8).iterator("y", epoch=1)
    assert [v.tolist() for v in first] != [v.tolist() for v in second]


def test_history_has_loss_and_validation_metrics_per_epoch():
    """The history holds per-epoch loss, val_loss, val_accuracy and user metrics."""
    model = mlp()
    history = quiet(
        model,
        (X, Y),
        epochs=3,
        validation=(X, Y),
        metrics={"mean_max": lambda o, t: float(np.mean(np.max(np.asarray(o), -1)))},
    )
    assert history["epoch"] == [1, 2, 3]
    for key in ("loss", "val_loss", "val_accuracy", "val_mean_max"):
        assert len(history[key]) == 3, key
    logits = np.asarray(model.predict(X))
    assert history["val_mean_max"][-1] == pytest.approx(float(np.mean(logits.max(-1))), rel=1e-5)
    assert history["val_accuracy"][-1] == pytest.approx(float(np.mean(logits.argmax(-1) == Y)))


def test_training_accuracy_per_epoch_without_validation():
    """train(metrics=["accuracy"]) records the accuracy of each epoch in the history."""
    history = quiet(mlp(), (X, Y), epochs=2, metrics=["accuracy"])
    assert len(history["accuracy"]) == 2


def test_one_log_line_per_epoch_when_stderr_is_not_a_terminal(capsys):
    """Off a terminal, train prints one plain line per epoch (a job log shows progress)."""
    mlp().train((X, Y), epochs=2, batch_size=8)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("epoch 1/2: loss ") and lines[1].startswith("epoch 2/2: loss ")


def test_a_tqdm_bar_per_epoch_when_stderr_is_a_terminal(monkeypatch):
    """On a terminal (stderr.isatty()), train draws a tqdm bar per epoch by default."""
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    mlp().train((X, Y), epochs=2, batch_size=8)
    shown = screen.getvalue()
    assert "epoch 1/2" in shown and "epoch 2/2" in shown
    assert "3/3" in shown and "step" in shown  # tqdm's counter and unit


# -- callbacks and resuming -----------------------------------------------------------
def test_checkpoint_rows_are_id_slash_field_and_inspect_shows_them(tmp_path, capsys):
    """Checkpoints.save(step, model): parameters and Adam rows t-fc1-0-0/mu, /nu, readable
    in ``python -m fnnc inspect``; the metadata holds step, epoch, RNG and data position."""
    from fnnc.io.cli import main

    path = str(tmp_path / "run.ckpt")
    model = mlp()
    quiet(model, (X, Y), epochs=1, callbacks=[CheckpointEvery(path, steps=1)])
    with Checkpoints(path) as ckpt:
        assert ckpt.steps() == [1, 2, 3]
        names = ckpt.file.names()
        saved = ckpt.restore().metadata["fnnc.train"]
    for field in ("mu", "nu"):
        assert any(n.endswith(f"[t-fc1-0-0/{field}]") for n in names), names
    assert saved["step"] == 3 and (saved["epoch"], saved["batch"]) == (0, 3)
    assert "rng" in saved and "data" in saved
    assert main(["inspect", path]) == 0
    shown = capsys.readouterr().out
    assert "t-fc1-0-0/mu" in shown and "t-fc2-0-1/nu" in shown


class StopAt:
    """A callback that ends the run after step ``at`` (as a killed job would, after its save)."""

    def __init__(self, at):
        self.at = at

    def on_train_begin(self, loop): ...
    def on_step_end(self, loop, step, loss):
        loop.stop = step == self.at

    def on_epoch_end(self, loop, epoch, logs): ...
    def on_train_end(self, loop): ...


def test_resume_mid_epoch_equals_an_uninterrupted_run_bitwise(tmp_path):
    """Stopped at step 4 (inside epoch 2) after a save, a fresh model's
    train(epochs=2, resume=path) equals 2 uninterrupted epochs: parameters and Adam state
    bitwise, with dropout (RNG state) and a shuffled, randomly augmented dataframe (data
    position)."""
    frame = (
        DataFrame.from_arrays(x=X, y=Y)
        .map(
            lambda x, rng: x + rng.normal(0, 0.1, x.shape).astype(np.float32), "x", "x", random=True
        )
        .shuffle()
    )
    whole = mlp()
    quiet(whole, frame, epochs=2)
    path = str(tmp_path / "run.ckpt")
    first = mlp()
    quiet(first, frame, epochs=2, callbacks=[CheckpointEvery(path, steps=2), StopAt(4)])
    assert first.train_progress.step == 4 and not same_parameters(first, whole)
    resumed = mlp()
    history = quiet(resumed, frame, epochs=2, resume=path)
    assert history["epoch"] == [2]
    assert same_parameters(resumed, whole)
    for pid in ("t-fc1-0-0", "t-fc2-0-1"):
        got = jax.tree.leaves(resumed.engine.optimizer_state(pid))
        want = jax.tree.leaves(whole.engine.optimizer_state(pid))
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def test_resume_given_a_checkpoints_object_and_restore_into_without_training(tmp_path):
    """resume= takes a Checkpoints; restore_into(model) restores the weights alone."""
    path = str(tmp_path / "run.ckpt")
    a = mlp()
    quiet(a, (X, Y), epochs=1, callbacks=[CheckpointEvery(path, steps=2)])
    with Checkpoints(path) as ckpt:
        b = mlp()
        restored = ckpt.restore_into(b)
        assert restored.step == 2
        c = mlp()
        history = quiet(c, (X, Y), epochs=1, resume=ckpt)
    assert b.train_progress.step == 2
    assert history["epoch"] == [1] and c.train_progress.step == 3
    assert same_parameters(a, c)


def test_early_stopping_on_a_validation_metric_in_max_mode():
    """EarlyStopping(monitor='val_accuracy', patience=1) stops when accuracy stalls."""
    model = mlp(lr=0.0)  # nothing changes: accuracy never improves after epoch 1
    stop = EarlyStopping("val_accuracy", patience=1)
    history = quiet(model, (X, Y), epochs=10, validation=(X, Y), callbacks=[stop])
    assert history["epoch"] == [1, 2, 3] and stop.stopped_epoch == 2


def test_nan_loss_stops_by_default_naming_the_step_and_last_checkpoint(tmp_path):
    """Weights gone NaN stop training with a NumericsError naming the step and the last
    good checkpoint: CheckpointEvery finds them at step 2's save (the loss of step 3
    would be NaN) and names step 1, the last saved with finite weights."""
    path = str(tmp_path / "run.ckpt")
    model = mlp()

    class Poison:
        def on_train_begin(self, loop): ...
        def on_step_end(self, loop, step, loss):
            if step == 2:
                loop.model.set_parameters({"t-fc2-0-1": np.full(3, np.nan, np.float32)})

        def on_epoch_end(self, loop, epoch, logs): ...
        def on_train_end(self, loop): ...

    with pytest.raises(NumericsError, match=r"after step 2 are not finite.*step 1 in"):
        quiet(model, (X, Y), epochs=1, callbacks=[CheckpointEvery(path, steps=1), Poison()])
    with Checkpoints(path) as ckpt:
        assert ckpt.steps() == [1]  # step 2, not finite, was not saved


def test_an_infinite_loss_also_stops_with_the_step():
    """An infinite loss (not only NaN) stops training with a NumericsError naming the step."""
    x = Input()
    model = Model(x, Dense(2, name="fc")(x))
    model.compile(X[:8], loss="mse", minimizer=optax.sgd(0.0))
    model.set_parameters({"t-fc-0-1": np.full(2, 1e30, np.float32)})  # squared: inf
    targets = np.zeros((24, 2), np.float32)
    with pytest.raises(NumericsError, match=r"inf at step 1"):
        model.train((X, targets), epochs=1, batch_size=8, verbose=False)


def test_resume_from_another_models_checkpoint_lists_what_differs(tmp_path):
    """A resume checkpoint of another model names the parameters that differ."""
    path = str(tmp_path / "run.ckpt")
    quiet(mlp(hidden=6), (X, Y), epochs=1, callbacks=[CheckpointEvery(path, per_epoch=True)])
    with pytest.raises(CheckpointError, match=r"t-fc1-0-0"):
        quiet(mlp(hidden=7), (X, Y), epochs=2, resume=path)


# -- bad input ------------------------------------------------------------------------
def test_a_raising_map_names_the_column_and_the_sample_index():
    """A map that raises gives a DataError naming the column and the row."""

    def bad(v):
        if v == 7:
            raise ValueError("seven")
        return v

    df = DataFrame.from_arrays(x=np.arange(10)).map(bad, "x", "checked")
    with pytest.raises(DataError, match=r"column 'checked' failed on row 7.*seven"):
        list(df.iterator("checked"))


def test_element_shapes_changing_mid_epoch_are_a_data_error():
    """Rows of different shapes in one batch: a DataError naming the column."""
    rows = [np.zeros(3, np.float32)] * 3 + [np.zeros(2, np.float32)]
    df = DataFrame.from_sequence(rows, "x").batch(4)
    with pytest.raises(DataError, match=r"column 'x' changes shape.*row 3 has shape \(2,\)"):
        list(df.iterator("x"))


# -- predict and Keras conveniences -----------------------------------------------------
def test_predict_in_batches_equals_evaluate_in_test_mode():
    """predict(x, batch_size=) over 13 rows in batches of 5 equals evaluate (dropout off)."""
    model = mlp()
    xs = RNG.standard_normal((13, 4)).astype(np.float32)  # 3 batches, the last short
    got = model.predict(xs, batch_size=5)
    assert got.shape == (13, 3)
    np.testing.assert_allclose(got, model.evaluate(xs, is_test=True), rtol=1e-5, atol=1e-6)


def test_keras_conveniences_bare_arrays_square_kernel_single_tensors():
    """fit(x, y) / evaluate(x) take bare arrays; Conv(16, 3) is a 3x3 kernel;
    Model(inp, out) takes single tensors."""
    inp = Input()
    out = Dense(2, name="fc")(Flatten()(Conv(16, 3, name="conv")(inp)))
    model = Model(inp, out)
    images = RNG.standard_normal((4, 5, 5, 1)).astype(np.float32)
    model.compile(images, loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    assert model.parameters()["t-conv-0-0"].shape == (16, 3, 3, 1)
    assert np.isfinite(float(model.fit(images, np.array([0, 1, 0, 1], np.int32))))
    assert np.asarray(model.evaluate(images)).shape == (4, 2)


def test_accuracy_metric_takes_labels_one_hot_and_soft_targets():
    """score(metrics=['accuracy']): integer labels, one-hot and mixup-soft targets agree."""
    model = mlp()
    logits = np.asarray(model.predict(X))
    want = float(np.mean(logits.argmax(-1) == Y))
    soft = 0.7 * np.eye(3, dtype=np.float32)[Y] + 0.1
    for targets in (Y, np.eye(3, dtype=np.float32)[Y], soft):
        assert model.score(X, targets, metrics=["accuracy"])["accuracy"] == pytest.approx(want)


def test_a_compiled_model_inside_flax_nnx_has_its_parameters_by_id():
    """model.to_nnx(): an nnx.Module whose nnx.Params are the parameters by id; its
    gradient equals jax.grad of the same function on those arrays."""
    from flax import nnx

    x = Input()
    model = Model(x, Dense(2, name="fc")(x))
    model.compile(X[:8], loss="mse", minimizer=optax.sgd(0.1))
    module = model.to_nnx()
    params = nnx.state(module, nnx.Param)
    flat = {str(path[-1]): v for path, v in nnx.to_flat_state(params)}
    assert set(flat) == {"t-fc-0-0", "t-fc-0-1"}
    np.testing.assert_allclose(module(X[:8]), model.evaluate(X[:8]), rtol=1e-6, atol=1e-6)
    grads = nnx.grad(lambda m: jnp.sum(m(X[:8]) ** 2))(module)
    p = model.parameters()
    want = jax.grad(lambda w, b: jnp.sum((X[:8] @ w.T + b[None, :]) ** 2), argnums=(0, 1))(
        p["t-fc-0-0"], p["t-fc-0-1"]
    )
    gflat = {str(path[-1]): v for path, v in nnx.to_flat_state(grads)}
    np.testing.assert_allclose(gflat["t-fc-0-0"][...], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gflat["t-fc-0-1"][...], want[1], rtol=1e-5, atol=1e-5)


def test_sequential_trains_on_a_dataframe_with_named_columns():
    """train(df, inputs=, targets=) picks the columns by name."""
    model = Sequential([Dense(3, name="fc")])
    model.compile(X[:8], loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    frame = DataFrame.from_arrays(label=Y, features=X)
    history = model.train(
        frame, epochs=1, batch_size=8, inputs="features", targets="label", verbose=False
    )
    assert len(history["loss"]) == 1 and np.isfinite(history["loss"][0])
    assert issubclass(DataError, FnncError) and issubclass(ModelError, FnncError)
