"""Audit 8 (checkpoints area): building a fit program with partitioned minimizers."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fnnc.models import Dense, Input, Model, ReLU
from tests.helpers import assert_close, rand

XS, TS = rand([6, 3]), rand([6, 2], seed=1)


def _loss(p, x, t):
    h = jax.nn.relu(x @ p["t-h-0-0"].T + p["t-h-0-1"][None])
    return jnp.mean((h @ p["t-out-0-0"].T + p["t-out-0-1"][None] - t) ** 2)


def test_partitioned_minimizers_build_without_warnings_and_step_as_optax():
    """The key probe ran a model's partitioned minimizer on a stand-in dict {"p": spec},
    which it zipped with its parameter ids ({"t-h-0-0": "p"}): Adam's zeros_like of a
    str warned "int64 ... truncated to int32" at every fit program build."""
    x = Input()
    model = Model(x, Dense(2, name="out")(ReLU()(Dense(5, name="h")(x))))
    model.compile(XS, loss="mse", minimizer=optax.sgd(0.1))
    labelled = optax.multi_transform(
        {"a": optax.adam(0.05)}, lambda p: jax.tree.map(lambda _: "a", p)
    )
    model.set_minimizer(labelled, params=["t-h-0-0"])
    model.set_minimizer(optax.sgd(0.2), params=["t-out-0-0"])
    p0 = {k: jnp.asarray(v) for k, v in model.parameters().items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(XS, TS)
    assert [str(w.message) for w in caught] == []
    g = jax.grad(_loss)(p0, XS, TS)  # oracle: plain Optax on each partition's sub-dict
    adam = optax.adam(0.05)
    u, _ = adam.update({"w": g["t-h-0-0"]}, adam.init({"w": p0["t-h-0-0"]}))
    want = {
        "t-h-0-0": p0["t-h-0-0"] + u["w"],
        "t-out-0-0": p0["t-out-0-0"] - 0.2 * g["t-out-0-0"],
        "t-h-0-1": p0["t-h-0-1"] - 0.1 * g["t-h-0-1"],
        "t-out-0-1": p0["t-out-0-1"] - 0.1 * g["t-out-0-1"],
    }
    got = model.parameters()
    for k, v in want.items():
        assert_close(np.asarray(got[k]), np.asarray(v), rtol=1e-5, atol=1e-6)


def test_a_partition_with_a_key_in_its_state_still_rides_as_bits():
    """With the real parameters as the probe, a noisy partition's key is still found."""
    x = Input()
    model = Model(x, Dense(2, name="out")(ReLU()(Dense(5, name="h")(x))))
    model.compile(XS, loss="mse", minimizer=optax.sgd(0.1))
    model.set_minimizer(optax.noisy_sgd(0.1, key=3), params=["t-out-0-0"])
    before = np.asarray(model.parameters()["t-h-0-1"])
    loss = float(model.fit(XS, TS))
    assert np.isfinite(loss)
    assert not np.array_equal(np.asarray(model.parameters()["t-h-0-1"]), before)


def test_model_read_takes_every_row_from_one_commit_of_a_concurrent_write(tmp_path, monkeypatch):
    """Model.read read the rows one statement each: a Model.write of other weights
    committed between two rows gave a model half old, half new parameters, silently."""
    import threading

    from fnnc.io import TensorFile

    def mlp(seed):
        x = Input()
        model = Model(x, Dense(2, name="out")(ReLU()(Dense(5, name="h")(x))))
        model.compile(XS, loss="mse", minimizer=optax.sgd(0.1), seed=seed)
        return model

    old, new, into = mlp(1), mlp(2), mlp(3)
    path = str(tmp_path / "w.sqlite")
    old.write(path)
    want = old.parameters()  # the oracle: the committed file when the read began
    assert any(not np.array_equal(want[k], v) for k, v in new.parameters().items())
    thread = threading.Thread(target=lambda: new.write(path))
    read = TensorFile.read

    def read_then_race(self, *args, **kwargs):
        got = read(self, *args, **kwargs)
        if self.readonly and not thread.is_alive() and thread.ident is None:
            thread.start()
            thread.join(0.5)  # the write's commit waits for the read to end
        return got

    monkeypatch.setattr(TensorFile, "read", read_then_race)
    into.read(path)
    thread.join(60)
    for k, v in into.parameters().items():
        np.testing.assert_array_equal(np.asarray(v), np.asarray(want[k]), err_msg=k)
    monkeypatch.setattr(TensorFile, "read", read)
    into.read(path)  # and the write did happen afterwards
    for k, v in into.parameters().items():
        np.testing.assert_array_equal(np.asarray(v), np.asarray(new.parameters()[k]), err_msg=k)
