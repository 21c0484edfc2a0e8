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
