"""Reductions against NumPy closed forms, and their error messages."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import DTypeError, ShapeError
from tests.helpers import assert_close, rand, randint

X = rand([2, 3, 4])


def test_reductions_keep_axes() -> None:
    axes = (0, -1)
    assert_close(ops.reduce_sum(axes=axes)(X), X.sum(axis=(0, 2), keepdims=True))
    assert_close(ops.reduce_mean(axes=axes)(X), X.mean(axis=(0, 2), keepdims=True))
    assert_close(ops.reduce_max(axes=axes)(X), X.max(axis=(0, 2), keepdims=True))
    assert_close(ops.reduce_min(axes=axes)(X), X.min(axis=(0, 2), keepdims=True))
    assert_close(ops.reduce_norm2(axes=axes)(X), np.sqrt((X * X).sum(axis=(0, 2), keepdims=True)))
    got = ops.argmax(axis=1)(X)
    assert got.dtype == jnp.int32 and got.shape == (2, 1, 4)
    assert_close(got, X.argmax(axis=1)[:, None])
    assert_close(ops.argmin(axis=-1)(X), X.argmin(axis=-1)[..., None])


def test_reduce_max_backward_splits_ties() -> None:
    x = jnp.array([[1.0, 3.0, 3.0]])
    y = ops.reduce_max(axes=(1,))(x)
    (g,) = ops.reduce_max.definition.backward((jnp.ones((1, 1)),), (x,), (y,), axes=(1,))
    assert_close(g, np.array([[0.0, 0.5, 0.5]]))


def test_reduce_sum_of_ints_stays_int() -> None:
    x = randint([3, 2], 5)
    y = ops.reduce_sum(axes=(0,))(x)
    assert y.dtype == jnp.int32
    assert_close(y, x.sum(axis=0, keepdims=True))


@pytest.mark.parametrize(
    "cmd, inputs, error, match",
    [
        (ops.reduce_sum(axes=(3,)), (X,), ShapeError, "axis 3 is out of range for a rank-3"),
        (ops.reduce_mean(axes=(0,)), (randint([3], 4),), DTypeError, "floating-point"),
        (ops.argmax(axis=-4), (X,), ShapeError, "out of range"),
    ],
)
def test_bad_inputs_raise_clear_errors(cmd, inputs, error, match) -> None:
    with pytest.raises(error, match=match):
        cmd(*inputs)
