"""Model.from_flax on whole NNX modules: Rngs, BatchNorm statistics, Flax paths.

Oracles: Flax itself running the same module with the same weights (eval outputs,
training-mode BatchNorm updates), ``nnx.Optimizer`` / plain Optax on the same batches.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from fnnc.errors import ModelError
from fnnc.models import Model

F32 = np.float32


def _mse(outputs, targets):
    return jnp.mean((outputs[0] - targets[0]) ** 2)


def _flax_values(module: nnx.Module) -> dict[str, np.ndarray]:
    """Flax path -> value of every array variable of ``module`` (keys left out)."""
    flat = nnx.to_flat_state(nnx.state(module, nnx.Not(nnx.RngState)))
    return {".".join(map(str, path)): np.asarray(var.get_value()) for path, var in flat}


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(F32)


# -- Dropout (a module holding nnx.Rngs) --------------------------------------------------


class DropoutMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(5, 16, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.fc2 = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.fc2(self.drop(nnx.relu(self.fc1(x))))


def test_dropout_mlp_trains_and_evaluates_like_flax() -> None:
    rng = np.random.default_rng(0)
    x, t = _rand(rng, 8, 5), _rand(rng, 8, 3)
    flax_mlp = DropoutMLP(nnx.Rngs(0))
    model = Model.from_flax(flax_mlp, name="mlp")
    model.compile(x, loss=_mse, minimizer=optax.adam(1e-2))
    paths = model.parameter_paths()
    assert sorted(paths.values()) == ["fc1.bias", "fc1.kernel", "fc2.bias", "fc2.kernel"]
    flax_mlp.eval()
    np.testing.assert_allclose(model.evaluate(x), flax_mlp(x), atol=1e-6)

    losses = [float(model.fit(x, t)) for _ in range(3)]
    assert all(np.isfinite(losses))
    trained = model.parameters()
    assert not np.allclose(trained["t-mlp-0-mlp-0-1"], _flax_values(flax_mlp)["fc1.kernel"])
    # eval after training: Flax's own eval of the module holding the trained weights
    for pid, value in trained.items():
        _set_flax(flax_mlp, paths[pid], value)
    np.testing.assert_allclose(model.evaluate(x), flax_mlp(x), atol=1e-5)


def _set_flax(module: nnx.Module, path: str, value: np.ndarray) -> None:
    """Sets the variable at Flax path ``path`` (``fc1.kernel``) of ``module``."""
    *parents, leaf = path.split(".")
    for part in parents:
        module = module[int(part)] if part.isdigit() else getattr(module, part)
    getattr(module, leaf).set_value(value)


class LinearDropout(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.fc = nnx.Linear(4, 64, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.drop(self.fc(x))


def test_dropout_draws_fresh_masks_in_training_and_is_off_in_test_mode() -> None:
    x = _rand(np.random.default_rng(1), 8, 4)
    flax_module = LinearDropout(nnx.Rngs(0))
    model = Model.from_flax(flax_module)
    model.compile(x, loss=_mse, minimizer=optax.sgd(0.1))
    flax_module.eval()
    dense = np.asarray(flax_module(x))
    np.testing.assert_allclose(model.evaluate(x), dense, atol=1e-6)  # test mode: off

    masks = []
    for _ in range(2):
        y = np.asarray(model.evaluate(x, is_test=False))
        kept = y != 0
        # Flax's Dropout: kept values scaled by 1 / (1 - rate)
        np.testing.assert_allclose(y[kept], 2 * dense[kept], rtol=1e-5)
        assert 0.35 < kept.mean() < 0.65, kept.mean()
        masks.append(kept)
    assert (masks[0] != masks[1]).any()  # a fresh key per training-mode step


# -- BatchNorm statistics ----------------------------------------------------------------


class BatchNormCNN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        # no conv bias: BatchNorm cancels it, so its gradient is rounding noise that
        # Adam would blow up to +-lr steps of random sign
        self.conv = nnx.Conv(3, 4, (3, 3), use_bias=False, rngs=rngs)
        self.bn = nnx.BatchNorm(4, momentum=0.8, rngs=rngs)
        self.head = nnx.Linear(4, 2, rngs=rngs)

    def __call__(self, x):
        return self.head(nnx.relu(self.bn(self.conv(x))).mean(axis=(1, 2)))


def _batches(k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(2)
    return [(1.5 + 2 * _rand(rng, 4, 6, 6, 3), _rand(rng, 4, 2)) for _ in range(k)]


def test_batchnorm_statistics_are_running_state_updated_as_flax() -> None:
    batches = _batches(3)
    tx = optax.adamw(1e-2, weight_decay=0.5)
    oracle = BatchNormCNN(nnx.Rngs(0))
    model = Model.from_flax(nnx.clone(oracle), name="cnn")
    model.compile(batches[0][0], loss=_mse, minimizer=tx)

    paths = model.parameter_paths()
    stats = {pid for pid, path in paths.items() if path in ("bn.mean", "bn.var")}
    assert len(stats) == 2 and all(pid.startswith("r-") for pid in stats)
    assert all(not model.engine.infos[pid].trainable for pid in stats)
    assert not stats & set(model.engine.trainable())  # no optimizer state, no decay

    @nnx.jit
    def flax_step(module, opt, x, t):
        opt.update(module, nnx.grad(lambda m: _mse([m(x)], [t]))(module))

    opt = nnx.Optimizer(oracle, tx, wrt=nnx.Param)
    oracle.train()
    for x, t in batches:
        model.fit(x, t)
        flax_step(oracle, opt, x, t)
    want = _flax_values(oracle)
    got = model.parameters()
    assert set(paths.values()) == set(want)
    for pid, path in paths.items():
        np.testing.assert_allclose(got[pid], want[path], atol=1e-5, err_msg=path)
    assert not np.allclose(want["bn.mean"], 0) and not np.allclose(want["bn.var"], 1)

    oracle.eval()  # test mode reads the running statistics
    x = batches[0][0]
    np.testing.assert_allclose(model.evaluate(x), oracle(x), atol=1e-5)


def test_to_nnx_of_a_flax_model_keeps_batch_stats_as_batch_stats() -> None:
    ((x, _),) = _batches(1)
    oracle = BatchNormCNN(nnx.Rngs(0))
    model = Model.from_flax(nnx.clone(oracle), name="cnn")
    model.compile(x, loss=_mse, minimizer=optax.sgd(0.1))
    module = model.to_nnx()
    paths = model.parameter_paths()
    kinds = {paths[pid]: type(var) for pid, var in module.parameters.items()}
    assert kinds["bn.mean"] is nnx.BatchStat and kinds["bn.var"] is nnx.BatchStat
    assert kinds["conv.kernel"] is nnx.Param

    oracle.train()
    np.testing.assert_allclose(module(x), oracle(x), atol=1e-5)  # training-mode calls
    want = _flax_values(oracle)
    for pid, var in module.parameters.items():
        np.testing.assert_allclose(var[...], want[paths[pid]], atol=1e-5, err_msg=paths[pid])


def test_linen_batch_stats_are_internals_updated_by_training_steps() -> None:
    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.BatchNorm(use_running_average=False, momentum=0.7)(nn.Dense(4)(x))
            return nn.Dense(2)(nn.relu(x))

    rng = np.random.default_rng(3)
    batches = [(1 + _rand(rng, 6, 3), _rand(rng, 6, 2)) for _ in range(2)]
    net = Net()
    variables = net.init(jax.random.key(0), batches[0][0])
    model = Model.from_flax(net, variables)
    model.compile(batches[0][0], loss=_mse, minimizer=optax.sgd(0.1))

    def loss(params, stats, x, t):
        y, new = net.apply({"params": params, "batch_stats": stats}, x, mutable=["batch_stats"])
        return _mse([y], [t]), new["batch_stats"]

    grad = jax.jit(jax.grad(loss, has_aux=True))
    params, stats = variables["params"], variables["batch_stats"]
    for x, t in batches:
        model.fit(x, t)
        grads, stats = grad(params, stats, x, t)
        params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    want = {
        ".".join(str(k.key) for k in path): v
        for path, v in jax.tree_util.tree_flatten_with_path(
            {"params": params, "batch_stats": stats}
        )[0]
    }
    got = model.parameters()
    paths = model.parameter_paths()
    assert set(paths.values()) == set(want)
    for pid, path in paths.items():
        assert pid.startswith("r-") == path.startswith("batch_stats."), (pid, path)
        np.testing.assert_allclose(got[pid], want[path], atol=1e-5, err_msg=path)


def test_a_linen_module_built_to_drop_compiles_and_drops_in_both_modes() -> None:
    """Linen modules pick their mode themselves: nn.Dropout(deterministic=False) draws a
    "dropout" key in fnnc's test-mode build too, which had no key (Flax's
    InvalidRngError out of compile). Each entry is 0 or the dense output over 1 - rate."""

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dropout(0.5, deterministic=False)(nn.Dense(64)(x))

    x = _rand(np.random.default_rng(4), 4, 3)
    net = Net()
    variables = net.init(jax.random.key(0), x)
    model = Model.from_flax(net, variables)
    model.compile(x, loss=_mse, minimizer=optax.sgd(0.1))
    dense = nn.Dense(64).apply({"params": variables["params"]["Dense_0"]}, x)
    for _ in range(2):
        y = np.asarray(model.evaluate(x))
        kept = y != 0
        assert 0.2 < kept.mean() < 0.8
        np.testing.assert_allclose(y[kept], 2 * np.asarray(dense)[kept], rtol=1e-5)
    assert np.isfinite(model.fit(x, np.zeros((4, 64), np.float32)))


# -- parameter paths -----------------------------------------------------------------------


def test_parameter_paths_map_every_id_to_its_flax_variable() -> None:
    ((x, _),) = _batches(1)
    flax_module = BatchNormCNN(nnx.Rngs(0))
    model = Model.from_flax(flax_module, name="cnn")
    model.compile(x, loss=_mse, minimizer=optax.sgd(0.1))
    paths = model.parameter_paths()
    values = model.parameters()
    assert set(paths) == set(values)  # every id, internals included
    want = _flax_values(flax_module)
    assert sorted(paths.values()) == sorted(want)
    for pid, path in paths.items():
        np.testing.assert_array_equal(values[pid], want[path])
        assert model.parameter_id(path) == pid
    with pytest.raises(ModelError, match=r"no parameter has Flax path 'bn\.scal'.*bn\.scale"):
        model.parameter_id("bn.scal")


def test_fnnc_model_through_to_nnx_and_from_flax_trains_as_itself() -> None:
    from fnnc.models import BatchNorm, Conv, Dense, Flatten, Input, ReLU

    x = Input()
    y = Dense(2, name="head")(Flatten()(ReLU()(BatchNorm(name="bn")(Conv(4, (3, 3))(x)))))
    native = Model(x, y, name="a")
    batches = _batches(2)
    native.compile(batches[0][0], loss=_mse, minimizer=optax.sgd(0.1))
    bridged = Model.from_flax(native.to_nnx(), name="b")  # FnncModule: BatchStat internals
    bridged.compile(batches[0][0], loss=_mse, minimizer=optax.sgd(0.1))
    for x, t in batches:
        np.testing.assert_allclose(bridged.fit(x, t), native.fit(x, t), rtol=1e-6)
    want = native.parameters()
    got = bridged.parameters()
    for pid, path in bridged.parameter_paths().items():
        native_id = path.removeprefix("parameters.")
        assert pid[0] == native_id[0]  # internals stay internals ("r-"), parameters "t-"
        np.testing.assert_allclose(got[pid], want[native_id], atol=1e-6, err_msg=path)
    x = batches[0][0]
    np.testing.assert_allclose(bridged.evaluate(x), native.evaluate(x), atol=1e-6)
    # nnx.view sets FnncModule's mode as it sets nnx.Dropout's
    test_mode = nnx.view(native.to_nnx(), deterministic=True)
    np.testing.assert_allclose(test_mode(x), native.evaluate(x), atol=1e-6)


class TwoOutputs(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.fc = nnx.Linear(3, 2, rngs=rngs)

    def __call__(self, x):
        return self.fc(x), x


def test_a_module_returning_several_arrays_is_refused_by_name() -> None:
    model = Model.from_flax(TwoOutputs(nnx.Rngs(0)), name="two")
    with pytest.raises(ModelError, match=r"TwoOutputs returns 2 arrays; .* one output"):
        model.compile(np.zeros((2, 3), F32), loss=_mse, minimizer=optax.sgd(0.1))


class KeyHolder(nnx.Module):
    def __init__(self):
        self.seed = nnx.Variable(jax.random.key(0))

    def __call__(self, x):
        return x + jax.random.normal(self.seed[...], x.shape)


def test_a_key_outside_nnx_rngs_is_refused_by_path() -> None:
    with pytest.raises(ModelError, match=r"variable seed holds PRNG keys .*nnx\.Rngs"):
        Model.from_flax(KeyHolder())


# -- Repeat over a from_flax block ----------------------------------------------------------


class LinearNorm(nnx.Module):
    def __init__(self, seed: int):
        self.fc = nnx.Linear(4, 4, rngs=nnx.Rngs(seed))
        self.bn = nnx.BatchNorm(4, rngs=nnx.Rngs(seed))
        self.bn.mean.set_value(jnp.full((4,), 0.1 * seed))  # distinct statistics per block

    def __call__(self, x):
        return nnx.relu(self.bn(self.fc(x)))


def test_repeat_of_from_flax_blocks_starts_each_block_from_its_own_module() -> None:
    from fnnc.models import Input, Repeat

    modules: list[LinearNorm] = []

    def make():
        modules.append(LinearNorm(len(modules)))
        return Model.from_flax(modules[-1], name="blk")

    x = np.random.default_rng(0).standard_normal((2, 4)).astype(F32)
    i = Input()
    model = Model(i, Repeat(make, 3, name="blocks")(i))
    model.compile(x, loss=None)
    assert len(modules) == 3  # the function is called once per block
    stacks, paths = model.parameters(), model.parameter_paths()
    assert sorted(paths.values()) == ["bn.bias", "bn.mean", "bn.scale", "bn.var", "fc.bias",
                                      "fc.kernel"]  # fmt: skip
    for b, module in enumerate(modules):  # block b holds module b's values
        flax = _flax_values(module)
        for pid, path in paths.items():
            np.testing.assert_array_equal(stacks[pid][b], flax[path], err_msg=f"{pid}[{b}]")
    y = x
    for module in modules:  # Flax itself running the blocks in sequence
        module.eval()
        y = module(y)
    np.testing.assert_allclose(model.evaluate(x), y, atol=1e-5)


def test_repeat_of_one_from_flax_layer_is_refused() -> None:
    from fnnc.models import Input, Repeat

    i = Input()
    block = Model.from_flax(nnx.Linear(4, 4, rngs=nnx.Rngs(0)), name="lin")
    model = Model(i, Repeat(block, 2, name="blocks")(i))
    with pytest.raises(ModelError, match=r"Repeat\('blocks'\).*start equal.*once per block"):
        model.compile(np.ones((2, 4), F32), loss=None)
