"""Dropout inside a Repeat: each block draws its own mask from row ``i`` of
``random_split(key, n)``; a recomputed block (``checkpoint=True``) draws the same one.
Pipelined, each microbatch ``mb`` draws from that row with ``mb`` folded in.

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

from fnnc.models import Activation, Dense, Dropout, Input, Model, Pipeline, Repeat
from tests.helpers import run_on_cpu_devices

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


def pipelined_oracle(w, b, keys, x, stages_blocks, microbatches):
    """The pipelined model in plain JAX: microbatch ``mb`` (rows ``mb::microbatches``)
    through every block, block ``i`` masking with its key with ``mb`` folded in."""

    def forward(w, b):
        rows = []
        for mb in range(microbatches):
            h = jnp.asarray(x[mb::microbatches])
            for i in range(stages_blocks):
                h = jnp.tanh(h @ w[i].T + b[i][None, :])
                key = jax.random.fold_in(keys[i], mb)
                keep = jax.random.bernoulli(key, jnp.float32(1 - P), h.shape)
                h = h * keep.astype(h.dtype) / (1 - P)
            rows.append(h)
        out = jnp.stack(rows, 1).reshape(x.shape)  # back to the batch's row order
        return jnp.mean((out - x) ** 2)

    return jax.value_and_grad(forward, argnums=(0, 1))(w, b)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_pipelined_repeat_draws_a_mask_per_block_and_microbatch(checkpoint):
    n, micro = 4, 2
    xs = np.random.default_rng(3).normal(size=(4, WIDTH)).astype(np.float32)
    x = Input()
    stack = Repeat(block, n, name="blocks", checkpoint=checkpoint, pipeline=Pipeline(2, micro))
    model = Model(x, stack(x))
    model.compile(xs, loss=loss, minimizer=optax.sgd(1.0))
    w, b = "t-blocks-0-block-[0:4]-fc-0-0", "t-blocks-0-block-[0:4]-fc-0-1"
    before = {k: np.asarray(v) for k, v in model.parameters().items()}
    key = jax.random.key(11)
    model.engine.key = key
    value = model.fit(xs, xs)
    _, step_key = jax.random.split(key, 2)
    keys = list(jax.random.split(step_key, n))
    want, (gw, gb) = pipelined_oracle(before[w], before[b], keys, xs, n, micro)
    np.testing.assert_allclose(float(value), float(want), rtol=1e-5)
    after = model.parameters()
    np.testing.assert_allclose(before[w] - np.asarray(after[w]), gw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(before[b] - np.asarray(after[b]), gb, rtol=1e-5, atol=1e-6)


ON_A_MESH = """
import jax, numpy as np, optax
from tests.models.test_repeat_dropout import block, loss, WIDTH
from fnnc.models import Input, Model, Repeat, Pipeline
assert jax.device_count() == 4
xs = np.random.default_rng(3).normal(size=(8, WIDTH)).astype(np.float32)

def make(**options):
    x = Input()
    m = Model(x, Repeat(block, 4, name="blocks", pipeline=Pipeline(2, 2))(x))
    m.compile(xs, loss=loss, minimizer=optax.sgd(0.5), **options)
    return m

one, mesh = make(), make(mesh=jax.make_mesh((2, 2), ("stage", "data")))
mesh.set_parameters(one.parameters())
one.engine.key = mesh.engine.key = jax.random.key(5)
for _ in range(2):
    np.testing.assert_allclose(float(mesh.fit(xs, xs)), float(one.fit(xs, xs)), rtol=1e-5)
for k, v in one.parameters().items():
    np.testing.assert_allclose(mesh.parameters()[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
print("OK")
"""


def test_stages_on_a_mesh_draw_the_masks_of_one_device():
    """2 stages x 2 data devices: the key stacks lie on the stage axis like the weights,
    and every block call still folds in its microbatch."""
    run_on_cpu_devices(ON_A_MESH)
