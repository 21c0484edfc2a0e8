"""Parameters' first values come from one program (fnnc.models.initialize) and equal
what running each initializer eagerly, in order, from its own split key gives; the
initializers that cannot be traced, or that hold a large value, run eagerly."""

from __future__ import annotations

import types

import jax
import numpy as np

from fnnc.models import Dense, Input, Model, Sequential
from fnnc.models.initialize import CONSTANT_BYTES, initialize
from fnnc.models.layer import glorot_uniform, normal_init, zeros

HELD = np.arange(CONSTANT_BYTES // 4 + 1, dtype=np.float32)  # over the constant limit


def _untraceable(key, shape, dtype):
    """NumPy on the key's bits: needs a concrete key."""
    seed = int(np.asarray(jax.random.key_data(key)).ravel()[-1])
    return np.random.default_rng(seed).normal(size=shape).astype(dtype)


def _held(key, shape, dtype):
    return jax.numpy.asarray(HELD[: int(np.prod(shape))].reshape(shape), dtype)


def _info(init, shape):
    return types.SimpleNamespace(init=init, shape=shape, dtype=np.dtype(np.float32))


def test_values_equal_the_eager_loop_for_every_kind_of_initializer():
    infos = [
        _info(glorot_uniform((1,), (0,)), (5, 3)),
        _info(_untraceable, (4,)),
        _info(normal_init(0.5), (2, 2, 3)),
        _info(_held, HELD.shape),
        _info(zeros, (7,)),
    ]
    key = jax.random.key(3)
    got_key, got = initialize(key, infos)
    want = []
    for info in infos:
        key, sub = jax.random.split(key)
        want.append(info.init(sub, info.shape, info.dtype))
    assert np.array_equal(jax.random.key_data(got_key), jax.random.key_data(key))
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-7)


def test_models_of_the_same_layers_get_the_same_parameters():
    """The key chain runs per parameter in build order, whichever way the model is
    written (functional or Sequential)."""
    x = Input()
    model = Model(x, Dense(3, name="b")(Dense(4, name="a")(x)))
    model.compile(np.ones((2, 5), np.float32))
    same = Sequential([Dense(4, name="a"), Dense(3, name="b")])
    same.compile(np.ones((2, 5), np.float32))
    for k, v in model.parameters().items():
        np.testing.assert_array_equal(np.asarray(same.parameters()[k]), np.asarray(v))


def test_a_model_built_again_reuses_its_initialization_program():
    """The program is kept by what it computes, not by the closures that describe it:
    a fresh model of the same shapes compiles nothing new (its values still come from
    its own keys)."""
    from fnnc.models import initialize as module

    def fresh():
        model = Sequential([Dense(5, name="a"), Dense(2, name="b")])
        model.compile(np.ones((3, 4), np.float32))
        return model

    first = fresh()
    kept = dict(module._PROGRAMS)
    second = fresh()
    assert module._PROGRAMS.keys() == kept.keys()
    assert all(module._PROGRAMS[k] is v for k, v in kept.items())
    for k, v in first.parameters().items():  # the same seed: the same values
        np.testing.assert_array_equal(np.asarray(second.parameters()[k]), np.asarray(v))
