"""Audit 9 (losses): Model.fit's fused head and label checks against NumPy oracles."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import ModelError
from fnnc.graph.passes import linear_crossentropy
from fnnc.models import Dense, Input, Model


def test_fit_fuses_a_head_whose_labels_are_batch_first(monkeypatch):
    """Scores [N, 1, V] with labels [N] (NNC's batch-first rule, which softmax_crossentropy
    takes): the fuse pass made a linear_softmax_crossentropy node whose shape rule refused
    the labels, so fit raised a GraphError once the head was large enough to fuse."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 1, 3)).astype(np.float32)
    y = rng.integers(0, 5, (4,)).astype(np.int32)
    losses = {}
    for min_logits in (0, 10**9):
        monkeypatch.setattr(linear_crossentropy, "MIN_LOGITS", min_logits)
        i = Input(name="x")
        model = Model([i], [Dense(5, name="fc")(i)])
        model.compile([x], loss="softmax_crossentropy", minimizer=optax.sgd(0.5), seed=1)
        w, b = (np.asarray(v, np.float64) for v in model.parameters().values())
        losses[min_logits] = [float(model.fit([x], [y])) for _ in range(2)]
        names = [n.cmd.name for n in model.engine._last_fit.program.graph.nodes]
        assert ("softmax_crossentropy" in names) == (min_logits > 0)
    z = x[:, 0].astype(np.float64) @ w.T + b
    want = np.mean(np.log(np.exp(z).sum(-1)) - z[np.arange(4), y])
    np.testing.assert_allclose(losses[0][0], want, rtol=1e-6)
    np.testing.assert_allclose(losses[0], losses[10**9], rtol=1e-6)


def test_a_batch_first_label_out_of_range_is_refused():
    """Labels [N] for scores [N, 1, C] skipped the range check: label 7 of 5 classes hit
    no class and fit trained on logsumexp alone (NNC asserts 0 <= label < C)."""
    x = np.zeros((4, 1, 3), np.float32)
    i = Input(name="x")
    model = Model([i], [Dense(5, name="fc")(i)])
    model.compile([x], loss="softmax_crossentropy", minimizer=optax.sgd(0.5), seed=1)
    before = {k: np.asarray(v) for k, v in model.parameters().items()}
    with pytest.raises(ModelError, match=r"label 7 at sample 2; 'softmax_crossentropy' needs"):
        model.fit([x], [np.array([0, 1, 7, 2], np.int32)])
    for k, v in model.parameters().items():
        np.testing.assert_array_equal(v, before[k])


def test_a_loss_command_object_is_refused_with_the_function_that_takes_it():
    """loss=ops.softmax_crossentropy(trim0=.., trim1=..) (how NNC passes a loss with
    parameters) was called as fn(outputs, targets) with two lists and failed with 'the
    loss function must return one scalar'; the error now gives the wrapping function,
    which computes NNC's smoothed loss (NumPy oracle)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    y = rng.integers(0, 3, 6).astype(np.int32)
    cmd = ops.softmax_crossentropy(trim0=0.01, trim1=0.98)
    i = Input(name="x")
    model = Model([i], [Dense(3, name="fc")(i)])
    with pytest.raises(
        ModelError,
        match=r"loss=softmax_crossentropy\[trim0=0.01, trim1=0.98\] "
        r"is a command object.*jnp.mean\(ops.softmax_crossentropy",
    ):
        model.compile([x], loss=cmd, minimizer=optax.sgd(0.0))
    model.compile(
        [x], loss=lambda o, t: jnp.mean(cmd(o[0], t[0])[0]), minimizer=optax.sgd(0.0), seed=0
    )
    w, b = (np.asarray(v, np.float64) for v in model.parameters().values())
    z = x.astype(np.float64) @ w.T + b
    t = np.full((6, 3), 0.01)
    t[np.arange(6), y] = 0.98
    want = np.mean(np.log(np.exp(z).sum(-1)) - (t * z).sum(-1))
    np.testing.assert_allclose(float(model.fit([x], [y])), want, rtol=1e-6)


@pytest.mark.parametrize(
    "loss, dtype",
    [
        (lambda o, t: jnp.sum(o[0] > t[0]), "int32"),
        (lambda o, t: jnp.all(o[0] > 0), "bool"),
        (lambda o, t: jnp.mean(o[0]).astype(jnp.complex64), "complex64"),
    ],
)
def test_a_loss_without_a_gradient_is_refused(loss, dtype):
    """An integer or boolean loss 'trained' with zero updates and no error (jax.grad
    refuses such outputs); a complex one failed in float() with a raw TypeError."""
    x, y = np.ones((4, 2), np.float32), np.zeros((4, 3), np.float32)
    i = Input(name="x")
    model = Model([i], [Dense(3, name="fc")(i)])
    model.compile([x], loss=loss, minimizer=optax.sgd(0.1), seed=0)
    before = {k: np.asarray(v) for k, v in model.parameters().items()}
    with pytest.raises(ModelError, match=rf"loss function's value is {dtype}\[\]; a loss must"):
        model.fit([x], [y])
    for k, v in model.parameters().items():
        np.testing.assert_array_equal(v, before[k])
    with pytest.raises(TypeError, match="real"):  # the oracle: JAX refuses it too
        jax.grad(lambda o: loss([o], [np.zeros((4, 3), np.float32)]))(np.ones((4, 3), np.float32))


def test_a_loss_of_several_values_names_what_it_returned():
    x = np.ones((4, 2), np.float32)
    i = Input(name="x")
    model = Model([i], [Dense(3, name="fc")(i)])
    model.compile([x], loss=lambda o, t: jnp.mean(o[0], axis=0), minimizer=optax.sgd(0.1))
    with pytest.raises(ModelError, match=r"one scalar, got \[float32\[3\]\]; reduce it"):
        model.fit([x], [np.zeros((4, 3), np.float32)])
