"""Model.train: data sources, epoch sequence, metrics, callbacks, resuming, bad input."""

from __future__ import annotations

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.data import DataFrame
from fnnc.errors import CheckpointError, DataError, ModelError, NumericsError
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
    minimizers,
)
from fnnc.models.training import accuracy

RNG = np.random.default_rng(0)
X = RNG.standard_normal((48, 4)).astype(np.float32)
Y = np.argmax(X[:, :3], axis=1).astype(np.int32)


def mlp(hidden=8, lr=0.05):
    x = Input()
    h = Dropout(0.2)(ReLU()(Dense(hidden, name="fc1")(x)))
    model = Model(x, Dense(3, name="fc2")(h))
    model.compile(X[:8], loss="softmax_crossentropy", minimizer=optax.adam(lr))
    return model


def same(a, b):
    pa, pb = a.parameters(), b.parameters()
    return pa.keys() == pb.keys() and all(np.array_equal(pa[k], pb[k]) for k in pa)


def test_two_calls_of_one_epoch_continue_the_sequence_of_one_call_of_two():
    a, b = mlp(), mlp()
    ha = a.train((X, Y), epochs=2, batch_size=8, verbose=False)
    b.train((X, Y), epochs=1, batch_size=8, verbose=False)
    hb = b.train((X, Y), epochs=1, batch_size=8, verbose=False)
    assert same(a, b)
    assert hb["epoch"] == [2] and hb["loss"] == ha["loss"][1:]
    assert (b.train_progress.epoch, b.train_progress.step) == (2, 12)


def test_epochs_reshuffle_from_seed_and_epoch():
    from fnnc.models.batches import batches

    def first_labels(data, seed, epoch):
        return next(batches(data, batch_size=8, seed=seed).epoch(epoch, 0, None))[1][0].tolist()

    for data in ((X, Y), DataFrame.from_arrays(x=X, y=Y)):
        assert first_labels(data, 0, 0) != first_labels(data, 0, 1)
        assert first_labels(data, 0, 1) == first_labels(data, 0, 1)
        assert first_labels(data, 0, 1) != first_labels(data, 1, 1)


@pytest.mark.parametrize("kind", ["arrays", "frame", "frame-threads", "grain"])
def test_resume_mid_epoch_is_exact(tmp_path, kind):
    # train reads each batch while the step before runs: the position saved with a
    # step must still be that step's own (in the calling thread and with Grain threads)
    frame = DataFrame.from_arrays(x=X, y=Y)
    data = {
        "arrays": (X, Y),
        "frame": frame,
        "frame-threads": frame.read_with(threads=2, prefetch=3),
        "grain": grain.MapDataset.source(list(range(6)))
        .map(lambda i: (X[8 * i : 8 * i + 8], Y[8 * i : 8 * i + 8]))
        .shuffle(seed=3),
    }[kind]
    full = mlp()
    whole = full.train(data, epochs=2, batch_size=8, verbose=False)
    path = tmp_path / "run.ckpt"

    class Stop:
        def on_train_begin(self, loop): ...
        def on_step_end(self, loop, step, loss):
            loop.stop = step == 8  # inside epoch 2, after the save of step 8

        def on_epoch_end(self, loop, epoch, logs): ...
        def on_train_end(self, loop): ...

    first = mlp()
    callbacks = [CheckpointEvery(str(path), steps=4), Stop()]
    first.train(data, epochs=2, batch_size=8, callbacks=callbacks, verbose=False)
    assert first.train_progress.step == 8 and not same(first, full)
    went_on = first.train(data, epochs=1, batch_size=8, verbose=False)  # in this process
    assert first.train_progress.step == 12 and same(first, full)
    resumed = mlp()
    history = resumed.train(data, epochs=2, batch_size=8, resume=str(path), verbose=False)
    assert history["epoch"] == [2]
    assert same(resumed, full)
    # the resumed epoch's loss is the mean over all its batches, those before the stop too
    assert history["loss"] == went_on["loss"] == whole["loss"][1:]


def test_resume_from_an_empty_journal_starts_and_per_epoch_saves(tmp_path):
    path = str(tmp_path / "run.ckpt")
    a = mlp()
    cb = [CheckpointEvery(path, per_epoch=True)]
    a.train((X, Y), epochs=1, batch_size=8, resume=path, callbacks=cb, verbose=False)
    a.train((X, Y), epochs=2, batch_size=8, resume=path, callbacks=cb, verbose=False)
    b = mlp()
    b.train((X, Y), epochs=2, batch_size=8, verbose=False)
    assert same(a, b)
    with Checkpoints(path) as ckpt:
        assert ckpt.steps() == [6, 12]
        meta = ckpt.restore().metadata
    assert meta["fnnc.train"]["epoch"] == 2 and "loss" in meta


def test_restore_into_another_model_lists_what_differs(tmp_path):
    path = str(tmp_path / "run.ckpt")
    with Checkpoints(path) as ckpt:
        ckpt.save(1, mlp())
        other = mlp(hidden=16)
        x = Input()
        extra = Model(x, Dense(3, name="fc2")(Dense(8, name="fc1")(Dense(4, name="fc0")(x))))
        extra.compile(X[:8], loss="softmax_crossentropy", minimizer=optax.adam(0.1))
        with pytest.raises(CheckpointError, match=r"shape mismatches: t-fc1-0-0: saved \[8, 4\]"):
            ckpt.restore_into(other)
        with pytest.raises(CheckpointError, match=r"missing .*t-fc0-0-0"):
            ckpt.restore_into(extra)
    with pytest.raises(CheckpointError, match="not of model"):
        other.train((X, Y), epochs=1, batch_size=8, resume=path, verbose=False)


def test_nan_loss_stops_naming_the_step_and_last_checkpoint(tmp_path):
    path = str(tmp_path / "run.ckpt")
    model = mlp()

    class Poison:  # weights blow up after step 3: step 4's loss is NaN
        def on_train_begin(self, loop): ...
        def on_step_end(self, loop, step, loss):
            if step == 3:
                params = loop.model.parameters()
                loop.model.set_parameters({"t-fc2-0-0": params["t-fc2-0-0"] * np.nan})

        def on_epoch_end(self, loop, epoch, logs): ...
        def on_train_end(self, loop): ...

    cb = [CheckpointEvery(path, steps=2), Poison()]
    with pytest.raises(NumericsError, match=r"loss is nan at step 4 .*checkpoint is step 2 in"):
        model.train((X, Y), epochs=1, batch_size=8, callbacks=cb, verbose=False)
    with Checkpoints(path) as ckpt:
        assert ckpt.steps() == [2]
    with pytest.raises(NumericsError, match="No checkpoint was saved"):
        model.train((X, Y), epochs=1, batch_size=8, verbose=False)
    history = model.train((X, Y), epochs=1, batch_size=8, stop_on_nan=False, verbose=False)
    assert np.isnan(history["loss"][0])


def test_a_frame_whose_shapes_change_inside_a_batch_surfaces_the_data_error():
    rows = [np.zeros(4, np.float32)] * 5 + [np.zeros(3, np.float32)] + [np.zeros(4, np.float32)] * 2
    frame = DataFrame.from_sequence([(r, 0) for r in rows], ["x", "y"]).batch(4)
    with pytest.raises(DataError, match=r"train: epoch 0, batch 1: .*changes shape"):
        mlp().train(frame, epochs=1, batch_size=4, verbose=False)


def test_a_frame_batched_too_large_names_its_own_batch_not_batch_size():
    frame = DataFrame.from_arrays(x=X[:4], y=Y[:4])
    with pytest.raises(DataError, match=r"batch\(8,drop\): the dataframe has 4 rows"):
        frame.batch(8, drop_remainder=True)  # reported when described, before train
    empty = DataFrame.from_arrays(x=X[:0], y=Y[:0]).batch(8, drop_remainder=True)
    with pytest.raises(ModelError, match=r"no batches \(its own batch\(8,drop\)") as e:
        mlp().train(empty, verbose=False)
    assert "32" not in str(e.value)  # train's default batch_size, unused
    with pytest.raises(ModelError, match=r"no batches \(batch_size=32,"):
        mlp().train(frame, verbose=False)


def test_a_failing_map_is_raised_after_the_step_before_it_ran_its_callbacks(tmp_path):
    def fail_on_row_20(x, row):
        if row == 20:
            raise ValueError("bad row")
        return x

    frame = DataFrame.from_arrays(x=X, y=Y, row=np.arange(48))
    frame = frame.map(fail_on_row_20, ["x", "row"], "x2").batch(8)
    seen = []

    class Record:
        def on_train_begin(self, loop): ...
        def on_step_end(self, loop, step, loss):
            seen.append(step)

        def on_epoch_end(self, loop, epoch, logs): ...
        def on_train_end(self, loop): ...

    model = mlp()
    with pytest.raises(DataError, match=r"train: epoch 0, batch 2: .*bad row"):
        model.train(frame, epochs=1, inputs="x2", targets="y", callbacks=[Record()], verbose=False)
    assert seen == [1, 2] and model.train_progress.step == 2


def test_a_streamed_bad_label_is_caught_in_its_own_batch():
    labels = Y.copy()
    labels[21] = 7  # batch 2 of 8 rows, read in order (a batched frame is not reshuffled)
    frame = DataFrame.from_arrays(x=X, y=labels).batch(8)
    model = mlp()
    message = r"^train: epoch 0, batch 2: fit: target 0 holds the label 7"
    with pytest.raises(ModelError, match=message):
        model.train(frame, epochs=1, verbose=False)
    assert model.train_progress.step == 2


def test_validation_metrics_one_hot_soft_and_user_metrics():
    model = mlp()
    soft = 0.9 * np.eye(3, dtype=np.float32)[Y] + 0.1 / 3
    history = model.train(
        (X, Y),
        epochs=2,
        batch_size=8,
        validation=(X, np.eye(3)[Y]),
        metrics={"accuracy": accuracy, "top": lambda o, t: float(np.mean(o.max(-1)))},
        verbose=False,
    )
    assert {"val_loss", "val_accuracy", "val_top"} <= history.keys()
    logits = model.predict(X)
    assert accuracy(logits, Y) == accuracy(logits, soft) == accuracy(logits, np.eye(3)[Y])
    # without validation, the metrics asked for are measured on the training data
    history = model.train((X, Y), epochs=1, batch_size=8, metrics=["accuracy"], verbose=False)
    assert history["accuracy"] == [pytest.approx(accuracy(model.predict(X), Y))]
    assert "val_accuracy" not in history and len(history["loss"]) == 1


def test_early_stopping_and_log_lines(capsys):
    model = mlp(lr=0.0)  # nothing improves
    stop = EarlyStopping(patience=1)
    history = model.train((X, Y), epochs=6, batch_size=8, validation=(X, Y), callbacks=[stop])
    assert len(history["epoch"]) == 3 and stop.stopped_epoch == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and lines[0].startswith("epoch 1/6: loss ")
    with pytest.raises(ModelError, match="no metric 'val_loss'"):
        model.train((X, Y), epochs=1, batch_size=8, callbacks=[stop], verbose=False)


def test_keras_conveniences_bare_arrays_square_kernels_single_tensors():
    model = Sequential([Conv(4, 3, name="conv"), ReLU(), Flatten(), Dense(2, name="out")])
    images = RNG.standard_normal((10, 5, 5, 1)).astype(np.float32)
    model.compile(images[:4], loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    assert model.parameters()["t-conv-0-0"].shape == (4, 3, 3, 1)
    loss = model.fit(images[:4], np.zeros(4, np.int32))
    assert np.isfinite(float(loss))
    assert model.evaluate(images[:4]).shape == (4, 2)
    assert model.predict(images, batch_size=3).shape == (10, 2)
    x = Input()
    two = Model(x, [Dense(2, name="a")(x), Dense(1, name="b")(x)])
    two.compile(X[:4], loss=None, minimizer=optax.sgd(0.1))
    a, b = two.predict(X, batch_size=5)
    assert a.shape == (48, 2) and b.shape == (48, 1)
    with pytest.raises(ModelError, match="CheckpointEvery"):
        CheckpointEvery("x.ckpt")


def test_predict_on_zero_samples_has_the_shapes_and_dtypes_of_evaluate():
    x = Input()
    two = Model(x, [Dense(3, name="a")(x), Dense(1, name="b")(x)])
    two.compile(X[:4], loss=None, minimizer=optax.sgd(0.1))
    empty = X[:0]
    outs = two.predict(empty, batch_size=5)
    for got, want in zip(outs, two.evaluate(empty), strict=True):
        assert got.shape == np.shape(want) == (0, got.shape[1])
        assert got.dtype == np.asarray(want).dtype
    assert [o.shape for o in outs] == [(0, 3), (0, 1)]


def _nan_gradient_run(tmp_path, **train):
    """Steps 1-2 train normally; from step 3 the loss stays finite but its gradient is
    NaN (jnp.where's untaken branch: sqrt of a negative). ``(saver of every step, run)``."""

    def loss(outs, tgts):
        o, c = outs[0], tgts[0][:, None]  # c: -1e9 (sqrt taken, fine) or 1e6 (the trap)
        return jnp.mean(jnp.where(o > c, jnp.sqrt(o - c), o**2))

    cut = np.where(np.arange(5) < 2, -1e9, 1e6).astype(np.float32)
    data = grain.MapDataset.range(5).map(lambda i: (X[i * 8 : i * 8 + 8], np.full(8, cut[i])))
    x = Input()
    model = Model(x, Dense(2, name="fc")(x))
    model.compile(X[:8], loss=loss, minimizer=optax.sgd(1e-2))
    saver = CheckpointEvery(str(tmp_path / "run.ckpt"), steps=1)
    return saver, lambda: model.train(data, callbacks=[saver], verbose=False, **train)


def _saved_finite(path):
    with Checkpoints(path) as ckpt:
        return {s: all(np.isfinite(v).all() for v in ckpt.restore(s).state.values())
                for s in ckpt.steps()}  # fmt: skip


def test_weights_made_nan_by_a_finite_loss_are_not_saved_nor_called_good(tmp_path):
    saver, run = _nan_gradient_run(tmp_path)
    with pytest.raises(
        NumericsError,
        match=r"after step 3 are not finite \(t-fc-0-0, t-fc-0-1"
        r"\).*last good checkpoint is step 2 in .*restore_into\(model, 2\)",
    ):
        run()
    assert _saved_finite(saver.target) == {1: True, 2: True}  # step 3 not saved


def test_trained_on_regardless_the_nan_weights_are_saved_but_not_good(tmp_path):
    saver, run = _nan_gradient_run(tmp_path, stop_on_nan=False)
    run()
    assert _saved_finite(saver.target) == {1: True, 2: True, 3: False, 4: False, 5: False}
    assert saver.last_good() == 2  # what a NumericsError would name


def test_a_nan_loss_trained_on_still_saves_its_progress(tmp_path):
    path = str(tmp_path / "run.ckpt")
    bad = X.copy()
    bad[0, 0] = np.nan  # the first batch's loss is NaN
    model = mlp()
    with pytest.warns(RuntimeWarning, match="NaN"):
        history = model.train(
            (bad, Y), epochs=1, batch_size=8, stop_on_nan=False,
            callbacks=[CheckpointEvery(path, steps=1)], verbose=False,
        )  # fmt: skip
    assert np.isnan(history["loss"][0])
    with Checkpoints(path) as ckpt:
        saved = ckpt.restore().metadata["fnnc.train"]
    assert saved["loss_sum"] is None and saved["loss_count"] == 6


def test_early_stopping_progress_survives_resume_and_consecutive_train_calls(tmp_path):
    """EarlyStopping on the training loss in max mode (a falling loss never improves)
    with patience 2 stops an uninterrupted run after 4 epochs (the oracle). A run saved
    after epoch 2 (CheckpointEvery listed first: it saves after EarlyStopping's epoch)
    and resumed by a fresh model with a fresh EarlyStopping stops at the same epoch with
    the same weights; so do four train(epochs=1) calls given one EarlyStopping."""

    def stop():
        return EarlyStopping("loss", patience=2, mode="max")

    whole, early = mlp(), stop()
    whole.train((X, Y), epochs=10, batch_size=8, callbacks=[early], verbose=False)
    assert whole.train_progress.epoch == 4 and early.stopped_epoch == 3

    path = str(tmp_path / "run.ckpt")
    first = mlp()
    first.train((X, Y), epochs=2, batch_size=8, verbose=False,
                callbacks=[CheckpointEvery(path, per_epoch=True), stop()])  # fmt: skip
    with Checkpoints(path) as ckpt:
        assert ckpt.restore().metadata["fnnc.callbacks"]["EarlyStopping/0"]["wait"] == 1
    resumed, later = mlp(), stop()
    history = resumed.train((X, Y), epochs=10, batch_size=8, resume=path, callbacks=[later],
                            verbose=False)  # fmt: skip
    assert history["epoch"] == [3, 4] and later.stopped_epoch == 3
    assert same(whole, resumed)

    calls, one = mlp(), stop()
    for _ in range(10):
        calls.train((X, Y), epochs=1, batch_size=8, callbacks=[one], verbose=False)
        if one.stopped_epoch is not None:
            break
    assert calls.train_progress.epoch == 4 and same(whole, calls)
    one.reset()
    assert (one.best, one.wait) == (None, 0)


@pytest.mark.parametrize(
    "opt",
    [
        optax.adam(optax.linear_schedule(1e-2, 1e-3, 4)),  # the README's chain: 0/mu, 1/count
        optax.adam(1e-2),
        minimizers.adam(1e-2),  # NNC's names: momentum, velocity
    ],
    ids=["adam-schedule", "adam", "minimizers-adam"],
)
def test_checkpoint_optimizer_rows_are_id_then_the_path_in_the_optimizer_state(tmp_path, opt):
    """The rows the README and the checkpoints guide describe: ``<id>/<path>``, the path
    as optax's own state tree spells it (jax.tree_util keys joined by ``/``): its field
    names, with the positions in chains kept only where the names alone repeat (the
    schedule's chain has two ``count``s)."""
    x = Input()
    model = Model(x, Dense(3, name="fc")(x))
    model.compile(X[:8], loss="softmax_crossentropy", minimizer=opt)
    save = CheckpointEvery(str(tmp_path / "run.ckpt"), per_epoch=True)
    model.train((X[:16], Y[:16]), epochs=1, batch_size=8, callbacks=[save], verbose=False)
    with TensorFile(str(tmp_path / "run.ckpt")) as f:
        rows = {n for n in f.names() if n.startswith("__ckpt-2__[t-fc-0-0/")}
    leaves = jax.tree_util.tree_flatten_with_path(opt.init(np.zeros((3, 4), np.float32)))[0]
    names = [[str(k.name) for k in path if hasattr(k, "name")] for path, _ in leaves]
    paths = ["/".join(n) for n in names]
    if len(set(paths)) != len(paths):
        paths = ["/".join(str(getattr(k, "name", getattr(k, "idx", k))) for k in path)
                 for path, _ in leaves]  # fmt: skip
    assert rows == {f"__ckpt-2__[t-fc-0-0/{p}]" for p in paths}, sorted(rows)


def test_epoch_loss_is_the_mean_over_rows_with_a_short_last_batch():
    """23 rows in batches of 10, 10, 3 (a batched dataframe; train's own batches of
    arrays drop the short one): with the weights kept (learning rate 0) the epoch's loss
    is the loss of the whole set, in NumPy (Keras weighs each step by its rows); the
    mean of the step losses (as before) weighed the short batch's 3 rows as 10."""
    x, y = X[:23], Y[:23]
    inp = Input()
    model = Model(inp, Dense(3, name="o")(inp))
    model.compile(x[:4], loss="softmax_crossentropy", minimizer=optax.sgd(0.0))
    p = {k: np.asarray(v, np.float64) for k, v in model.parameters().items()}
    z = x @ p["t-o-0-0"].T + p["t-o-0-1"]
    z -= z.max(-1, keepdims=True)
    per_row = np.log(np.exp(z).sum(-1)) - z[np.arange(23), y]
    want = float(per_row.mean())
    assert abs(np.mean([per_row[i : i + 10].mean() for i in (0, 10, 20)]) - want) > 1e-3
    history = model.train(DataFrame.from_arrays(x=x, y=y).batch(10), epochs=1, verbose=False)
    assert history["loss"] == [pytest.approx(want, rel=1e-5)]


def test_epoch_loss_of_a_checkpoint_without_rows_weighs_its_steps_as_the_next():
    """A checkpoint saved before rows were counted holds the plain sum of its steps'
    losses: they weigh as the next step's rows (full batches, mid-epoch)."""
    from fnnc.models.batches import Progress

    prog = Progress()
    prog.load({"epoch": 0, "batch": 2, "step": 2, "seed": 0, "data": None,
               "loss_sum": 3.0, "loss_count": 2})  # fmt: skip
    prog.add_loss(1.0, 8)
    prog.add_loss(0.5, 2)
    assert prog.mean_loss() == pytest.approx((3.0 * 8 + 1.0 * 8 + 0.5 * 2) / 26)
    assert prog.to_json()["loss_rows"] == 26
