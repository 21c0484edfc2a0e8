"""Audit 8 (trace, Flax bridge): regressions found by using from_flax as a user would.

Oracle: Flax itself applying the same Linen module with the same variables.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.errors import ModelError
from fnnc.models import Model


def _mse(outputs, targets):
    return jnp.mean((outputs[0] - targets[0]) ** 2)


class _Noisy(nn.Module):
    stream: str

    @nn.compact
    def __call__(self, x):
        y = nn.Dense(3)(x)
        return y + 0.0 * jax.random.normal(self.make_rng(self.stream), y.shape)


def test_a_linen_module_drawing_another_rng_stream_is_a_model_error_naming_it() -> None:
    """A Linen module calling self.make_rng("noise") raised Flax's bare InvalidRngError
    out of compile ("None needs PRNG for "noise""): from_flax feeds only "dropout"."""
    x = np.random.default_rng(0).standard_normal((4, 2)).astype(np.float32)
    net = _Noisy("noise")
    variables = net.init({"params": jax.random.key(0), "noise": jax.random.key(1)}, x)
    model = Model.from_flax(net, variables)
    with pytest.raises(ModelError, match="'noise'") as e:
        model.compile(x, loss=_mse, minimizer=optax.sgd(0.1))
    assert "make_rng('dropout')" in str(e.value)
    # what the message says works: the same module drawing from "dropout"
    net = _Noisy("dropout")
    model = Model.from_flax(net, variables)
    model.compile(x, loss=_mse, minimizer=optax.sgd(0.1))
    want = net.apply(variables, x, rngs={"dropout": jax.random.key(2)})
    np.testing.assert_allclose(model.evaluate(x), want, atol=1e-6)


class _TrainArgument(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        return nn.Dropout(0.5, deterministic=not train)(nn.Dense(3)(x))


class _TrainField(nn.Module):
    train: bool = False

    @nn.compact
    def __call__(self, x):
        return nn.Dropout(0.5, deterministic=not self.train)(nn.Dense(3)(x))


def test_a_module_whose_call_needs_more_than_one_input_is_refused_at_from_flax() -> None:
    """Linen's common __call__(self, x, train) failed only in compile, with the bare
    "__call__() missing 1 required positional argument: 'train'" and no way out."""
    x = np.random.default_rng(1).standard_normal((4, 2)).astype(np.float32)
    net = _TrainArgument()
    variables = net.init(jax.random.key(0), x, False)
    with pytest.raises(ModelError, match="train") as e:
        Model.from_flax(net, variables)
    assert "one input" in str(e.value) and "attributes" in str(e.value)
    # what the message says works: the mode as a field
    net = _TrainField()
    model = Model.from_flax(net, variables)
    model.compile(x, loss=_mse, minimizer=optax.sgd(0.1))
    np.testing.assert_allclose(model.evaluate(x), net.apply(variables, x), atol=1e-6)


def test_modules_with_optional_or_variadic_extra_arguments_still_wrap() -> None:
    class Opt(nn.Module):
        @nn.compact
        def __call__(self, x, scale=2.0, *rest, **kw):
            return nn.Dense(3)(x) * scale

    x = np.ones((2, 2), np.float32)
    variables = Opt().init(jax.random.key(0), x)
    model = Model.from_flax(Opt(), variables)
    model.compile(x, loss=_mse, minimizer=optax.sgd(0.1))
    np.testing.assert_allclose(model.evaluate(x), Opt().apply(variables, x), atol=1e-6)
