"""NNC's integration tests of the vision commands, ported (liuliu/ccv ``test/int/nnc/``:
``roi_align.tests.c``, ``nms.tests.c`` and the Metal align-corners cases of
``upsample.tests.c``).

Each C test runs a command on the GPU (or Metal) and compares it with NNC's CPU reference
kernel on the same inputs. Here fnnc's command runs on the C test's shapes (channels
shrunk from 128 to 4) and is checked against the CPU kernel's result computed
independently: closed forms where the C test's configuration makes one exact (a box
covering the whole image is an average pool), a NumPy port of the CPU kernel otherwise
(``_nnc_reference`` of ``test_nnc_roi_align.py``, ``nnc_taps`` of
``test_nnc_int_misc_2.py``, the greedy suppression loop below). fnnc's spatial commands
are NHWC, so NNC's NCHW tensors go through ``format_transform`` around them, as the C
tests themselves do on the CPU side. ``dsfmt_genrand_open_close`` draws become NumPy draws
in (0, 1].

The unit-test cases (the ramp image against an average pool, fractional boxes, ten boxes
of NMS) are in ``test_nnc_roi_align.py`` and ``test_nnc_nms.py``; the other upsample
cases in ``test_nnc_int_misc_2.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from tests.helpers import assert_close
from tests.ops.test_nnc_int_misc_2 import nnc_downsample, nnc_upsample, open_close
from tests.ops.test_nnc_roi_align import _nnc_reference

f32 = np.float32
Spec = jax.ShapeDtypeStruct
TO_NCHW = ops.format_transform(src="NHWC", dst="NCHW")
TO_NHWC = ops.format_transform(src="NCHW", dst="NHWC")
FLT_MAX = np.finfo(np.float32).max

# -- roi_align.tests.c --------------------------------------------------------------------

# NNC's box (x, y, w, h) = (0 / 32, 0 / 32, 1, 1): the whole 32x32 image in 4x4 bins, so
# each bin averages 8x8 samples at pixel centres (no interpolation) and the backward
# spreads each bin's gradient evenly over its 8x8 pixels.
BOX = np.array([0.0, 0.0, 1.0, 1.0], f32)
SIDE, BINS, CHANNELS = 32, 4, 4
ROI = ops.roi_align(size=(BINS, BINS))


def _batched(shape_hwc, batch):
    return (batch, *shape_hwc) if batch else shape_hwc


def _block_mean(a):
    """[..., 32, 32, C] -> [..., 4, 4, C]: the mean of each 8x8 block."""
    k = SIDE // BINS
    lead = a.shape[:-3]
    return a.reshape(*lead, BINS, k, BINS, k, a.shape[-1]).mean(axis=(-4, -2))


def _block_spread(g):
    """[..., 4, 4, C] -> [..., 32, 32, C]: each bin's gradient / 64 over its block."""
    k = SIDE // BINS
    return np.repeat(np.repeat(g.astype(np.float64), k, axis=-3), k, axis=-2) / (k * k)


def _roi_align_backward(g_nhwc, batch):
    spec = Spec(_batched((SIDE, SIDE, CHANNELS), batch), f32)
    da, dbox = ROI.definition.backward((g_nhwc,), (spec, jnp.asarray(BOX)), (None,), **ROI.kwargs)
    assert dbox is None  # NNC's backward writes no box gradient either
    return da


@pytest.mark.parametrize("batch", [0, 2], ids=["one image", "batch of 2"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_roi_align_forward(layout, batch):
    """NNC: "roi align forward with NCHW", "roi align forward with NHWC", "roi align forward
    with NCHW, batch of 2", "roi align forward with NHWC, batch of 2":
    CMD_ROI_ALIGN_FORWARD(4, 4) of (0, 1] draws
    [(2,) 32, 32, C] with the one box (0, 0, 1, 1) shared by the batch equals the CPU
    kernel (loop for loop, per image) and the 8x8 block means; the NCHW run, through
    format_transform, gives the NHWC result transposed."""
    a = open_close(_batched((SIDE, SIDE, CHANNELS), batch), 0)
    images = a if batch else a[None]
    want = np.stack([_nnc_reference(image, BOX, BINS, BINS) for image in images])
    want = want if batch else want[0]
    np.testing.assert_allclose(want, _block_mean(a.astype(np.float64)), rtol=1e-12)
    if layout == "NHWC":
        got = ROI(a, BOX)
    else:
        got = TO_NHWC(TO_NCHW(ROI(TO_NHWC(TO_NCHW(a)), BOX)))
    assert got.shape == _batched((BINS, BINS, CHANNELS), batch) and got.dtype == f32
    assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("batch", [0, 2], ids=["one image", "batch of 2"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_roi_align_backward(layout, batch):
    """NNC: "roi align backward with NCHW", "roi align backward with NHWC", "roi align backward
    with NCHW, batch of 2", "roi align backward with NHWC, batch of 2":
    CMD_ROI_ALIGN_BACKWARD(4, 4) from
    ``TENSOR_LIST(g, 0, b)`` (no forward input, only its shape) of a (0, 1] gradient
    [(2,) 4, 4, C] gives every image of the batch its own bins' gradient spread over
    8x8 pixels, and is the adjoint of the CPU kernel's forward:
    ``<roi_align(x), g> == <x, da>`` for a random x."""
    g = open_close(_batched((BINS, BINS, CHANNELS), batch), 1)
    if layout == "NHWC":
        da = _roi_align_backward(jnp.asarray(g), batch)
    else:
        g_nchw = TO_NCHW(g)
        da = TO_NHWC(TO_NCHW(_roi_align_backward(TO_NHWC(g_nchw), batch)))
    assert da.shape == _batched((SIDE, SIDE, CHANNELS), batch) and da.dtype == f32
    assert_close(da, _block_spread(g), rtol=1e-6, atol=1e-7)
    x = open_close(_batched((SIDE, SIDE, CHANNELS), batch), 2).astype(np.float64)
    images = x if batch else x[None]
    fx = np.stack([_nnc_reference(image, BOX, BINS, BINS) for image in images])
    lhs = float(np.sum(fx * (g if batch else g[None])))
    np.testing.assert_allclose(float(np.sum(x * np.asarray(da, np.float64))), lhs, rtol=1e-5)


# -- nms.tests.c --------------------------------------------------------------------------


def _nms_rows(m):
    """The C tests' rows (score i, x i, y 0, w 2, h 1): box i overlaps box i + 1 by half
    its width, IoU 1 / 3, and box i + 2 not at all."""
    i = np.arange(m, dtype=f32)
    return np.stack([i, i, np.zeros(m, f32), np.full(m, 2, f32), np.ones(m, f32)], axis=1)


def nnc_nms(a, threshold):
    """ccv_nnc_nms_cpu_ref.c's result: rows sorted by score (descending, stable), then
    greedily each row not yet suppressed suppresses the later rows whose IoU with it is at
    least ``threshold``; returns the kept rows' input indices in order."""
    order = np.argsort(-a[:, 0].astype(np.float64), kind="stable")
    b = a[order].astype(np.float64)
    x0, y0, x1, y1 = b[:, 1], b[:, 2], b[:, 1] + b[:, 3], b[:, 2] + b[:, 4]
    area = b[:, 3] * b[:, 4]
    dropped = np.zeros(len(b), bool)
    for i in range(len(b)):
        if dropped[i]:
            continue
        w = np.maximum(0, np.minimum(x1[i], x1) - np.maximum(x0[i], x0))
        h = np.maximum(0, np.minimum(y1[i], y1) - np.maximum(y0[i], y0))
        inter = w * h
        later = np.arange(len(b)) > i
        dropped |= later & (inter / (area[i] + area - inter) >= threshold)
    return order[~dropped]


def test_compare_nms_forward():
    """NNC: "compare nms forward": CMD_NMS_FORWARD(0.3) of the 1000 rows (score i, i, 0,
    2, 1): every other box survives (999, 997, ..., 1); the kept rows come first in score
    order, the indices of the rest are -1 and their scores -FLT_MAX (NNC's padding)."""
    a = _nms_rows(1000)
    kept = nnc_nms(a, 0.3)
    np.testing.assert_array_equal(kept, np.arange(999, 0, -2))
    b, c = ops.nms(iou_threshold=0.3)(a)
    assert b.shape == (1000, 5) and c.shape == (1000,) and c.dtype == np.int32
    n = len(kept)
    np.testing.assert_array_equal(c[:n], kept)
    np.testing.assert_array_equal(c[n:], -1)
    np.testing.assert_array_equal(b[:n], a[kept])
    np.testing.assert_array_equal(np.asarray(b)[n:, 0], -FLT_MAX)


def test_compare_nms_backward():
    """NNC: "compare nms backward": CMD_NMS_BACKWARD(0.3) from ``TENSOR_LIST(a, 0, 0, 0,
    c)``, the 100 rows as the gradient of the sorted rows and indices c = 10, 9, ..., 1
    then -1 (given, not computed by a forward): gradient row k goes to input row c[k], the
    rows c leaves out get zeros, exactly NNC's expected tensor."""
    a = _nms_rows(100)
    c = np.array([10 - i for i in range(10)] + [-1] * 90, np.int32)
    cmd = ops.nms(iou_threshold=0.3)
    (da,) = cmd.definition.backward(
        (jnp.asarray(a), None), (Spec((100, 5), f32),), (None, jnp.asarray(c)), **cmd.kwargs
    )
    want = np.zeros((100, 5), f32)
    for i in range(1, 11):
        j = 10 - i
        want[i] = [j, j, 0, 2, 1]
    np.testing.assert_array_equal(da, want)


# -- upsample.tests.c: the Metal align-corners cases ---------------------------------------


def test_upsample_bilinear_nhwc_align_corners():
    """NNC: "mps upsample bilinear NHWC, align corners": CMD_UPSAMPLE_FORWARD(BILINEAR, 2,
    2, 1) of (0, 1] draws [14, 14, 5] -> [28, 28, 5]; the corner pixels map onto each
    other (r = 13 / 27), as the CPU kernel's taps."""
    a = open_close((14, 14, 5), 0)
    got = ops.upsample(scale=(2, 2), mode="bilinear", align_corners=True)(a)
    assert got.shape == (28, 28, 5)
    want = nnc_upsample(a, (28, 28), "bilinear", align=True)
    assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert_close(got[[0, 0, -1, -1], [0, -1, 0, -1]], a[[0, 0, -1, -1], [0, -1, 0, -1]])


def test_downsample_bilinear_nhwc_align_corners():
    """NNC: "mps downsample bilinear NHWC, align corners": CMD_UPSAMPLE_BACKWARD(BILINEAR,
    2, 2, 1) of (0, 1] draws [14, 14, 5] onto [7, 7, 5] (r = 6 / 13): each big pixel's
    gradient splits between its two aligned taps per axis, so the sum is kept."""
    g = open_close((14, 14, 5), 0)
    cmd = ops.upsample(scale=(2, 2), mode="bilinear", align_corners=True)
    (got,) = cmd.definition.backward(
        (jnp.asarray(g),), (Spec((7, 7, 5), f32),), (None,), **cmd.kwargs
    )
    assert got.shape == (7, 7, 5)
    assert_close(got, nnc_downsample(g, (7, 7), "bilinear", align=True), rtol=1e-6, atol=1e-5)
    assert_close(jnp.sum(got, axis=(0, 1)), g.astype(np.float64).sum(axis=(0, 1)), rtol=1e-5)
