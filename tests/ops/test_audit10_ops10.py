"""Audit 10 (ops10): command semantics against NNC's CPU reference kernels."""

import jax
import numpy as np
import pytest

from fnnc import ops

FLT_MAX = float(np.finfo(np.float32).max)


def _nnc_nms(a, threshold):
    """A port of ``_ccv_nnc_nms_forw`` (ccv_nnc_nms_cpu_ref.c) for one [M, 5] batch,
    with a stable sort (NNC's quicksort leaves equal scores in any order)."""
    order = np.argsort(-a[:, 0], kind="stable")
    b, c = a[order].copy(), order.astype(np.int32)
    m = a.shape[0]
    for x in range(m):
        if b[x, 0] == -FLT_MAX:
            continue
        area1 = np.float32(b[x, 3] * b[x, 4])
        for y in range(x + 1, m):
            if b[y, 0] == -FLT_MAX:
                continue
            area2 = np.float32(b[y, 3] * b[y, 4])
            xd = max(0, min(b[x, 1] + b[x, 3], b[y, 1] + b[y, 3]) - max(b[x, 1], b[y, 1]))
            yd = max(0, min(b[x, 2] + b[x, 4], b[y, 2] + b[y, 4]) - max(b[x, 2], b[y, 2]))
            inter = np.float32(xd * yd)
            with np.errstate(all="ignore"):
                iou = np.float32(inter / np.float32(area1 + area2 - inter))
            if iou >= threshold:
                b[y, 0] = -FLT_MAX
    kept = [x for x in range(m) if b[x, 0] != -FLT_MAX]
    out, idx = b.copy(), np.full((m,), -1, np.int32)
    out[: len(kept)], idx[: len(kept)] = b[kept], c[kept]
    out[len(kept) :, 0] = -FLT_MAX
    return out, idx


@pytest.mark.parametrize("shape", [(0, 5), (2, 0, 5), (0, 3, 5)])
def test_nms_of_no_rows_keeps_nothing(shape):
    # Was jnp's bare "IndexError: index is out of bounds for axis 0 with size 0".
    a = np.zeros(shape, np.float32)
    cmd = ops.nms(iou_threshold=0.5)
    b, idx = cmd(a)
    assert b.shape == shape and b.dtype == np.float32
    assert idx.shape == shape[:-1] and idx.dtype == np.int32
    (ga,) = cmd.definition.backward(
        (np.ones(shape, np.float32), None), (a,), (b, idx), **cmd.kwargs
    )
    assert ga.shape == shape


def test_nms_matches_nnc_cpu_reference():
    rng = np.random.default_rng(0)
    for t in range(12):
        m = 6
        a = np.zeros((m, 5), np.float32)
        a[:, 0] = rng.permutation(m).astype(np.float32) + 0.5
        a[:, 1:3] = rng.integers(0, 4, (m, 2))
        a[:, 3:5] = rng.integers(0, 3, (m, 2))  # zero-area boxes too: IoU 0/0 keeps both
        a[t % m, 0] = -FLT_MAX if t % 3 == 0 else a[t % m, 0]
        threshold = (0.0, 0.3, 0.5, 1.0)[t % 4]
        want_b, want_idx = _nnc_nms(a, threshold)
        b, idx = jax.tree.map(np.asarray, ops.nms(iou_threshold=threshold)(a))
        np.testing.assert_array_equal(idx, want_idx)
        np.testing.assert_array_equal(b, want_b)
