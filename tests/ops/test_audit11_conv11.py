"""Audit 11 (conv11): spatial commands against NNC's CPU reference kernels and JAX."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import ShapeError


@pytest.mark.parametrize(
    "kw", [dict(strides=1), dict(strides=2), dict(strides=2, padding="SAME"), dict(strides=3)]
)
@pytest.mark.parametrize("x_shape", [(1, 0, 3, 4), (1, 3, 0, 4), (0, 4)])
def test_convolution_transpose_of_an_empty_spatial_axis_is_refused(kw, x_shape) -> None:
    """No convolution outputs an empty spatial axis (its window never fits one), so a
    transpose of one has nothing to be the adjoint of: stride 1 had made a 2x5 output of
    zeros from [1, 0, 3, 4] and strides 2 failed as 'the shape rule disagrees with its
    forward'. The oracle: the convolution refuses the matching empty input too."""
    w = jnp.ones((4, 3, 3, 3)) if len(x_shape) == 4 else jnp.ones((4, 3, 3))
    x = jnp.zeros(x_shape)
    with pytest.raises(ShapeError, match="empty spatial axis"):
        ops.convolution_transpose(**kw)(x, w)
    back = jnp.zeros((*x_shape[:-1], 3))
    with pytest.raises(ShapeError):
        ops.convolution(**kw)(back, w)


def test_convolution_transpose_keeps_nnc_values_on_a_one_cell_input() -> None:
    """The smallest input still works: a 1x1 input scatters the weight (NNC's loop)."""
    w = np.arange(18, dtype=np.float32).reshape(2, 3, 3, 1)
    x = np.array([[[[1.0, 2.0]]]], np.float32)
    y = np.asarray(ops.convolution_transpose(strides=2)(jnp.asarray(x), jnp.asarray(w)))
    want = (w[0, :, :, 0] * 1.0 + w[1, :, :, 0] * 2.0)[None, :, :, None]
    np.testing.assert_array_equal(y, want)
