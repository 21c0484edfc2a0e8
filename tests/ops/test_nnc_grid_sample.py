"""NNC's ``test/unit/nnc/grid_sample.tests.c``, translated."""

import numpy as np

from fnnc import ops


def test_grid_sample_forward():
    a = np.arange(1, 5, dtype=np.float32).reshape(1, 2, 2, 1)
    grid = np.array([-1, -1, 1, 1], np.float32).reshape(1, 1, 2, 2)
    b = ops.grid_sample(align_corners=True)(a, grid)
    np.testing.assert_allclose(np.asarray(b).ravel(), [1, 4], atol=1e-5)
