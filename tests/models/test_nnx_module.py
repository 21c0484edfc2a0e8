"""FnncModule: a compiled cnnp model inside Flax NNX, checked against pure JAX.

The oracle is an independent jnp re-implementation of the same Dense-ReLU-Dense model
(NNC's dense layout: weight ``[out, in]``, ``y = x Wᵀ + b``) run on the same weights,
differentiated by ``jax.grad`` and trained by Optax directly.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from fnnc.errors import ModelError
from fnnc.models import BatchNorm, Dense, Dropout, FnncModule, Frozen, Input, Model, ReLU

RNG = np.random.default_rng(0)
XS = RNG.standard_normal((8, 3)).astype(np.float32)
YS = RNG.integers(0, 2, 8).astype(np.int32)
IDS = ["t-fc1-0-0", "t-fc1-0-1", "t-out-0-0", "t-out-0-1"]


def _mlp(**frozen):
    x = Input()
    h = ReLU()(Dense(4, name="fc1", **frozen)(x))
    model = Model(x, Dense(2, name="out")(h))
    model.compile(XS, loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    return model


def _forward(p, x):
    """The model in plain jnp (NNC's dense layout)."""
    h = jax.nn.relu(x @ p["t-fc1-0-0"].T + p["t-fc1-0-1"][None])
    return h @ p["t-out-0-0"].T + p["t-out-0-1"][None]


def _loss(logits, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


@pytest.fixture(scope="module")
def mlp():
    return _mlp()


def test_forward_equals_evaluate_and_variables_are_the_parameters(mlp):
    module = FnncModule(mlp, deterministic=True)
    assert sorted(nnx.state(module, nnx.Param)["parameters"]) == IDS
    np.testing.assert_allclose(module(XS), mlp.evaluate(XS), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(module(XS), _forward(mlp.parameters(), XS), rtol=1e-5, atol=1e-6)


def test_gradients_equal_jax_grad_of_pure_jax(mlp):
    module = mlp.to_nnx()
    grads = nnx.grad(lambda m: _loss(m(XS), YS))(module)
    want = jax.grad(lambda p: _loss(_forward(p, XS), YS))(mlp.parameters())
    got = {pid: grads["parameters"][pid][...] for pid in IDS}
    assert sorted(grads["parameters"]) == IDS
    for pid in IDS:
        np.testing.assert_allclose(got[pid], want[pid], rtol=1e-5, atol=1e-6, err_msg=pid)
    gx = jax.grad(lambda x: _loss(module(x), YS))(jnp.asarray(XS))  # inputs too
    want_x = jax.grad(lambda x: _loss(_forward(mlp.parameters(), x), YS))(jnp.asarray(XS))
    np.testing.assert_allclose(gx, want_x, rtol=1e-5, atol=1e-6)


def test_nnx_optimizer_steps_match_optax_on_pure_jax_and_write_back():
    model = _mlp()
    params = model.parameters()
    module = FnncModule(model)
    opt = nnx.Optimizer(module, optax.adam(0.05), wrt=nnx.Param)

    @nnx.jit
    def step(module, opt, x, y):
        loss, grads = nnx.value_and_grad(lambda m: _loss(m(x), y))(module)
        opt.update(module, grads)
        return loss

    tx = optax.adam(0.05)
    state = tx.init(params)

    @jax.jit
    def pure_step(p, state, x, y):
        loss, g = jax.value_and_grad(lambda p: _loss(_forward(p, x), y))(p)
        updates, state = tx.update(g, state, p)
        return optax.apply_updates(p, updates), state, loss

    losses, pure_losses = [], []
    for _ in range(4):
        losses.append(float(step(module, opt, XS, YS)))
        params, state, loss = pure_step(params, state, XS, YS)
        pure_losses.append(float(loss))
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(losses, pure_losses, rtol=1e-5, atol=1e-6)
    for pid in IDS:
        np.testing.assert_allclose(
            module.parameters[pid][...], params[pid], rtol=1e-5, atol=1e-6, err_msg=pid
        )
    module.write_back()
    np.testing.assert_allclose(model.evaluate(XS), _forward(params, XS), rtol=1e-5, atol=1e-5)
    model.fit(XS, YS)  # the model keeps training from the written-back weights


def test_nested_in_a_larger_nnx_module(mlp):
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.pre = nnx.Linear(5, 3, rngs=rngs)
            self.body = mlp.to_nnx()

        def __call__(self, x):
            return self.body(jnp.tanh(self.pre(x)))

    net = Net(nnx.Rngs(0))
    x5 = RNG.standard_normal((8, 5)).astype(np.float32)
    kernel, bias = net.pre.kernel[...], net.pre.bias[...]

    def pure(p, k, b):
        return _loss(_forward(p, jnp.tanh(x5 @ k + b[None])), YS)

    grads = nnx.jit(nnx.grad(lambda n: _loss(n(x5), YS)))(net)
    want_p, want_k, want_b = jax.grad(pure, argnums=(0, 1, 2))(mlp.parameters(), kernel, bias)
    np.testing.assert_allclose(grads["pre"]["kernel"][...], want_k, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads["pre"]["bias"][...], want_b, rtol=1e-5, atol=1e-6)
    for pid in IDS:
        got = grads["body"]["parameters"][pid][...]
        np.testing.assert_allclose(got, want_p[pid], rtol=1e-5, atol=1e-6, err_msg=pid)


def test_frozen_parameters_are_not_params_and_do_not_train():
    model = _mlp(is_trainable=False)
    module = FnncModule(model)
    assert sorted(nnx.state(module, nnx.Param)["parameters"]) == ["t-out-0-0", "t-out-0-1"]
    assert sorted(nnx.state(module, Frozen)["parameters"]) == ["t-fc1-0-0", "t-fc1-0-1"]
    before = model.parameters()["t-fc1-0-0"]
    opt = nnx.Optimizer(module, optax.sgd(0.5), wrt=nnx.Param)
    opt.update(module, nnx.grad(lambda m: _loss(m(XS), YS))(module))
    np.testing.assert_array_equal(module.parameters["t-fc1-0-0"][...], before)
    assert not np.allclose(module.parameters["t-out-0-0"][...], model.parameters()["t-out-0-0"])


def test_batch_statistics_are_batch_stats_updated_in_training_mode():
    x = Input()
    model = Model(x, Dense(2, name="out")(BatchNorm(name="bn")(x)))
    model.compile(XS, loss="mse", minimizer=optax.sgd(0.1))
    module = FnncModule(model)
    stats = nnx.state(module, nnx.BatchStat)["parameters"]
    assert sorted(stats) == ["r-bn-0-0", "r-bn-0-1"]
    mean = XS.mean(0)
    out = module(XS)  # training mode: batch statistics, running ones updated
    want = model.evaluate(XS, is_test=False)  # the engine's own training-mode forward
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    after = model.parameters()
    for pid in ("r-bn-0-0", "r-bn-0-1"):
        np.testing.assert_allclose(module.parameters[pid][...], after[pid], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(module.parameters["r-bn-0-0"][...], 0.1 * mean, rtol=1e-4, atol=1e-6)
    assert not np.allclose(module.parameters["r-bn-0-1"][...], 1.0)
    grads = nnx.jit(nnx.grad(lambda m: (m(XS) ** 2).mean()))(module)  # updates under jit too
    assert sorted(grads["parameters"]) == ["t-bn-0-0", "t-bn-0-1", "t-out-0-0", "t-out-0-1"]
    running = module.parameters["r-bn-0-0"][...]
    np.testing.assert_allclose(running, 0.19 * mean, rtol=1e-4, atol=1e-6)
    module.write_back()  # the statistics go back with the parameters
    np.testing.assert_allclose(model.parameters()["r-bn-0-0"], running, rtol=1e-6)
    module.eval()
    np.testing.assert_allclose(module(XS), model.evaluate(XS), rtol=1e-5, atol=1e-5)


def test_dropout_needs_rngs_in_training_mode():
    x = Input()
    model = Model(x, Dropout(0.5)(Dense(16, name="fc")(x)))
    model.compile(XS, loss="mse", minimizer=optax.sgd(0.1))
    with pytest.raises(ModelError, match=r"rngs=nnx.Rngs\(dropout=0\)"):
        FnncModule(model)(XS)
    module = FnncModule(model, rngs=nnx.Rngs(dropout=0))
    a, b = module(XS), module(XS)
    w, bias = (np.asarray(module.parameters[p][...]) for p in ("t-fc-0-0", "t-fc-0-1"))
    dense = XS @ w.T + bias
    kept = np.asarray(a) != 0
    np.testing.assert_allclose(np.asarray(a)[kept], 2 * dense[kept], rtol=1e-5, atol=1e-6)
    assert 0 < kept.mean() < 1 and not np.array_equal(a, b)  # fresh keys each call
