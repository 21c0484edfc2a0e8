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
    # Below the smallest normal number the spacing stops shrinking (float16 subnormals).
    tiny = float(jnp.finfo(dtype).tiny)
    tol = _ROUNDINGS[dtype] * np.maximum(np.abs(want) if scale is None else scale, tiny)
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


def _backward(name: str, grads, inputs, **params):
    """The command's backward as the graph's autodiff runs it (its OpDef's backward)."""
    cmd = getattr(ops, name)(**params)
    outs = cmd(*inputs)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    return ops.lookup(name).backward(list(grads), list(inputs), outs, **cmd.kwargs)


def _bilinear_image_grad(g: np.ndarray, grid: np.ndarray, h: int, w: int) -> np.ndarray:
    """float64 image gradient of grid_sample (align_corners=False): each output's
    gradient shared among its four taps by their bilinear weights, zeros outside."""
    n, ho, wo, c = g.shape
    ix, iy = ((grid[..., 0] + 1) * w - 1) / 2, ((grid[..., 1] + 1) * h - 1) / 2
    x0, y0 = np.floor(ix).astype(int), np.floor(iy).astype(int)
    fx, fy = ix - x0, iy - y0
    batch = np.broadcast_to(np.arange(n)[:, None, None], (n, ho, wo))
    out = np.zeros((n, h, w, c))
    for dy, dx, wt in ((0, 0, (1 - fy) * (1 - fx)), (0, 1, (1 - fy) * fx),
                       (1, 0, fy * (1 - fx)), (1, 1, fy * fx)):  # fmt: skip
        yy, xx = y0 + dy, x0 + dx
        inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        np.add.at(out, (batch[inside], yy[inside], xx[inside]), (g * wt[..., None])[inside])
    return out


@HALF
def test_grid_sample_image_gradient_sums_in_float32(dtype) -> None:
    """4096 samples of a 3x3 image: every pixel's gradient is thousands of shares."""
    a = jnp.asarray(rand((1, 3, 3, 2), dtype))
    grid = jnp.asarray(rand((1, 64, 64, 2), dtype, seed=1, lo=-0.6, hi=0.6))
    g = jnp.asarray(rand((1, 64, 64, 2), dtype, seed=2, lo=0.5, hi=1.5))
    ga, _ = _backward("grid_sample", [g], [a, grid])
    assert ga.dtype == dtype
    _close(ga, _bilinear_image_grad(_f64(g), _f64(grid), 3, 3), dtype)


@HALF
def test_roi_align_image_gradient_sums_in_float32(dtype) -> None:
    """1024 whole-image boxes read one 4x4 image in 2x2 bins of 2x2 pixels (samples at
    pixel centres, so average pooling): pixel (y, x) gets the sum over boxes of
    g[box, y // 2, x // 2] / 4."""
    a = jnp.asarray(rand((1, 4, 4, 2), dtype))
    boxes = jnp.asarray(np.tile([[0.0, 0.0, 1.0, 1.0]], (1024, 1)), dtype)
    g = jnp.asarray(rand((1024, 2, 2, 2), dtype, seed=2, lo=0.5, hi=1.5))
    ga, gb = _backward("roi_align", [g], [a, boxes], size=(2, 2))
    assert ga.dtype == dtype and gb is None
    want = np.repeat(np.repeat(_f64(g).sum(0), 2, axis=0), 2, axis=1)[None] / 4
    _close(ga, want, dtype)


@HALF
def test_segmented_gemm_bias_gradient_sums_each_segment_in_float32(dtype) -> None:
    """Two experts' segments of 3000 and 1096 rows: each bias row's gradient is its
    segment's float64 sum of g, rounded once (rows past the counts add nothing)."""
    a = jnp.asarray(rand((4200, 4), dtype))
    idx, cnt = jnp.asarray([1, 0], jnp.int32), jnp.asarray([3000, 1096], jnp.int32)
    w, bias = jnp.asarray(rand((2, 3, 4), dtype, seed=1)), jnp.asarray(rand((2, 3), dtype, seed=2))
    g = jnp.asarray(rand((4200, 3), dtype, seed=3, lo=0.5, hi=1.5))
    grads = _backward("segmented_gemm", [g], [a, idx, cnt, w, bias], transpose_b=True)
    assert grads[4].dtype == dtype
    g64 = _f64(g)
    _close(grads[4], np.stack([g64[3000:4096].sum(0), g64[:3000].sum(0)]), dtype)


def _softmax64(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _logsumexp64(x: np.ndarray) -> np.ndarray:
    top = x.max(-1, keepdims=True)
    return np.log(np.exp(x - top).sum(-1, keepdims=True)) + top


VOCAB = 131072  # sum(exp(x - max)) of x in [-0.25, 0.25] about 103000: past float16


@HALF
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "reduce_logsumexp"])
def test_softmax_family_over_a_vocabulary_past_float16s_range(name, dtype) -> None:
    """Forward and backward over 131072 classes: float16 had summed the exponentials in
    float16 (inf), giving softmax 0, log_softmax -inf and logsumexp inf."""
    x = jnp.asarray(rand((2, VOCAB), dtype, lo=-0.25, hi=0.25))
    x64 = _f64(x)
    params = {"axes": (1,)} if name == "reduce_logsumexp" else {}
    y = getattr(ops, name)(**params)(x)
    g = jnp.asarray(rand(y.shape, dtype, seed=1, lo=0.5, hi=1.5))
    (gx,) = _backward(name, [g], [x], **params)
    assert y.dtype == gx.dtype == dtype
    g64, y64 = _f64(g), _f64(y)
    if name == "softmax":
        _close(y, _softmax64(x64), dtype)
        want = y64 * (g64 - (g64 * y64).sum(-1, keepdims=True))
        _close(gx, want, dtype, scale=np.abs(want).max())
    elif name == "log_softmax":
        _close(y, x64 - _logsumexp64(x64), dtype)
        want = g64 - np.exp(y64) * g64.sum(-1, keepdims=True)
        _close(gx, want, dtype, scale=np.abs(want).max())
    else:
        _close(y, _logsumexp64(x64), dtype)
        _close(gx, g64 * _softmax64(x64), dtype)


@HALF
@pytest.mark.parametrize(
    "shape, axes", [((65536,), (0,)), ((2, 65536), (1,)), ((64, 64, 3), (0, 1))], ids=str
)
def test_reduce_sum_sums_16_bit_values_in_float32(dtype, shape, axes) -> None:
    """1-D, last-axis and leading-axes (leading_sum's two stages) sums of positive
    16-bit values: the float64 sum rounded once, as jnp.sum gives."""
    x = jnp.asarray(rand(shape, dtype, lo=0.05, hi=0.15))
    y = ops.reduce_sum(axes=axes)(x)
    assert y.dtype == dtype
    _close(y, _f64(x).sum(axis=axes, keepdims=True), dtype)


@HALF
def test_reduce_norm2_squares_16_bit_values_in_float32(dtype) -> None:
    """Entries of 200 to 400 square past float16's 65504 (the norm, about 2400, does
    not): forward and backward against float64 NumPy."""
    x = jnp.asarray(rand((3, 64), dtype, lo=200.0, hi=400.0))
    y = ops.reduce_norm2(axes=(1,))(x)
    assert y.dtype == dtype
    x64 = _f64(x)
    _close(y, np.sqrt((x64 * x64).sum(1, keepdims=True)), dtype)
    g = jnp.asarray(rand((3, 1), dtype, seed=1, lo=0.5, hi=1.5))
    (gx,) = _backward("reduce_norm2", [g], [x], axes=(1,))
    assert gx.dtype == dtype
    _close(gx, x64 * _f64(g) / np.sqrt((x64 * x64).sum(1, keepdims=True)), dtype)
