"""Dropout's keep rate and scaling, sampler statistics, and key checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError, DTypeError, ShapeError
from tests.helpers import assert_close, rand

KEY = np.asarray(jax.random.key_data(jax.random.key(0)))
KEY1 = np.asarray(jax.random.key_data(jax.random.key(1)))


def test_dropout_keep_rate_and_scaling() -> None:
    x = rand([200, 100])
    y, mask = ops.dropout(p=0.3)(x, KEY)
    m = np.asarray(mask)
    assert mask.dtype == x.dtype and set(np.unique(m)) <= {0.0, 1.0}
    assert abs(m.mean() - 0.7) < 0.01
    assert_close(y, x * m / 0.7, atol=1e-6)
    again, _ = ops.dropout(p=0.3)(x, KEY)
    other, _ = ops.dropout(p=0.3)(x, KEY1)
    np.testing.assert_array_equal(np.asarray(again), np.asarray(y))
    assert not np.array_equal(np.asarray(other), np.asarray(y))


def test_dropout_mask_depends_on_key_and_shape_only() -> None:
    _, m32 = ops.dropout()(rand([8, 8]), KEY)
    _, m16 = ops.dropout()(rand([8, 8]).astype(jnp.bfloat16), KEY)
    np.testing.assert_array_equal(np.asarray(m32), np.asarray(m16, np.float32))


def test_dropout_backward_reads_the_mask() -> None:
    x, g = rand([3, 4]), rand([3, 4], seed=1)
    cmd = ops.dropout(p=0.25)
    y, mask = cmd(x, KEY)
    spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)
    gx, gkey = cmd.definition.backward(
        (g, None), (spec(x), spec(KEY)), (spec(y), mask), **cmd.kwargs
    )
    assert gkey is None
    assert_close(gx, g * np.asarray(mask) / 0.75, atol=1e-6)


def test_dropout_entirety_keeps_or_drops_everything() -> None:
    masks = [
        np.asarray(
            ops.dropout(entirety=True)(
                rand([3, 3]), np.asarray(jax.random.key_data(jax.random.key(s)))
            )[1]
        )
        for s in range(8)
    ]
    assert all(np.all(m == m.flat[0]) for m in masks)
    assert {float(m.flat[0]) for m in masks} == {0.0, 1.0}


def test_samplers() -> None:
    u = np.asarray(ops.random_uniform(shape=(4000,), low=-1.0, high=3.0)(KEY))
    assert u.dtype == np.float32 and u.min() >= -1.0 and u.max() < 3.0 and abs(u.mean() - 1.0) < 0.1
    z = np.asarray(ops.random_normal(shape=(4000,), mean=2.0, std=0.5)(KEY))
    assert abs(z.mean() - 2.0) < 0.05 and abs(z.std() - 0.5) < 0.05
    assert ops.random_normal(shape=(2, 3), dtype="bfloat16")(KEY).dtype == jnp.bfloat16


def test_random_errors() -> None:
    with pytest.raises(DTypeError, match="key_data"):
        ops.dropout()(rand([2, 2]), KEY.astype(np.int32))
    with pytest.raises(ShapeError, match="uint32"):
        ops.random_uniform(shape=(2,))(np.zeros((4,), np.uint32))
    with pytest.raises(CommandError, match=r"p=1.0"):
        ops.dropout(p=1.0)(rand([2, 2]), KEY)
    with pytest.raises(DTypeError, match="floating-point"):
        ops.random_uniform(shape=(2,), dtype="int32")(KEY)
    with pytest.raises(CommandError, match="shape"):
        ops.random_normal()(KEY)


def test_a_typed_prng_key_of_another_kind_is_a_clear_dtype_error() -> None:
    """A ``jax.random.key`` is taken as its bits (tests/core/test_command_inputs.py);
    one whose bits are not NNC's uint32[2] (an ``rbg`` key) names what is expected."""
    x = np.ones((2, 3), np.float32)
    key = jax.random.key(0, impl="rbg")
    with pytest.raises(ShapeError, match=r"uint32\[4\] must be uint32\[2\] key data"):
        ops.gumbel_argmax()(x, key)


@pytest.mark.parametrize("name", ["random_uniform", "random_normal"])
def test_float64_samples_are_the_float32_jax_gives_with_x64_off(name) -> None:
    # the rule said float64 while JAX sampled float32: "the command's shape rule
    # disagrees with its forward" (a message for command authors) on valid input
    cmd = getattr(ops, name)(shape=(3,), dtype="float64")
    got = cmd(KEY)
    assert got.dtype == np.float32 and got.shape == (3,)
    want = getattr(ops, name)(shape=(3,), dtype="float32")(KEY)  # what x64-off JAX draws
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
