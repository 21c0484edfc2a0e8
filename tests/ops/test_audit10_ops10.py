"""Audit 10 (ops10): command semantics against NNC's CPU reference kernels."""

import functools

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError, ShapeError

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


@functools.cache
def _jitted_nms(threshold):
    cmd = ops.nms(iou_threshold=threshold)
    return jax.jit(lambda a: cmd(a))


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
        b, idx = jax.tree.map(np.asarray, _jitted_nms(threshold)(a))
        np.testing.assert_array_equal(idx, want_idx)
        np.testing.assert_array_equal(b, want_b)


def _nnc_grid_sample(a, grid, align_corners):
    """A port of ``_ccv_nnc_grid_sample_forw`` (ccv_nnc_grid_sample_cpu_ref.c), NHWC."""
    n, h, w, c = a.shape
    out = np.zeros((n, grid.shape[1], grid.shape[2], c), np.float64)
    for b in range(n):
        for y in range(grid.shape[1]):
            for x in range(grid.shape[2]):
                gx, gy = (float(v) for v in grid[b, y, x])
                ix = (gx + 1) * (w - 1) * 0.5 if align_corners else ((gx + 1) * w - 1) * 0.5
                iy = (gy + 1) * (h - 1) * 0.5 if align_corners else ((gy + 1) * h - 1) * 0.5
                x0, y0 = int(np.floor(ix)), int(np.floor(iy))
                wx1, wy1 = ix - x0, iy - y0
                for yy, xx, wt in (
                    (y0, x0, (1 - wy1) * (1 - wx1)),
                    (y0, x0 + 1, (1 - wy1) * wx1),
                    (y0 + 1, x0, wy1 * (1 - wx1)),
                    (y0 + 1, x0 + 1, wy1 * wx1),
                ):
                    if 0 <= yy < h and 0 <= xx < w:
                        out[b, y, x] += a[b, yy, xx] * wt
    return out


@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_takes_one_image_without_a_batch_axis_as_nnc(align_corners):
    # NNC's kernel takes a [H, W, C] image with a [Ho, Wo, 2] grid; the rule refused it.
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 4, 2)).astype(np.float32)
    grid = rng.uniform(-1.2, 1.2, (2, 3, 2)).astype(np.float32)
    cmd = ops.grid_sample(align_corners=align_corners)
    y = cmd(a, grid)
    assert y.shape == (2, 3, 2)
    want = _nnc_grid_sample(a[None], grid[None], align_corners)[0]
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-6)
    g = rng.standard_normal(y.shape).astype(np.float32)
    back = jax.jit(lambda g, a, grid, y: cmd.definition.backward((g,), (a, grid), (y,)))
    ga, gg = back(g, a, grid, y)
    batched = back(g[None], a[None], grid[None], y[None])
    np.testing.assert_allclose(np.asarray(ga), np.asarray(batched[0])[0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gg), np.asarray(batched[1])[0], rtol=1e-6)


def test_grid_sample_of_no_images():
    # Was a bare ZeroDivisionError: a reshape to (0, -1) cannot infer -1.
    cmd = ops.grid_sample()
    a, grid = np.zeros((0, 2, 2, 1), np.float32), np.zeros((0, 3, 1, 2), np.float32)
    y = cmd(a, grid)
    assert y.shape == (0, 3, 1, 1)
    back = jax.jit(lambda g, a, grid, y: cmd.definition.backward((g,), (a, grid), (y,)))
    ga, gg = back(np.ones(y.shape, np.float32), a, grid, y)
    assert ga.shape == a.shape and gg.shape == grid.shape


@pytest.mark.parametrize("image", [(2, 4, 4, 3), (4, 4, 3)])
def test_roi_align_of_no_boxes_gives_no_outputs(image):
    # Was jnp.take's bare IndexError (box n reads boxes[n % 0]); NNC divides by zero.
    a = np.arange(np.prod(image), dtype=np.float32).reshape(image)
    boxes = np.zeros((0, 4), np.float32)
    cmd = ops.roi_align(size=(2, 2))
    y = cmd(a, boxes)
    assert y.shape == (0, 2, 2, 3)
    (ga, gb) = cmd.definition.backward(
        (np.ones(y.shape, np.float32),), (a, boxes), (y,), size=(2, 2)
    )
    np.testing.assert_array_equal(np.asarray(ga), np.zeros(image, np.float32))
    assert gb is None


def test_roi_align_refuses_boxes_without_images():
    with pytest.raises(ShapeError, match="holds no images"):
        ops.roi_align(size=(2, 2))(np.zeros((0, 4, 4, 1), np.float32), np.zeros((3, 4), np.float32))


def test_roi_align_size_is_checked_as_ints():
    # (1.5, 2) was truncated to (1, 2); size=2 failed inside the rule on 2[0].
    a = np.arange(16, dtype=np.float32).reshape(4, 4, 1)
    box = np.array([0.0, 0.0, 1.0, 1.0], np.float32)
    with pytest.raises(CommandError, match="size must be ints"):
        ops.roi_align(size=(1.5, 2))(a, box)
    with pytest.raises(CommandError, match=r"size must be \(rows, cols\)"):
        ops.roi_align(size=(2, 2, 2))(a, box)
    # One int is both, as conv and pool sizes; NNC's four 2x2 bin averages of arange(16).
    np.testing.assert_allclose(
        np.asarray(ops.roi_align(size=2)(a, box))[..., 0], [[2.5, 4.5], [10.5, 12.5]]
    )


@pytest.mark.parametrize("scale", [(2,), (2, 2, 2), float("nan"), (float("inf"), 2), 0, -1.5])
def test_upsample_scale_must_be_two_finite_positive_numbers(scale):
    # (2,) and NaN failed inside the rule (unpacking, int(nan)) as RuleErrors.
    with pytest.raises(CommandError, match=r"scale must be \(sh, sw\)"):
        ops.upsample(scale=scale)(np.zeros((1, 2, 2, 1), np.float32))


def test_upsample_refuses_an_axis_beyond_32_bits_before_allocating():
    # scale=1e10 allocated 149 GiB of float64 taps and died with a MemoryError.
    with pytest.raises(ShapeError, match="20000000000 x 20000000000"):
        ops.upsample(scale=1e10)(np.zeros((1, 2, 2, 1), np.float32))
    x = np.arange(4, dtype=np.float32).reshape(1, 2, 2, 1)  # the valid forms still work
    np.testing.assert_array_equal(
        np.asarray(ops.upsample(scale=[1, 2])(x))[0, :, :, 0], [[0, 0, 1, 1], [2, 2, 3, 3]]
    )


def _tanh_gelu_derivative(x):
    """d/dx of 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in float64 (1 / 0 at +-inf)."""
    x = np.asarray(x, np.float64)
    s, c = np.sqrt(2 / np.pi), 0.044715
    with np.errstate(all="ignore"):
        t = np.tanh(s * (x + c * x**3))
        d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * s * (1 + 3 * c * x * x)
    return np.where(np.isinf(x), (x > 0).astype(np.float64), d)


@pytest.mark.parametrize(
    "dtype, xs",
    [
        (np.float16, [300.0, -300.0, 1e4, -1e4, 20.5, -20.5, 3.0, np.inf, -np.inf]),
        (np.float32, [1e13, -1e13, 1e20, -1e20, 20.5, -20.5, 3.0, np.inf, -np.inf]),
    ],
)
def test_tanh_gelu_gradient_of_large_inputs_is_one_or_zero_not_nan(dtype, xs):
    # x * x overflowed (float16 from |x| = 256, float32 from 1.8e19): (1 - tanh^2) * du was
    # 0 * inf = NaN, in the hand-written backward and in jax.vjp of the forward (fused chains).
    cmd = ops.gelu(approximate=True)
    x = np.array(xs, dtype)
    ones = np.ones_like(x)
    back = jax.jit(lambda x: cmd.definition.backward((ones,), (x,), (cmd(x),), **cmd.kwargs)[0])
    derived = jax.jit(
        lambda x: jax.vjp(lambda t: cmd.definition.forward(t, **cmd.kwargs), x)[1](ones)[0]
    )
    want = _tanh_gelu_derivative(x)
    tol = 2e-3 if dtype == np.float16 else 1e-6
    np.testing.assert_allclose(np.asarray(back(x), np.float64), want, rtol=tol, atol=tol)
    finite = np.isfinite(x)  # at +-inf the forward itself is 0.5 * inf * (1 + t) (NaN at -inf)
    got = np.asarray(derived(x), np.float64)[finite]
    np.testing.assert_allclose(got, want[finite], rtol=tol, atol=tol)
