"""16-bit random samples are float32 draws rounded once (NNC writes a float draw into a
16-bit tensor): ``jax.random.uniform`` in bfloat16 fills only its 7-bit mantissa, 128
values in ``[0, 1)``, and its normal stopped near 2.5 sigma."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops

KEY = jax.random.key_data(jax.random.key(3))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float8_e4m3fn"])
def test_uniform_is_the_float32_draw_rounded_and_stays_below_high(dtype):
    shape, low, high = (4096,), -1.0, 1.0
    got = np.asarray(ops.random_uniform(shape=shape, dtype=dtype, low=low, high=high)(KEY))
    wide = np.asarray(ops.random_uniform(shape=shape, low=low, high=high)(KEY))
    want = wide.astype(jnp.dtype(dtype))
    top = np.nextafter(np.array(high, jnp.dtype(dtype)), np.array(low, jnp.dtype(dtype)))
    want = np.where(want >= high, top, want)
    assert got.dtype == jnp.dtype(dtype)
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
    assert np.isfinite(got.astype(np.float32)).all()  # e4m3fn has no -inf to step toward
    assert got.astype(np.float32).min() >= low and got.astype(np.float32).max() < high
    if jnp.dtype(dtype).itemsize == 2:
        assert len(np.unique(got)) > 1000  # a bfloat16 draw gave 256 values in [-1, 1)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_normal_is_the_float32_draw_scaled_and_rounded_once(dtype):
    shape, mean, std = (4096,), 0.5, 0.02
    got = np.asarray(ops.random_normal(shape=shape, dtype=dtype, mean=mean, std=std)(KEY))
    wide = np.asarray(ops.random_normal(shape=shape, mean=mean, std=std)(KEY))
    np.testing.assert_array_equal(
        got.astype(np.float32), wide.astype(jnp.dtype(dtype)).astype(np.float32)
    )
    z = (wide - mean) / std
    assert np.abs(z).max() > 3  # the tails are there


def test_float32_samples_are_unchanged():
    """float32 draws are jax.random's own, as before."""
    u = ops.random_uniform(shape=(5,), low=2.0, high=-1.0)(KEY)
    np.testing.assert_array_equal(
        u, jax.random.uniform(jax.random.wrap_key_data(KEY), (5,), jnp.float32, -1.0, 2.0)
    )
    n = ops.random_normal(shape=(5,), mean=1.0, std=2.0)(KEY)
    want = jax.random.normal(jax.random.wrap_key_data(KEY), (5,)) * 2.0 + 1.0
    np.testing.assert_array_equal(n, want)
