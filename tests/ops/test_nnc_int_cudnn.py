"""NNC's cuDNN integration tests (liuliu/ccv ``test/int/nnc/cudnn.tests.c``) ported to fnnc:
the convolution family, set, format transform and broadcasting backwards. The norms
(and the Pallas kernels on NNC's norm and cross-entropy configurations) are in
``test_nnc_int_cudnn_2.py``; pooling, activations, dropout, softmax, add, the
cross-entropy and ewsum in ``test_nnc_int_cudnn_3.py``.

Each C test runs a command on cuDNN and on NNC's CPU reference and compares the two;
here fnnc's command runs on the CPU and is compared with an independent oracle: NumPy
loops in float64 over kernel cells (a strided slice per cell for the convolution, the
adjoint scatter for its input gradient and the transposed convolution). Gradients come
from each command's backward in NNC's convention. Shapes are the C test's, smaller where
its tensors are large (batch 64 of 224x224 images becomes batch 2 of 12x12, 96 filters
become 8), keeping what decides the geometry: a 7x7 kernel, stride 2, and the padding
NNC's ``ccv_nnc_hint_auto`` derives from the input and output sizes (see
:func:`hint_auto`), uneven with the extra cell in front. Values are uniform in [0, 1)
like NNC's ``dsfmt_genrand_open_close``.

NNC's NCHW tensors go through ``format_transform`` (fnnc's spatial commands are NHWC),
and its half-precision runs are float16 commands checked at float16 tolerance against
the float64 oracle.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.io.palettize import depalettize, palettize
from fnnc.ops import conv_cpu
from tests.helpers import assert_close

f16, f32, f64 = np.float16, np.float32, np.float64
TOL = {f32: 1e-5, f16: 5e-3}
"""NNC's own tolerances: 1e-5 against the float32 reference, 5e-3 for half precision."""


def uniform(shape, seed: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).uniform(0, 1, shape) * scale).astype(f32)


def hint_auto(size: int, out: int, window: int) -> tuple[int, tuple[int, int]]:
    """NNC's automatic hint for one spatial axis: the stride rounds ``size / out``, and
    the border that makes ``out`` windows fit is split with the odd cell at the start."""
    stride = (size + out // 2) // out
    border = (out - 1) * stride - size + window
    return stride, ((border + 1) // 2, border - (border + 1) // 2)


# -- oracles -----------------------------------------------------------------------------


def _cells(w, strides, dilation, out):
    """Per kernel cell (i, j): its weight [out, in] and the slices of the padded input
    it reads for ``out`` output rows and columns."""
    _, kh, kw, _ = w.shape
    (sh, sw), (dh, dw), (oh, ow) = strides, dilation, out
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + (oh - 1) * sh + 1, sh)
            cols = slice(j * dw, j * dw + (ow - 1) * sw + 1, sw)
            yield w[:, i, j, :], (slice(None), rows, cols)


def conv_oracle(x, w, strides, pads, dilation):
    """NHWC convolution with weight [out, kh, kw, in] as a sum over kernel cells of
    strided slices of the padded input."""
    padded = np.pad(x, ((0, 0), *pads, (0, 0)))
    _, kh, kw, _ = w.shape
    out = [
        (n - (k - 1) * d - 1) // s + 1
        for n, k, d, s in zip(padded.shape[1:3], (kh, kw), dilation, strides)
    ]
    return sum(
        np.einsum("nhwc,oc->nhwo", padded[at], wij) for wij, at in _cells(w, strides, dilation, out)
    )


def scatter_oracle(y, w, strides, dilation, size):
    """The adjoint of :func:`conv_oracle` before cropping: each output cell scatters
    ``y @ w[:, i, j]`` to the ``size`` (padded) input cells its kernel covers."""
    full = np.zeros((y.shape[0], *size, w.shape[-1]))
    for wij, at in _cells(w, strides, dilation, y.shape[1:3]):
        full[at] += np.einsum("nhwo,oc->nhwc", y, wij)
    return full


def conv_backward_oracle(x, w, g, strides, pads, dilation):
    """(dx, dw, dbias) of :func:`conv_oracle` plus a bias, for output gradient ``g``."""
    padded = np.pad(x, ((0, 0), *pads, (0, 0)))
    dx = scatter_oracle(g, w, strides, dilation, padded.shape[1:3])
    (t, _), (le, _) = pads
    dx = dx[:, t : t + x.shape[1], le : le + x.shape[2]]
    dw = np.zeros(w.shape)
    cells = _cells(w, strides, dilation, g.shape[1:3])
    for (i, j), (_, at) in zip(np.ndindex(*w.shape[1:3]), cells):
        dw[:, i, j, :] = np.einsum("nhwc,nhwo->oc", padded[at], g)
    return dx, dw, g.sum((0, 1, 2))


def conv_transpose_oracle(x, w, strides, pads):
    """Transposed convolution: the scatter, then the padding cropped."""
    (sh, sw), ((t, bo), (le, r)) = strides, pads
    _, kh, kw, _ = w.shape
    size = ((x.shape[1] - 1) * sh + kh, (x.shape[2] - 1) * sw + kw)
    full = scatter_oracle(x, w, strides, (1, 1), size)
    return full[:, t : size[0] - bo, le : size[1] - r]


# -- convolution: 7x7, stride 2, NNC's automatic padding -----------------------------------

SIZE, OUT, K, C_IN, C_OUT = 12, 6, 7, 3, 8
STRIDE, PAD = hint_auto(SIZE, OUT, K)


def conv_inputs(seed: int = 0):
    """The C test's inlets: weights scaled by 1 / (in * kh * kw), bias i / out."""
    x = uniform((2, SIZE, SIZE, C_IN), seed)
    w = uniform((C_OUT, K, K, C_IN), seed + 1, 1 / (C_IN * K * K))
    bias = (np.arange(C_OUT) / C_OUT).astype(f32)
    return x, w, bias


def test_hint_auto_gives_front_heavy_padding() -> None:
    """224 -> 112 with a 7x7 kernel, NNC's sizes: stride 2, border 5 split (3, 2)."""
    assert hint_auto(224, 112, 7) == (2, (3, 2))
    assert (STRIDE, PAD) == (2, (3, 2))


def _nchw(t):
    return np.transpose(t, (0, 3, 1, 2))


@pytest.mark.parametrize("layout, dtype", [("NHWC", f32), ("NCHW", f32), ("NHWC", f16)])
def test_convolution_forward(layout, dtype) -> None:
    """NNC's "cudnn forward convolution", "... in nchw format" and "... in half precision"."""
    x, w, bias = conv_inputs()
    cmd = ops.convolution(strides=STRIDE, padding=(PAD, PAD))
    want = conv_oracle(x.astype(f64), w.astype(f64), (STRIDE,) * 2, (PAD, PAD), (1, 1)) + bias
    if layout == "NCHW":
        to_nhwc = ops.format_transform(src="NCHW", dst="NHWC")
        y = cmd(to_nhwc(_nchw(x)), to_nhwc(_nchw(w)), bias)
        got = ops.format_transform(src="NHWC", dst="NCHW")(y)
        want = _nchw(want)
    else:
        got = cmd(x.astype(dtype), w.astype(dtype), bias.astype(dtype))
    assert got.dtype == dtype
    assert_close(got, want, rtol=TOL[dtype], atol=TOL[dtype])


def test_convolution_forward_with_palettized_weights() -> None:
    """NNC's "cudnn forward convolution in half precision with palettize weights": the NCHW
    float16 weight palettized with 6-bit indices in blocks of 1280, decoded, then used."""
    x, w, bias = conv_inputs()
    w16 = _nchw(w).astype(f16)  # NNC palettizes the [out, in, kh, kw] weight
    blob = palettize(w16.ravel(), bits=6, block_size=1280)
    decoded = depalettize(blob, np.dtype(f16), w16.size, 6, 1280).reshape(w16.shape)
    w_nhwc = ops.format_transform(src="NCHW", dst="NHWC")(decoded)
    cmd = ops.convolution(strides=STRIDE, padding=(PAD, PAD))
    got = cmd(x.astype(f16), w_nhwc, bias.astype(f16))
    want = conv_oracle(x.astype(f64), w.astype(f64), (STRIDE,) * 2, (PAD, PAD), (1, 1)) + bias
    assert_close(got, want, rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("layout, dtype", [("NHWC", f32), ("NCHW", f32), ("NHWC", f16)])
def test_convolution_backward(layout, dtype) -> None:
    """NNC's "cudnn backward convolution", "... in nchw format" and "... in half precision": the
    gradients of input, weight and bias."""
    x, w, bias = conv_inputs()
    g = uniform((2, OUT, OUT, C_OUT), 7)
    want = conv_backward_oracle(
        x.astype(f64), w.astype(f64), g.astype(f64), (STRIDE,) * 2, (PAD, PAD), (1, 1)
    )
    cmd = ops.convolution(strides=STRIDE, padding=(PAD, PAD))
    if layout == "NCHW":
        # NCHW tensors through format_transform, each step differentiated by its backward.
        to_nhwc = ops.format_transform(src="NCHW", dst="NHWC")
        to_nchw = ops.format_transform(src="NHWC", dst="NCHW")
        xc, wc = _nchw(x), _nchw(w)
        xh, wh = to_nhwc(xc), to_nhwc(wc)
        y = cmd(xh, wh, bias)
        (gy,) = to_nchw.definition.backward((_nchw(g),), (y,), (to_nchw(y),), **to_nchw.kwargs)
        gxh, gwh, gb = cmd.definition.backward((gy,), (xh, wh, bias), (y,), **cmd.kwargs)
        (gx,) = to_nhwc.definition.backward((gxh,), (xc,), (xh,), **to_nhwc.kwargs)
        (gw,) = to_nhwc.definition.backward((gwh,), (wc,), (wh,), **to_nhwc.kwargs)
        got = (to_nhwc(gx), to_nhwc(gw), gb)
    else:
        args = [a.astype(dtype) for a in (x, w, bias)]
        got = cmd.definition.backward((g.astype(dtype),), args, (cmd(*args),), **cmd.kwargs)
    tol = 1e-5 if dtype == f32 else 1e-2
    for name, a, b in zip(("x", "w", "bias"), got, want):
        assert a.dtype == dtype
        assert_close(a, b, rtol=tol, atol=tol * max(1.0, np.abs(b).max()), what=name)


# -- dilation (2, 3): the kernel NNC hints with is the dilated one --------------------------

D_SIZE, D_OUT, DILATION = 16, 8, (2, 3)
D_STRIDE_H, D_PAD_H = hint_auto(D_SIZE, D_OUT, (K - 1) * DILATION[0] + 1)
D_STRIDE_W, D_PAD_W = hint_auto(D_SIZE, D_OUT, (K - 1) * DILATION[1] + 1)
D_GEOMETRY = dict(strides=(D_STRIDE_H, D_STRIDE_W), padding=(D_PAD_H, D_PAD_W), dilation=DILATION)
BACKENDS = ("dispatch", "mixed", "dilated", "chunked", "im2col")


def _dilated_case():
    x = uniform((2, D_SIZE, D_SIZE, C_IN), 0)
    w = uniform((C_OUT, K, K, C_IN), 1, 1 / (C_IN * K * K))
    bias = (np.arange(C_OUT) / C_OUT).astype(f32)
    g = uniform((2, D_OUT, D_OUT, C_OUT), 2) * 2 - 1
    return x, w, bias, g


def test_dilated_geometry_is_nnc_s() -> None:
    """Padding larger than the undilated kernel: (6, 5) rows and (9, 8) columns."""
    assert D_GEOMETRY["padding"] == ((6, 5), (9, 8)) and D_GEOMETRY["strides"] == (2, 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_convolution_dilation_2_3_forward_and_backward(backend, monkeypatch) -> None:
    """NNC's "cudnn forward convolution with dilation 2, 3" and "cudnn backward convolution with
    dilation 2, 3", through the command's dispatch and each CPU backend forced (one chunk
    per sample, so ``chunked`` really splits the batch)."""
    monkeypatch.setattr(conv_cpu.forms, "CHUNK", 1)
    x, w, bias, g = _dilated_case()
    cmd = ops.convolution(**D_GEOMETRY)
    strides, pads = D_GEOMETRY["strides"], D_GEOMETRY["padding"]
    want_y = conv_oracle(x.astype(f64), w.astype(f64), strides, pads, DILATION) + bias
    want_g = conv_backward_oracle(
        x.astype(f64), w.astype(f64), g.astype(f64), strides, pads, DILATION
    )
    if backend == "dispatch":
        y = cmd(x, w, bias)
        grads = cmd.definition.backward((g,), (x, w, bias), (y,), **cmd.kwargs)
    else:
        y = conv_cpu.BY_NAME[backend].forward(x, w, bias, **cmd.kwargs)
        grads = conv_cpu.backward_of(backend)((g,), (x, w, bias), (None,), (0, 1, 2), **cmd.kwargs)
    assert_close(y, want_y, rtol=1e-5, atol=1e-5, what="y")
    for name, a, b in zip(("x", "w", "bias"), grads, want_g):
        assert_close(a, b, rtol=1e-5, atol=1e-5, what=name)


# -- convolution transpose -----------------------------------------------------------------


@pytest.mark.parametrize("layout, dtype", [("NHWC", f32), ("NCHW", f32), ("NHWC", f16)])
def test_convolution_transpose_forward(layout, dtype) -> None:
    """NNC's "cudnn forward convolution transpose", "... in nchw format" and "... in half
    precision": weight [8, 7, 7, 3] takes [2, 6, 6, 8] to [2, 12, 12, 3], with the hint NNC
    derives from the output and input sizes (stride 2, padding (3, 2))."""
    stride, pad = hint_auto(SIZE, OUT, K)
    x = uniform((2, OUT, OUT, C_OUT), 0)
    w = uniform((C_OUT, K, K, C_IN), 1, 1 / (C_IN * K * K))
    bias = (np.arange(C_IN) / C_IN).astype(f32)
    cmd = ops.convolution_transpose(strides=stride, padding=(pad, pad))
    want = conv_transpose_oracle(x.astype(f64), w.astype(f64), (stride,) * 2, (pad, pad)) + bias
    if layout == "NCHW":
        to_nhwc = ops.format_transform(src="NCHW", dst="NHWC")
        y = cmd(to_nhwc(_nchw(x)), to_nhwc(_nchw(w)), bias)
        got, want = ops.format_transform(src="NHWC", dst="NCHW")(y), _nchw(want)
    else:
        got = cmd(*(a.astype(dtype) for a in (x, w, bias)))
    assert (
        got.shape == want.shape == ((2, 3, SIZE, SIZE) if layout == "NCHW" else (2, SIZE, SIZE, 3))
    )
    tol = 2e-4 if dtype == f32 else 5e-3  # NNC's tolerances for this case
    assert_close(got, want, rtol=tol, atol=tol)


# -- format transform and set in double precision and integers ----------------------------


def test_format_transform_in_double_precision() -> None:
    """NNC's "compare format transform with cudnn in double precision": NHWC [11, 10, 9, 8] to
    NCHW [11, 8, 10, 9], exact."""
    a = np.random.default_rng(0).uniform(0, 1, (11, 10, 9, 8))
    with jax.enable_x64(True):
        b = ops.format_transform(src="NHWC", dst="NCHW")(a)
        assert b.dtype == f64
        np.testing.assert_array_equal(b, np.transpose(a, (0, 3, 1, 2)))


def test_set_in_double_precision_and_integer() -> None:
    """NNC's "compare set with cudnn in double precision" and "... in integer": 10 everywhere."""
    with jax.enable_x64(True):
        d = ops.set(shape=(11, 10, 9, 8), dtype="float64", value=10)()
        assert d.dtype == f64
        np.testing.assert_array_equal(d, np.full((11, 10, 9, 8), 10.0))
    i = ops.set(shape=(1,), dtype="int32", value=10)()
    assert i.dtype == np.int32
    np.testing.assert_array_equal(i, [10])


# -- broadcasting backwards and scalar mul ---------------------------------------------------

COL = np.array([[1], [2], [3], [4]], f32)
PAIR = np.array([5, 6], f32)
G = np.array([[6, 7], [7, 8], [8, 9], [9, 10]], f32)  # the C tests' c, used as the gradient


def test_add_backward_broadcast() -> None:
    """NNC's "broadcasting semantics for add backward": ADD(0.5, 0.2) of [4, 1] and [2]; each
    gradient is p (or q) times the output gradient summed over the broadcast axis."""
    cmd = ops.add(p=0.5, q=0.2)
    da, db = cmd.definition.backward((G,), (COL, PAIR), (cmd(COL, PAIR),), **cmd.kwargs)
    assert_close(da, 0.5 * G.sum(1, keepdims=True))
    assert_close(db, 0.2 * G.sum(0))


def test_mul_backward_broadcast() -> None:
    """NNC's "broadcasting semantics for mul backward": MUL(0.5) of [4, 1] and [2]."""
    cmd = ops.mul(p=0.5)
    da, db = cmd.definition.backward((G,), (COL, PAIR), (cmd(COL, PAIR),), **cmd.kwargs)
    assert_close(da, 0.5 * (G * PAIR).sum(1, keepdims=True))
    assert_close(db, 0.5 * (G * COL).sum(0))


@pytest.mark.parametrize(
    "a, b",
    [
        (COL, PAIR),
        (np.array([[1, 2, 3], [4, 5, 6]], f32), np.array([7, 8, 9], f32)),
        (np.array([7, 8, 9], f32), np.array([[1, 2, 3], [4, 5, 6]], f32)),
    ],
    ids=["col-row", "for-b", "for-a"],
)
def test_mul_backward_without_output_gradient(a, b) -> None:
    """NNC's "broadcasting semantics for mul backward (no input grad)", "... for b" and "... for
    a": NNC's missing output gradient stands for ones, which fnnc passes explicitly."""
    cmd = ops.mul(p=0.5)
    ones = np.ones(np.broadcast_shapes(a.shape, b.shape), f32)
    da, db = cmd.definition.backward((ones,), (a, b), (cmd(a, b),), **cmd.kwargs)
    assert_close(da, _sum_to(0.5 * np.broadcast_to(b, ones.shape), a.shape))
    assert_close(db, _sum_to(0.5 * np.broadcast_to(a, ones.shape), b.shape))


def _sum_to(v, shape):
    """``v`` summed over the axes broadcasting added or stretched to reach it from ``shape``."""
    v = v.sum(tuple(range(v.ndim - len(shape))))
    return v.sum(tuple(i for i, n in enumerate(shape) if n == 1), keepdims=True)


def test_scalar_mul() -> None:
    """NNC's "scalar mul [[1, 2, 3], [4, 5, 6]] * 0.3"."""
    x = np.array([[1, 2, 3], [4, 5, 6]], f32)
    assert_close(ops.scalar_mul(a=0.3)(x), x.astype(f64) * 0.3, rtol=1e-6, atol=1e-6)
