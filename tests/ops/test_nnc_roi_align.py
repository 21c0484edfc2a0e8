"""NNC's ``test/unit/nnc/roi_align.tests.c``, translated, plus a NumPy port of NNC's CPU
reference for boxes that need bilinear taps and boxes that leave the image."""

import math

import jax
import numpy as np

from fnnc import ops

BOX = np.array([0.0, 0.0, 1.0, 1.0], np.float32)


def _ramp(batch: int = 0) -> np.ndarray:
    a = np.repeat(np.arange(12 * 24, dtype=np.float32)[:, None], 3, axis=1).reshape(12, 24, 3)
    return np.stack([a] * batch) if batch else a


def _average_pool_3x6(a: np.ndarray) -> np.ndarray:
    return a.reshape(4, 3, 4, 6, 3).mean(axis=(1, 3))


def test_compare_roi_align_forward_with_average_pool():
    """NNC TEST_CASE covered here:
    "compare ROI align forward with average pool".
    """
    c = ops.roi_align(size=(4, 4))(_ramp(), BOX)
    np.testing.assert_allclose(c, _average_pool_3x6(_ramp()), rtol=1e-6)


def test_compare_roi_align_backward_with_average_pool():
    g = np.repeat(np.arange(16, dtype=np.float32)[:, None], 3, axis=1).reshape(4, 4, 3)
    cmd = ops.roi_align(size=(4, 4))
    spec = jax.ShapeDtypeStruct((12, 24, 3), np.float32)
    da, dbox = cmd.definition.backward((g,), (spec, BOX), (None,), **cmd.kwargs)
    want = np.repeat(np.repeat(g, 3, axis=0), 6, axis=1) / 18  # average pool's backward
    np.testing.assert_allclose(da, want, rtol=1e-6)
    assert dbox is None


def test_compare_roi_align_forward_with_average_pool_batch_of_2():
    """NNC TEST_CASE covered here:
    "compare ROI align forward with average pool, batch of 2".
    """
    c = ops.roi_align(size=(4, 4))(_ramp(2), BOX)
    for k in range(2):
        np.testing.assert_allclose(c[k], _average_pool_3x6(_ramp()), atol=1e-5)


def _nnc_reference(a: np.ndarray, box: np.ndarray, ph: int, pw: int) -> np.ndarray:
    """``_ccv_nnc_roi_align_forw`` for one image and box, loop for loop."""
    h, w, ch = a.shape
    rx, ry, rw, rh = box[0] * w, box[1] * h, box[2] * w, box[3] * h

    def coeffs(start, extent, n, pool):
        bins = math.ceil(extent / pool)
        scale = extent / (bins * pool)
        out = []
        for i in range(pool):
            taps = []
            for s in range(bins):
                pos = start + (s + i * bins + 0.5) * scale - 0.5
                lo = math.floor(pos)
                if lo + 1 < 0 or lo > n - 1:
                    continue
                taps.append((min(max(lo, 0), n - 1), min(max(lo + 1, 0), n - 1), pos - lo))
            out.append(taps)
        return out

    ys, xs = coeffs(ry, rh, h, ph), coeffs(rx, rw, w, pw)
    c = np.zeros((ph, pw, ch))
    for i in range(ph):
        for j in range(pw):
            if not ys[i] or not xs[j]:
                continue
            for y0, y1, r in ys[i]:
                for x0, x1, q in xs[j]:
                    c[i, j] += (a[y0, x0] * (1 - r) * (1 - q) + a[y0, x1] * (1 - r) * q
                                + a[y1, x0] * r * (1 - q) + a[y1, x1] * r * q)  # fmt: skip
            c[i, j] /= len(ys[i]) * len(xs[j])
    return c


def test_roi_align_matches_nnc_reference_on_fractional_and_outside_boxes():
    a = np.random.default_rng(0).normal(size=(7, 9, 2)).astype(np.float32)
    boxes = np.array(
        [
            [0.13, 0.21, 0.55, 0.61],
            [-0.3, 0.4, 0.9, 0.9],
            [0.8, -0.2, 0.5, 0.4],
            [0.1, 0.1, 1.7, 1.2],
        ],
        np.float32,
    )
    got = ops.roi_align(size=(3, 2))(a, boxes)
    for n, box in enumerate(boxes):
        np.testing.assert_allclose(got[n], _nnc_reference(a, box, 3, 2), rtol=1e-5, atol=1e-5)
