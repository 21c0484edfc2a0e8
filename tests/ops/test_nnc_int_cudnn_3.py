"""NNC's cuDNN integration tests (liuliu/ccv ``test/int/nnc/cudnn.tests.c``), continued from
``test_nnc_int_cudnn_2.py``: average and max pooling, relu / sigmoid / tanh / softmax,
dropout, add, softmax cross-entropy and ewsum.

As in ``test_nnc_int_cudnn.py``, each C test's cuDNN-against-CPU comparison becomes
fnnc's command against an independent float64 oracle (NumPy loops or closed forms),
gradients coming from each command's backward in NNC's convention. Shapes are the C
test's; NNC's batch-less ``[7, 7, 10]`` images get a batch axis of 1, NCHW data goes
through ``format_transform``, and half-precision runs are float16 commands at NNC's
float16 tolerances.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

from fnnc import ops
from tests.helpers import assert_close
from tests.ops.test_nnc_int_cudnn_2 import HALF, f16, f32, f64, run_backward, uniform

# -- pooling: 5x5 windows, stride 2, padding 1 on [7, 7, 10] -------------------------------


def _windows(shape, window, stride, pad):
    """(output index, input rows, input columns) of each window, clipped to the input."""
    n_out = [(n + 2 * pad - window) // stride + 1 for n in shape]
    for i, j in itertools.product(*map(range, n_out)):
        rows = range(max(i * stride - pad, 0), min(i * stride - pad + window, shape[0]))
        cols = range(max(j * stride - pad, 0), min(j * stride - pad + window, shape[1]))
        yield (i, j), slice(rows.start, rows.stop), slice(cols.start, cols.stop)


def _pool_oracle(x, kind, window=5, stride=2, pad=1):
    """HWC pooling: the max, or the mean over the cells inside the input (padding never
    counts, NNC's average)."""
    out = np.zeros(((x.shape[0] + 2 * pad - window) // stride + 1,) * 2 + x.shape[2:])
    for at, rows, cols in _windows(x.shape[:2], window, stride, pad):
        cells = x[rows, cols].reshape(-1, x.shape[-1])
        out[at] = cells.max(0) if kind == "max" else cells.mean(0)
    return out


def _pool_grad_oracle(x, g, kind, window=5, stride=2, pad=1):
    """The gradient of :func:`_pool_oracle`: to each window's maximum, or spread evenly."""
    dx = np.zeros(x.shape)
    for at, rows, cols in _windows(x.shape[:2], window, stride, pad):
        cells = x[rows, cols]
        if kind == "max":
            hit = cells == cells.max((0, 1))
            dx[rows, cols] += hit * g[at]
        else:
            dx[rows, cols] += g[at] / (cells.shape[0] * cells.shape[1])
    return dx


@pytest.mark.parametrize("dtype", [f32, f16])
@pytest.mark.parametrize("kind", ["avg", "max"])
def test_pool_5x5_stride_2_padding_1(kind, dtype) -> None:
    """NNC's "compare average pooling with cudnn", "compare max pooling with cudnn", their
    "gradient" cases and all four "in half precision"; the HWC [7, 7, 10] image gets a
    batch axis of 1."""
    cmd = (ops.avg_pool if kind == "avg" else ops.max_pool)(window=5, strides=2, padding=1)
    # Distinct multiples of 1/512, exact in float16: no window has two maxima (NNC's CPU
    # reference would send the gradient to each, fnnc's backward to the first).
    x = (np.random.default_rng(1).permutation(490) / 512).reshape(7, 7, 10).astype(f32)
    g = uniform((3, 3, 10), 2)
    xb = x[None].astype(dtype)
    y = cmd(xb)
    tol = 1e-6 if dtype == f32 else HALF
    assert_close(y[0], _pool_oracle(x.astype(f64), kind), rtol=tol, atol=tol)
    (dx,) = run_backward(cmd, (g[None].astype(dtype),), (xb,), (y,))
    assert_close(
        dx[0],
        _pool_grad_oracle(x.astype(f64), g.astype(dtype).astype(f64), kind),
        rtol=tol,
        atol=tol,
    )


@pytest.mark.parametrize("dtype", [f32, f16])
def test_max_pool_2x2_nchw(dtype) -> None:
    """NNC's "compare max pooling 2x2 with cudnn" (and "... in half precision"): a CHW [10, 6, 6]
    image, 2x2 windows, stride 2, no padding, through HWC and back."""
    x = uniform((10, 6, 6), 1).astype(dtype)
    hwc = ops.format_transform(src="NCHW", dst="NHWC")(x)
    y = ops.max_pool(window=2, strides=2)(hwc[None])[0]
    got = ops.format_transform(src="NHWC", dst="NCHW")(y)
    want = x.astype(f64).reshape(10, 3, 2, 3, 2).max((2, 4))
    np.testing.assert_array_equal(got, want)


# -- activations ----------------------------------------------------------------------------

ACTIVATIONS = {
    "relu": (lambda v: np.maximum(v, 0), lambda v, y: (v > 0).astype(f64)),
    "sigmoid": (lambda v: 1 / (1 + np.exp(-v)), lambda v, y: y * (1 - y)),
    "tanh": (np.tanh, lambda v, y: 1 - y * y),
}


@pytest.mark.parametrize("dtype", [f32, f16])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_forward_and_gradient(name, dtype) -> None:
    """NNC's "compare relu with cudnn" ([7, 7, 10] in [-1, 1)), "compare relu gradient with
    cudnn" (NCHW [10, 10, 7, 7]), "compare sigmoid / tanh with cudnn" ([20, 10]) and
    "... gradient ..." ([10, 100]), each also "in half precision"."""
    fwd, deriv = ACTIVATIONS[name]
    cmd = getattr(ops, name)()
    shapes = [(7, 7, 10), (10, 10, 7, 7)] if name == "relu" else [(20, 10), (10, 100)]
    tol = 1e-6 if dtype == f32 else HALF
    for seed, shape in enumerate(shapes):
        x = uniform(shape, seed, -1, 1).astype(dtype)
        g = uniform(shape, seed + 10).astype(dtype)
        y = cmd(x)
        want = fwd(x.astype(f64))
        assert y.dtype == dtype
        assert_close(y, want, rtol=tol, atol=tol)
        (dx,) = run_backward(cmd, (g,), (x,), (y,))
        assert_close(dx, g.astype(f64) * deriv(x.astype(f64), want), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [f32, f16])
def test_softmax_forward_and_gradient(dtype) -> None:
    """NNC's "compare softmax with cudnn" ([20, 10]) and "compare softmax gradient with cudnn"
    ([10, 100], dy one-hot on the diagonal), each also "in half precision"."""
    cmd = ops.softmax()
    tol = 1e-6 if dtype == f32 else 1e-3
    for shape in ((20, 10), (10, 100)):
        x = uniform(shape, 0).astype(dtype)
        e = np.exp(x.astype(f64) - x.astype(f64).max(1, keepdims=True))
        want = e / e.sum(1, keepdims=True)
        y = cmd(x)
        assert_close(y, want, rtol=tol, atol=tol)
    dy = np.zeros((10, 100), dtype)
    dy[np.arange(10), np.arange(10)] = 1
    (dx,) = run_backward(cmd, (dy,), (x,), (y,))
    want_dx = want * (dy - (dy * want).sum(1, keepdims=True))
    assert_close(dx, want_dx, rtol=tol, atol=tol * 0.1)


# -- dropout ---------------------------------------------------------------------------------


def _key(seed: int):
    return jax.random.key_data(jax.random.key(seed))


@pytest.mark.parametrize("dtype", [f32, f16])
def test_dropout_forward_and_gradient(dtype) -> None:
    """NNC's "compare dropout with cudnn" and "compare dropout gradient with cudnn" (and both "in
    half precision"): with p = 0.4, 40% +- 5% of 1000 entries are zero, the others are
    x / 0.6, and the gradient i + 1 flows as (i + 1) / 0.6 where kept."""
    x = ((np.arange(1000) + 1) * 0.01).astype(dtype)
    cmd = ops.dropout(p=0.4)
    y, mask = outs = cmd(x, _key(0))
    kept = np.asarray(y) != 0
    assert abs(1 - kept.mean() - 0.4) < 0.05
    np.testing.assert_array_equal(mask, kept)
    rtol = 1e-6 if dtype == f32 else 2e-3
    assert_close(np.asarray(y)[kept], x.astype(f64)[kept] / 0.6, rtol=rtol, atol=0)
    g = (np.arange(1000) + 1).astype(dtype)
    dx, _ = run_backward(cmd, (g, None), (x, _key(0)), outs)
    assert_close(dx, np.where(kept, g.astype(f64) / 0.6, 0), rtol=rtol, atol=0)


def test_dropout_entire_matrix() -> None:
    """NNC's "dropout entire matrix with 20% chance" and "dropout gradient entire matrix with 20%
    chance": DROPOUT(0.2, entirety) keeps [20, 50] whole (x / 0.8, gradient g / 0.8) or
    zeroes it whole; over 16 keys both happen."""
    x = ((np.arange(1000) + 1) * 0.01).astype(f32).reshape(20, 50)
    g = (np.arange(1000) + 1).astype(f32).reshape(20, 50)
    cmd = ops.dropout(p=0.2, entirety=True)
    seen = set()
    for seed in range(16):
        y, _ = outs = cmd(x, _key(seed))
        dx, _ = run_backward(cmd, (g, None), (x, _key(seed)), outs)
        keep = bool(np.asarray(y)[0, 0] != 0)
        seen.add(keep)
        assert_close(y, x / 0.8 if keep else np.zeros_like(x), rtol=1e-6, atol=0)
        assert_close(dx, g / 0.8 if keep else np.zeros_like(g), rtol=1e-6, atol=0)
    assert seen == {True, False}


# -- add, softmax cross-entropy, ewsum --------------------------------------------------------


@pytest.mark.parametrize("dtype", [f32, f16])
def test_add_with_scalars_and_broadcast(dtype) -> None:
    """NNC's "compare add with cudnn" and "compare add gradient with cudnn" (and "in half
    precision"): ADD(0.5, 0.2) of [10, 5, 5, 3] and [10, 5, 1, 3]."""
    a, b = uniform((10, 5, 5, 3), 0).astype(dtype), uniform((10, 5, 1, 3), 1).astype(dtype)
    g = uniform((10, 5, 5, 3), 2).astype(dtype)
    cmd = ops.add(p=0.5, q=0.2)
    c = cmd(a, b)
    tol = 1e-6 if dtype == f32 else 1e-3
    assert_close(c, 0.5 * a.astype(f64) + 0.2 * b.astype(f64), rtol=tol, atol=tol)
    da, db = run_backward(cmd, (g,), (a, b), (c,))
    assert_close(da, 0.5 * g.astype(f64), rtol=tol, atol=tol)
    assert_close(db, 0.2 * g.astype(f64).sum(2, keepdims=True), rtol=tol, atol=tol * 5)


LABELS = ((np.arange(10) + 1) * 9).astype(f32)  # the C tests' float class indices 9 .. 90


@pytest.mark.parametrize("dtype", [f32, f16])
@pytest.mark.parametrize("trims", [(0.0, 1.0), (0.1, 0.9)], ids=["plain", "label-smoothing"])
def test_softmax_crossentropy_forward_and_backward(trims, dtype) -> None:
    """NNC's "compare softmax cross entropy forward / backward", "... with label smoothing"
    (trim0 0.1, trim1 0.9) and "... in half precision": scores [10, 100] in [0, 1), float
    labels, output gradient i / 10. The loss is fnnc's ``logsumexp(x) - sum(t * x)``
    (NNC's kernels store ``sum(t * (max - x))``, without ``logsumexp(x) - max``), the
    gradient NNC's ``g * (softmax - t)``."""
    x = uniform((10, 100), 0).astype(dtype)
    trim0, trim1 = trims
    t = np.full((10, 100), trim0)
    t[np.arange(10), LABELS.astype(int)] = trim1
    x64 = x.astype(f64)
    m = x64.max(1, keepdims=True)
    lse = m + np.log(np.exp(x64 - m).sum(1, keepdims=True))
    p = np.exp(x64 - lse)
    cmd = ops.softmax_crossentropy(trim0=trim0, trim1=trim1)
    loss, soft = outs = cmd(x, LABELS.astype(dtype))
    tol = 1e-5 if dtype == f32 else 5e-3
    assert loss.shape == (10, 1) and loss.dtype == dtype
    assert_close(loss, lse - (t * x64).sum(1, keepdims=True), rtol=tol, atol=tol)
    assert_close(soft, p, rtol=tol, atol=tol * 0.1)
    g = (np.arange(10) * 0.1).astype(dtype)[:, None]
    dx, dlabel = run_backward(cmd, (g, None), (x, LABELS.astype(dtype)), outs)
    assert dlabel is None
    assert_close(dx, g.astype(f64) * (p - t), rtol=tol, atol=tol * 0.1)


@pytest.mark.parametrize(
    "dtype, values", [(f32, (1, 0.5, 0.25)), (f16, (1, 0.5, 0.25)), (np.int32, (2, 5, 8))]
)
def test_ewsum(dtype, values) -> None:
    """NNC's "compare ewsum with cudnn", "... in half precision" and "... in int32": three [100]
    tensors of constants summed exactly."""
    got = ops.ewsum()(*(np.full((100,), v, dtype) for v in values))
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, np.full((100,), sum(values), dtype))
