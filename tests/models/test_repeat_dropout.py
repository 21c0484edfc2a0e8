"""Dropout inside a Repeat: each block draws its own mask from row ``i`` of
``random_split(key, n)``; a recomputed block (``checkpoint=True``) draws the same one.

The oracle is the model written in plain JAX with masks drawn from the same keys
(``jax.random.split`` of the key the engine feeds, then ``jax.random.bernoulli``), and
``jax.grad`` of it: the loss and the SGD(1.0) update of one ``fit`` step must match.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.models import Activation, Dense, Dropout, Input, Model, ModelError, Pipeline, Repeat

N, WIDTH, P = 3, 4, 0.5
X = np.random.default_rng(0).normal(size=(2, WIDTH)).astype(np.float32)
W, B = "t-blocks-0-block-[0:3]-fc-0-0", "t-blocks-0-block-[0:3]-fc-0-1"


def block() -> Model:
    x = Input()
    return Model(x, Dropout(P)(Activation("tanh")(Dense(WIDTH, name="fc")(x))), name="block")


def loss(ys, ts):
    return jnp.mean((ys[0] - ts[0]) ** 2)


def block_keys(engine_key) -> list:
    """The engine's fresh key for the step (``Engine._keys``), split once per block."""
    _, step_key = jax.random.split(engine_key, 2)
    return list(jax.random.split(step_key, N))


def oracle(w, b, keys):
    def forward(w, b):
        h = jnp.asarray(X)
        for i in range(N):
            h = jnp.tanh(h @ w[i].T + b[i][None, :])
            keep = jax.random.bernoulli(keys[i], jnp.float32(1 - P), h.shape)
            h = h * keep.astype(h.dtype) / (1 - P)
        return jnp.mean((h - X) ** 2)

    return jax.value_and_grad(forward, argnums=(0, 1))(w, b)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_each_block_draws_its_own_mask_and_the_gradient_follows_it(checkpoint):
    x = Input()
    model = Model(x, Repeat(block, N, name="blocks", checkpoint=checkpoint)(x))
    model.compile(X, loss=loss, minimizer=optax.sgd(1.0))
    before = {k: np.asarray(v) for k, v in model.parameters().items()}
    key = jax.random.key(7)
    model.engine.key = key
    value = model.fit(X, X)
    after = model.parameters()
    keys = block_keys(key)
    masks = [np.asarray(jax.random.bernoulli(k, 0.5, (2, WIDTH))) for k in keys]
    assert not all((m == masks[0]).all() for m in masks[1:]), "blocks share one mask"
    want, (gw, gb) = oracle(before[W], before[B], keys)
    np.testing.assert_allclose(float(value), float(want), rtol=1e-5)
    np.testing.assert_allclose(before[W] - np.asarray(after[W]), gw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(before[B] - np.asarray(after[B]), gb, rtol=1e-5, atol=1e-6)


def test_testing_mode_drops_nothing():
    x = Input()
    model = Model(x, Repeat(block, N, name="blocks")(x))
    model.compile(X, loss=loss, minimizer=optax.sgd(1.0))
    p = model.parameters()
    h = X
    for i in range(N):
        h = np.tanh(h @ np.asarray(p[W][i]).T + np.asarray(p[B][i])[None, :])
    np.testing.assert_allclose(np.asarray(model.evaluate(X)), h, rtol=1e-5, atol=1e-6)


def test_a_pipelined_repeat_refuses_random_blocks():
    x = Input()
    with pytest.raises(ModelError, match=r"random keys.*pipelined"):
        model = Model(x, Repeat(block, 2, name="r", pipeline=Pipeline(2, 2))(x))
        model.compile(np.zeros((4, WIDTH), np.float32), loss=loss, minimizer=optax.sgd(0.1))
        model.fit(np.zeros((4, WIDTH), np.float32), np.zeros((4, WIDTH), np.float32))
