"""trace of functions taking PRNG keys: an NNX module holding nnx.Rngs, a jax.random key.

A key argument becomes a graph input holding its key data; ``interpret``/``compile``
take the key itself. Oracle: the same function run by JAX/Flax on the same key.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from fnnc.graph import compile, interpret, trace

F32 = np.float32


class DropoutMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.fc = nnx.Linear(3, 16, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.drop(nnx.relu(self.fc(x)))


def _call(module, x):
    return module(x)


def test_trace_of_a_module_holding_rngs_takes_the_key_as_input() -> None:
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(F32)
    module = DropoutMLP(nnx.Rngs(0))
    graph = trace(_call, module, x)
    inputs = {graph.symbol(i).name: graph.symbol(i) for i in graph.inputs}
    key_input = inputs["module.drop.rngs.key"]
    assert (key_input.shape, np.dtype(key_input.dtype)) == ((2,), np.dtype(np.uint32))
    # Flax on a copy: the call advances the copy's stream, not the module's
    want = _call(nnx.clone(module), x)
    np.testing.assert_allclose(interpret(graph, module, x), want, atol=1e-6)
    program = compile(graph)
    np.testing.assert_allclose(program(module, x), want, atol=1e-6)

    # the key is an input, not a constant: another stream gives Flax's other mask
    other = DropoutMLP(nnx.Rngs(0, dropout=7))
    other_want = _call(nnx.clone(other), x)
    assert not np.allclose(other_want, want)
    np.testing.assert_allclose(program(other, x), other_want, atol=1e-6)


def test_trace_of_a_function_taking_a_jax_random_key() -> None:
    def noisy(key, x):
        return x + jax.random.normal(key, x.shape)

    x = np.ones((3, 2), F32)
    key = jax.random.key(3)
    graph = trace(noisy, key, x)
    np.testing.assert_allclose(interpret(graph, key, x), noisy(key, x), atol=1e-6)
    np.testing.assert_allclose(
        interpret(graph, jax.random.key_data(jax.random.key(4)), x),
        noisy(jax.random.key(4), x),
        atol=1e-6,
    )


def test_trace_takes_key_specs_too() -> None:
    key = jax.random.key(5)
    x = jax.ShapeDtypeStruct((2, 2), F32)
    graph = trace(lambda k, x: x * jax.random.uniform(k, x.shape), jax.eval_shape(lambda: key), x)
    ones = np.ones((2, 2), F32)
    np.testing.assert_allclose(interpret(graph, key, ones), jax.random.uniform(key, (2, 2)))
