"""16-bit (bfloat16, float16) commands that sum many values add them in float32 and
round once: each result is checked against a float64 NumPy oracle of the same 16-bit
inputs, within a few roundings of the output type. The old 16-bit running sums stopped
growing (bfloat16 4096 x 0.1 gave 32, not 410) or overflowed float16."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from tests.helpers import rand

HALF = pytest.mark.parametrize("dtype", [jnp.bfloat16, np.float16], ids=["bfloat16", "float16"])

# Three roundings of the output type (half its spacing at 1 each).
_ROUNDINGS = {jnp.bfloat16: 3 * 2.0**-8, np.float16: 3 * 2.0**-11}


def _f64(a) -> np.ndarray:
    return np.asarray(jnp.asarray(a).astype(jnp.float32), np.float64)


def _close(got, want, dtype, scale=None) -> None:
    """Within a few roundings of ``dtype``, relative to each value (or to ``scale``)."""
    got, want = _f64(got), np.asarray(want, np.float64)
    assert np.all(np.isfinite(got)), got
    tol = _ROUNDINGS[dtype] * (np.abs(want) if scale is None else scale)
    np.testing.assert_array_less(np.abs(got - want), tol + 1e-30)


@HALF
def test_scatter_add_sums_16_bit_rows_in_float32(dtype) -> None:
    """4096 positive rows into 3 bins: each bin is the float64 sum rounded once."""
    n = 4096
    x = jnp.asarray(rand((n, 2), dtype, lo=0.05, hi=0.15))
    ind = jnp.asarray(np.arange(n) % 3, jnp.int32)
    y = ops.scatter_add(bincount=3)(x, ind)
    assert y.dtype == dtype
    want = np.zeros((3, 2))
    np.add.at(want, np.arange(n) % 3, _f64(x))
    _close(y, want, dtype)
