"""NNC's integration tests of data-movement, activation, loss and reduction commands,
ported (liuliu/ccv ``test/int/nnc/``: ``upsample``, ``pad``, ``gelu``, ``swish``,
``smooth_l1``, ``index``, ``transform`` and ``reduce`` ``.tests.c``), continuing
``test_nnc_int_misc.py`` (which has ``loss``, ``leaky_relu`` and ``random``).

The C tests run a GPU (or Metal) kernel and compare it with NNC's CPU reference
(``lib/nnc/cmd/**/*_cpu_ref.c``); here fnnc's command runs (eagerly, or in an
interpreted / compiled graph) on the same shapes and hyper-parameters and is checked
against the CPU kernel's formula written as float64 NumPy beside each test, at NNC's
tolerance where the C test runs in half precision. ``dsfmt_genrand_open_close`` draws
become NumPy draws in (0, 1]. fnnc's upsample takes NHWC (or HWC) only, so NNC's NCHW
cases go through ``format_transform``, as NNC's own NCHW tests of the float chessbox
image do; the chessbox PNG itself is replaced by a small random image.

Cases ported elsewhere are left out: the unit-test values of pad 2d, upsample nearest /
align corners, index select (all views included), reduce on axis 0 / 1, reduce isnan
in float, datatype conversions to half and double to float, masked fill
(``test_nnc_op_cases*.py``, ``test_nnc_fidelity.py``, ``test_nnc_int_blas.py``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, compile, interpret
from tests.helpers import assert_close

f32, f16 = np.float32, np.float16
Spec = jax.ShapeDtypeStruct
TO_NCHW = ops.format_transform(src="NHWC", dst="NCHW")
TO_NHWC = ops.format_transform(src="NCHW", dst="NHWC")


def open_close(shape, seed: int = 0) -> np.ndarray:
    """float32 values in (0, 1], as the C tests' ``dsfmt_genrand_open_close``."""
    return (1.0 - np.random.default_rng(seed).random(shape)).astype(f32)


def run_backward(cmd, grads, inputs, outputs):
    return cmd.definition.backward(grads, inputs, outputs, **cmd.kwargs)


# -- upsample.tests.c (ccv_nnc_upsample_cpu_ref.c) ---------------------------------------------


def nnc_taps(n_small: int, n_big: int, mode: str, align: bool) -> np.ndarray:
    """The CPU kernel's resampling along one axis as a [n_big, n_small] matrix:
    ``big = M @ small`` is UPSAMPLE_FORWARD, ``small = M.T @ big`` UPSAMPLE_BACKWARD.
    ``r = a / b`` (or ``(a - 1) / max(1, b - 1)`` aligned) in float32, as in C."""
    if align:
        r = np.float32(n_small - 1) / np.float32(max(1, n_big - 1))
    else:
        r = np.float32(n_small) / np.float32(n_big)
    m = np.zeros((n_big, n_small))
    for i in range(n_big):
        if mode == "nearest":
            src = int(np.float32(i * r + 0.5)) if align else int(np.float32((i + 0.5) * r))
            m[i, min(src, n_small - 1)] = 1
        else:  # _ccv_nnc_init_bi_coeffs: C's (int) truncates, so -0.25 reads pixel 0 twice
            xs = np.float32(i * r) if align else np.float32((i + 0.5) * r - 0.5)
            s0, s1 = int(xs), min(int(xs + 1), n_small - 1)
            m[i, s0] += 1 - (xs - s0)
            m[i, s1] += xs - s0
    return m


def nnc_upsample(x, big_hw, mode, align=False):
    """UPSAMPLE_FORWARD of an HWC image to ``big_hw``."""
    my = nnc_taps(x.shape[0], big_hw[0], mode, align)
    mx = nnc_taps(x.shape[1], big_hw[1], mode, align)
    return np.einsum("Yh,hwc,Xw->YXc", my, x.astype(np.float64), mx)


def nnc_downsample(g, small_hw, mode, align=False):
    """UPSAMPLE_BACKWARD of an HWC gradient ``g`` onto a ``small_hw`` image."""
    my = nnc_taps(small_hw[0], g.shape[0], mode, align)
    mx = nnc_taps(small_hw[1], g.shape[1], mode, align)
    return np.einsum("Yh,YXc,Xw->hwc", my, g.astype(np.float64), mx)


def fnnc_downsample(g, small_shape, mode, align=False):
    """fnnc's UPSAMPLE_BACKWARD: the upsample command's backward of an x2 upsample."""
    cmd = ops.upsample(scale=(2, 2), mode=mode, align_corners=align)
    (got,) = run_backward(cmd, (jnp.asarray(g),), (Spec(small_shape, g.dtype),), (None,))
    return got


def up_nchw(cmd, x_chw):
    """NNC runs UPSAMPLE on an NCHW tensor directly; fnnc's upsample is NHWC, so the CHW
    tensor goes through format_transform around it."""
    return TO_NCHW(cmd(TO_NHWC(x_chw)))


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_upsample_bilinear_in_float(layout):
    """NNC: "upsample bilinear NHWC in float" / "upsample bilinear NCHW in float":
    CMD_UPSAMPLE_FORWARD(BILINEAR, 2, 2, 0) of a float RGB image [rows, cols, 3]; the
    NCHW case transforms to [3, rows, cols] and back, and both give the same image."""
    image = np.round(open_close((7, 6, 3), 1) * 255).astype(f32)
    want = nnc_upsample(image, (14, 12), "bilinear")
    up = ops.upsample(scale=(2, 2), mode="bilinear")
    got = up(image) if layout == "NHWC" else TO_NHWC(up_nchw(up, TO_NCHW(image)))
    assert got.shape == (14, 12, 3)
    assert_close(got, want, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_downsample_bilinear_in_float(layout):
    """NNC: "downsample bilinear NHWC in float" / "... NCHW in float":
    CMD_UPSAMPLE_BACKWARD(BILINEAR, 2, 2, 0) of an image onto half its size (the
    transpose of the bilinear upsample: each big pixel spreads over its taps)."""
    g = np.round(open_close((14, 12, 3), 2) * 255).astype(f32)
    want = nnc_downsample(g, (7, 6), "bilinear")
    if layout == "NHWC":
        got = fnnc_downsample(g, (7, 6, 3), "bilinear")
    else:
        g_chw = np.asarray(TO_NCHW(g))  # NNC's [3, 14, 12], through NHWC for fnnc
        down = fnnc_downsample(np.asarray(TO_NHWC(g_chw)), (7, 6, 3), "bilinear")
        got = TO_NHWC(TO_NCHW(down))
    assert_close(got, want, rtol=1e-6, atol=1e-3)


# NNC's shapes: NHWC [14, 14, 5] -> [7, 7, 5]; NCHW [15, 14, 6] (C = 15) -> [15, 7, 3].
DOWN_SHAPES = {"NHWC": ((14, 14, 5), (7, 7, 5)), "NCHW": ((15, 14, 6), (15, 7, 3))}


def _downsample_case(layout, mode, dtype, align=False):
    big, small = DOWN_SHAPES[layout]
    a = open_close(big, 0)
    if layout == "NHWC":
        want = nnc_downsample(a, small[:2], mode, align)
        got = fnnc_downsample(a.astype(dtype), small, mode, align)
    else:  # per channel plane: the CHW tensor as HWC is a.transpose(1, 2, 0)
        hwc = a.transpose(1, 2, 0)
        want = nnc_downsample(hwc, small[1:], mode, align).transpose(2, 0, 1)
        got = fnnc_downsample(hwc.astype(dtype), (*small[1:], small[0]), mode, align)
        got = jnp.transpose(got, (2, 0, 1))
    assert got.shape == small and got.dtype == dtype
    return got, want


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_downsample_in_half_precision(layout, mode):
    """NNC: "downsample bilinear NHWC / NCHW in half precision" and "downsample nearest
    NHWC / NCHW in half precision": UPSAMPLE_BACKWARD(2, 2) of a float16 copy of (0, 1]
    draws is within 1e-2 of the float32 CPU kernel on the unrounded draws."""
    got, want = _downsample_case(layout, mode, f16)
    assert_close(np.asarray(got, f32), want, rtol=0, atol=1e-2)


@pytest.mark.parametrize(
    "layout, align",
    [("NHWC", False), ("NCHW", False), ("NCHW", True)],
    ids=["NHWC", "NCHW", "NCHW-align-corners"],
)
def test_downsample_nearest_in_float(layout, align):
    """NNC: "downsample nearest NHWC in float", "... NCHW in float" and "... NCHW in
    float, align corners" (CMD_UPSAMPLE_BACKWARD(NEAREST, 2, 2, align)): each big pixel's
    gradient adds into the source pixel ``min((int)((i + 0.5) r), n - 1)``, aligned
    ``(int)(i r + 0.5)`` with r = (7 - 1) / (14 - 1)."""
    got, want = _downsample_case(layout, "nearest", f32, align)
    assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_upsample_nearest_in_float(layout):
    """NNC: "upsample nearest NHWC in float" ([15, 15, 5] -> [30, 30, 5]) and "...
    NCHW in float" ([15, 15, 5] as CHW -> [15, 30, 10]): each pixel becomes a 2x2
    block, exactly."""
    a = open_close((15, 15, 5), 0)
    up = ops.upsample(scale=(2, 2))
    if layout == "NHWC":
        got, want = up(a), np.repeat(np.repeat(a, 2, 0), 2, 1)
    else:
        got, want = up_nchw(up, a), np.repeat(np.repeat(a, 2, 1), 2, 2)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), want)


# -- pad.tests.c (ccv_nnc_pad_cpu_ref.c) -----------------------------------------------------------

PADS = {  # NNC's input shape, CMD_PAD_FORWARD begin and end
    "1d": ((6,), (2,), (1,)),
    "2d": ((2, 3), (2, 1), (1, 0)),
    "3d": ((1, 2, 3), (1, 1, 0), (1, 0, 1)),
    "4d": ((2, 2, 2, 1), (2, 1, 1, 0), (1, 1, 0, 1)),
}


@pytest.mark.parametrize("mode", ["zero", "replicate"])
@pytest.mark.parametrize("case", list(PADS))
def test_pad_forward(case, mode):
    """NNC: "implement pad zero 1d / 2d / 3d / 4d" and "implement pad replicate 1d / 2d
    / 3d / 4d": an iota 1, 2, ... padded by NNC's begin / end per axis (fnnc's
    ``(lo, hi)`` pairs), zeros or the edge value outside, exactly."""
    shape, begin, end = PADS[case]
    x = np.arange(1, np.prod(shape) + 1, dtype=f32).reshape(shape)
    pads = tuple(zip(begin, end))
    got = ops.pad(pads=pads, mode="constant" if mode == "zero" else "edge")(x)
    want = np.pad(x, pads, mode="constant" if mode == "zero" else "edge")
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("case", list(PADS))
def test_pad_zero_gradient(case):
    """NNC: "implement pad zero 1d / 2d / 3d / 4d gradient": CMD_PAD_BACKWARD(ZERO) of a
    (0, 1] gradient of the padded shape is its centre, the input-shaped slice at
    ``begin``, exactly."""
    shape, begin, end = PADS[case]
    big = tuple(n + lo + hi for n, lo, hi in zip(shape, begin, end))
    g = open_close(big, 0)
    cmd = ops.pad(pads=tuple(zip(begin, end)))
    (got,) = run_backward(cmd, (jnp.asarray(g),), (Spec(shape, f32),), (None,))
    want = g[tuple(slice(lo, lo + n) for lo, n in zip(begin, shape))]
    np.testing.assert_array_equal(np.asarray(got), want)


# -- gelu.tests.c and swish.tests.c (ccv_nnc_gelu_cpu_ref.c, ccv_nnc_swish_cpu_ref.c) -------


def _erf(x):
    return np.vectorize(math.erf)(x)


def nnc_gelu(x, fast):
    """CPU forward and derivative: erf form, or NNC's tanh form (``CMD_GELU_FORWARD(1)``)."""
    x = x.astype(np.float64)
    if fast:
        k, c = 0.797884560802865355, 0.044715
        t = np.tanh(k * (x + c * x**3))
        return 0.5 * x * (1 + t), 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x)
    phi = np.exp(-x * x / 2) / np.sqrt(2 * np.pi)
    cdf = 0.5 * (1 + _erf(x / np.sqrt(2)))
    return x * cdf, cdf + x * phi


def nnc_swish(x):
    """CPU forward and derivative: x sigmoid(x)."""
    x = x.astype(np.float64)
    s = 1 / (1 + np.exp(-x))
    return x * s, s * (1 + x * (1 - s))


ACTIVATIONS = {  # C case prefix -> (fnnc command, NNC's CPU forward and derivative)
    "gelu": (ops.gelu(), lambda x: nnc_gelu(x, False)),
    "fast gelu": (ops.gelu(approximate=True), lambda x: nnc_gelu(x, True)),
    "swish": (ops.swish(), nnc_swish),
}


@pytest.mark.parametrize("dtype", [f32, f16], ids=["in float", "in half precision"])
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_forward_in_a_compiled_graph(name, dtype):
    """NNC: "gelu in float / in half precision", "fast gelu in float / in half
    precision", "swish in float / in half precision": the command in a compiled graph
    on [20, 10] (NCHW) draws in (0, 1]; float32 equals the CPU kernel (1e-6), float16 of
    the draws is within NNC's 1e-3 of the float32 kernel on the unrounded draws."""
    cmd, ref = ACTIVATIONS[name]
    x = open_close((20, 10), 0)
    b = GraphBuilder()
    a = b.input((20, 10), dtype, name="a")
    y = b.exec(cmd, a, name=name)
    got = compile(b.build([y]))(x.astype(dtype))
    assert got.dtype == dtype
    want, _ = ref(x)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == f32 else dict(rtol=0, atol=1e-3)
    assert_close(np.asarray(got, f32), want, **tol)


@pytest.mark.parametrize("dtype", [f32, f16], ids=["in float", "in half precision"])
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_gradient_through_the_backward_pass(name, dtype):
    """NNC: "gelu gradient in float / in half precision", "fast gelu gradient ...",
    "swish gradient ...": the symbolic backward of y = f(x) on [10, 100] draws in
    (0, 1], seeded with dy = 1 at (i, i) for i < 10 and 0 elsewhere, compiled; y and
    dx equal the CPU forward and CMD_*_BACKWARD of (dy, x) (1e-6 in float, 1e-3 in
    half)."""
    cmd, ref = ACTIVATIONS[name]
    x = open_close((10, 100), 0)
    dy = np.zeros((10, 100), f32)
    dy[np.arange(10), np.arange(10)] = 1
    b = GraphBuilder()
    xs = b.input((10, 100), dtype, name="x")
    dys = b.input((10, 100), dtype, name="dy")
    ys = b.exec(cmd, xs, name=name)
    graph, _ = backward(b.build([ys]), ys, [xs], df=dys)
    y, dx = compile(graph)(x.astype(dtype), dy.astype(dtype))
    assert y.dtype == dtype and dx.dtype == dtype
    want_y, slope = ref(x)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == f32 else dict(rtol=0, atol=1e-3)
    assert_close(np.asarray(y, f32), want_y, **tol)
    assert_close(np.asarray(dx, f32), dy * slope, **tol)


# -- smooth_l1.tests.c (ccv_nnc_smooth_l1_cpu_ref.c) -------------------------------------------


def _smooth_l1_inputs():
    """The C tests' a = (0, 1] draws * 0.01 and b = 0 on [10, 100]: every sample's L1
    distance (about 0.5) is below beta = 1, so all take the quadratic branch."""
    return open_close((10, 100), 0) * f32(0.01), np.zeros((10, 100), f32)


def test_smooth_l1_loss_forward_and_backward():
    """NNC: "smooth l1 loss forward" and "smooth l1 loss backward" (CMD_SMOOTH_L1(1),
    g = 1 per sample): c = 0.5 sum (b - a)^2 / beta, h = g (a - b) / beta."""
    a, b = _smooth_l1_inputs()
    cmd = ops.smooth_l1(beta=1.0)
    c = cmd(a, b)
    a64 = a.astype(np.float64)
    assert c.shape == (10, 1)
    assert_close(c[:, 0], 0.5 * (a64**2).sum(-1), rtol=1e-5, atol=1e-9)
    ha, _ = run_backward(cmd, (jnp.ones((10, 1), f32),), (jnp.asarray(a), jnp.asarray(b)), (c,))
    assert_close(ha, a64, rtol=1e-6, atol=1e-9)


def test_smooth_l1_loss_backward_no_input_gradient():
    """NNC: "smooth l1 loss backward no input gradient" (``TENSOR_LIST(0, a, b, c)``: the
    kernel takes g = 1 per sample); in fnnc the backward pass's default seed on the
    summed loss, in a compiled graph: h = (a - b) / beta."""
    a, b = _smooth_l1_inputs()
    g = GraphBuilder()
    xs, ys = g.input(a.shape, name="a"), g.input(b.shape, name="b")
    loss = g.exec(ops.smooth_l1(beta=1.0), xs, ys)
    total = g.exec(ops.reduce_sum(axes=(0, 1)), loss)
    graph, _ = backward(g.build([total]), total, [xs])
    _, got = compile(graph)(a, b)
    assert_close(got, a.astype(np.float64), rtol=1e-6, atol=1e-9)


# -- index.tests.c (ccv_nnc_index_select_cpu_ref.c) --------------------------------------------

ROWS_9 = (np.arange(10) * 9 + 1).astype(np.int32)  # the C tests' indices i * 9 + 1


def test_index_select_forward_with_half_precision():
    """NNC: "index select forward with half precision": rows i * 9 + 1 of a float16
    [100, 10] table of (0, 1] draws, bit-exact float16 rows."""
    table = open_close((100, 10), 0).astype(f16)
    got = ops.index_select()(table, ROWS_9)
    assert got.dtype == f16 and got.shape == (10, 10)
    np.testing.assert_array_equal(np.asarray(got), table[ROWS_9])


def test_index_select_backward_with_half_precision():
    """NNC: "index select backward with half precision": CMD_INDEX_SELECT_BACKWARD of a
    float16 [10, 10] gradient with rows i * 9 + 1 is a float16 [100, 10] gradient with
    those rows set (no index repeats) and zeros elsewhere."""
    g = open_close((10, 10), 0).astype(f16)
    cmd = ops.index_select()
    gx, gi = run_backward(cmd, (jnp.asarray(g),), (Spec((100, 10), f16), ROWS_9), (None,))
    want = np.zeros((100, 10), f16)
    want[ROWS_9] = g
    assert gx.dtype == f16 and gi is None
    np.testing.assert_array_equal(np.asarray(gx), want)


# -- transform.tests.c -------------------------------------------------------------------------


def test_data_conversion_from_float_to_double():
    """NNC: "data conversion from float to double": 128 (0, 1] floats converted to
    double are the same values. fnnc's float64 needs JAX's x64 (its docs: float64
    becomes float32 unless x64 is on), so the conversion runs under ``enable_x64``."""
    x = open_close((1, 128), 0)
    with jax.enable_x64(True):
        got = ops.datatype_conversion(dtype="float64")(x)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(np.asarray(got), x.astype(np.float64))


COPY = ops.format_transform(src="NCHW", dst="NCHW")  # NNC's CMD_FORMAT_TRANSFORM_FORWARD()


def test_format_transform_from_a_tensor_view():
    """NNC: "format transform from for mps": the view [2, 3, 4] at (1, 0, 1) of an iota
    [3, 4, 5] (strides 20, 5, 1) copied into a [2, 3, 4] tensor is a[1:3, 0:3, 1:5]."""
    iota = np.arange(60, dtype=f32).reshape(3, 4, 5)
    b = GraphBuilder()
    a = b.input((3, 4, 5), name="a")
    y = b.exec(COPY, b.alias(a, (2, 3, 4), offset=(1, 0, 1)))
    got = interpret(b.build([y]), iota)
    np.testing.assert_array_equal(np.asarray(got), iota[1:3, 0:3, 1:5])


def test_format_transform_to_fill_tensor_views():
    """NNC: "format transform to fill for mps": c [1, 3, 4] copied into the view at
    (0, 0, 0) of b [2, 3, 4], a0 and a1 [1, 3, 2] into the views at (1, 0, 0) and
    (1, 0, 2); the three views fill b."""
    a0 = np.arange(6, dtype=f32).reshape(1, 3, 2)
    a1 = a0 - 5
    c = np.arange(12, dtype=f32).reshape(1, 3, 4) + 2
    b = GraphBuilder()
    s0, s1, sc = b.input((1, 3, 2)), b.input((1, 3, 2)), b.input((1, 3, 4))
    out = b.tensor((2, 3, 4), name="b")
    b.exec(COPY, sc, outputs=[b.alias(out, (1, 3, 4), offset=(0, 0, 0))])
    b.exec(COPY, s0, outputs=[b.alias(out, (1, 3, 2), offset=(1, 0, 0))])
    b.exec(COPY, s1, outputs=[b.alias(out, (1, 3, 2), offset=(1, 0, 2))])
    got = np.asarray(compile(b.build([out]))(a0, a1, c))
    want = np.concatenate([c, np.concatenate([a0, a1], axis=2)], axis=0)
    np.testing.assert_array_equal(got, want)


def test_format_transform_to_new_strides():
    """NNC: "format transform to new strides for mps": an iota [1, 10, 9, 3] copied into
    the view [1, 10, 9, 3] with strides (270, 9, 1, 90) of b [1, 3, 10, 9] writes
    b = a.transpose(0, 3, 1, 2)."""
    iota = np.arange(270, dtype=f32).reshape(1, 10, 9, 3)
    b = GraphBuilder()
    a = b.input((1, 10, 9, 3), name="a")
    out = b.tensor((1, 3, 10, 9), name="b")
    b.exec(COPY, a, outputs=[b.alias(out, (1, 10, 9, 3), stride=(270, 9, 1, 90))])
    got = interpret(b.build([out]), iota)
    np.testing.assert_array_equal(np.asarray(got), iota.transpose(0, 3, 1, 2))


# -- reduce.tests.c ----------------------------------------------------------------------------

A23 = np.array([[1, 2, 3], [4, 5, 6]], f32)
G3 = np.array([[1, 2, 3]], f32)  # the C tests' g = [1, 2, 3] of an axis-0 reduction


@pytest.mark.parametrize("name", ["reduce_sum", "reduce_mean", "reduce_norm2"])
def test_reduce_forward_noop(name):
    """NNC: "reduce sum forward noop", "reduce mean forward noop", "reduce norm2 forward
    noop": CMD_REDUCE_*(1) of [6, 1] (axis 1 has size 1) is the input itself."""
    x = np.arange(1, 7, dtype=f32).reshape(6, 1)
    got = getattr(ops, name)(axes=(1,))(x)
    assert got.shape == (6, 1)
    assert_close(got, x, rtol=1e-6, atol=0)


@pytest.mark.parametrize("name, scale", [("reduce_sum", 1.0), ("reduce_mean", 0.5)])
def test_reduce_sum_and_mean_backward(name, scale):
    """NNC: "reduce sum backward" and "reduce mean backward": CMD_REDUCE_*_BACKWARD(0)
    of g = [1, 2, 3] onto [2, 3] repeats g down the axis (divided by 2 for mean)."""
    cmd = getattr(ops, name)(axes=(0,))
    (h,) = run_backward(cmd, (jnp.asarray(G3),), (Spec((2, 3), f32),), (None,))
    np.testing.assert_array_equal(np.asarray(h), np.repeat(G3, 2, 0) * f32(scale))


def test_reduce_norm2_backward():
    """NNC: "reduce norm2 backward": CMD_REDUCE_NORM2_BACKWARD(0) of g = [1, 2, 3] with
    a = [[1, 2, 3], [4, 5, 6]] and b = its norms: h = g a / b."""
    cmd = ops.reduce_norm2(axes=(0,))
    b = cmd(A23)
    (h,) = run_backward(cmd, (jnp.asarray(G3),), (jnp.asarray(A23),), (b,))
    norm = np.sqrt((A23.astype(np.float64) ** 2).sum(0, keepdims=True))
    assert_close(h, G3 * A23 / norm, rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", ["argmin", "argmax"])
def test_argmin_and_argmax_with_float(name):
    """NNC: "argmin with float" and "argmax with float": CMD_ARG*_FORWARD(1) of
    [10, 3, 5, 3] (0, 1] draws gives int32 [10, 1, 5, 3] positions along axis 1."""
    x = open_close((10, 3, 5, 3), 0)
    got = getattr(ops, name)(axis=1)(x)
    assert got.dtype == np.int32 and got.shape == (10, 1, 5, 3)
    np.testing.assert_array_equal(np.asarray(got), getattr(np, name)(x, axis=1)[:, None])


def test_reduce_isnan_in_half_precision():
    """NNC: "reduce isnan in half precision" (and "reduce isnan float" on axis 0): a
    float16 [2, 3] with NaN at (0, 0); NNC's [1] output reduces everything to 1
    (the kernel reduces onto the output's shape), fnnc's axes (0, 1); axis 0 gives
    [1, 0, 0]; int32."""
    x = A23.copy()
    x[0, 0] = np.nan
    x16 = x.astype(f16)
    everything = ops.reduce_isnan(axes=(0, 1))(x16)
    assert everything.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(everything), [[1]])
    np.testing.assert_array_equal(np.asarray(ops.reduce_isnan(axes=(0,))(x16)), [[1, 0, 0]])
