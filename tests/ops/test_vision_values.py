"""grid_sample against a NumPy port of NNC's ``ccv_nnc_grid_sample_cpu_ref.c``."""

import numpy as np
import pytest

from fnnc import ops


def _reference(a: np.ndarray, grid: np.ndarray, align: bool) -> np.ndarray:
    n, h, w, c = a.shape
    out = np.zeros((n, *grid.shape[1:3], c))
    for b in range(n):
        for y in range(grid.shape[1]):
            for x in range(grid.shape[2]):
                gx, gy = grid[b, y, x]
                ix = (gx + 1) * (w - 1) / 2 if align else ((gx + 1) * w - 1) / 2
                iy = (gy + 1) * (h - 1) / 2 if align else ((gy + 1) * h - 1) / 2
                x0, y0 = int(np.floor(ix)), int(np.floor(iy))
                wx, wy = ix - x0, iy - y0
                taps = [(y0, x0, (1 - wy) * (1 - wx)), (y0, x0 + 1, (1 - wy) * wx)]
                taps += [(y0 + 1, x0, wy * (1 - wx)), (y0 + 1, x0 + 1, wy * wx)]
                for yy, xx, weight in taps:
                    if 0 <= yy < h and 0 <= xx < w:
                        out[b, y, x] += a[b, yy, xx] * weight
    return out


@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_matches_nnc_reference(align):
    rng = np.random.default_rng(1)
    a = rng.normal(size=(2, 5, 4, 3)).astype(np.float32)
    grid = rng.uniform(-1.3, 1.3, size=(2, 3, 6, 2)).astype(np.float32)
    got = ops.grid_sample(align_corners=align)(a, grid)
    np.testing.assert_allclose(got, _reference(a, grid, align), rtol=1e-5, atol=1e-5)
