"""NNC's op tests (liuliu/ccv ``test/unit/nnc/*.tests.c``), the cases of ``roi_align``,
``nms``, ``upsample``, ``rotate_half``, ``signed_sqrt``, ``complex``, ``gemm`` and
``grid_sample.tests.c`` that no other fnnc test ports (``sort``, ``argsort``,
``partition``, ``unique_consecutive``, ``scatter_add``, ``gelu``, ``swish``,
``winograd`` and ``cblas.tests.c`` are ported in full elsewhere). Each test names the C
test case it ports; the expected tensors are NNC's (hand-written there, or the closed form
the C test computes them from).

Translations: NNC's tensor views are alias symbols (``GraphBuilder.alias``), and what a
view leaves unwritten is zero, as the C tests' zeroed buffers are. NNC's ``*_BACKWARD``
command is fnnc's ``gradient`` command of the forward (``ops.gradient(of=...)``) or the
forward definition's ``backward`` rule. A cnnp model holding one command is a
``CommandLayer`` in a ``Model``; ``ccv_cnnp_model_copy`` is ``copy.deepcopy``. NNC's
values uniform in (0, 1] (``dsfmt_genrand_open_close``) come from NumPy's generator.
"""

from __future__ import annotations

import copy

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError
from fnnc.graph import GraphBuilder, backward, compile, interpret
from fnnc.models import CommandLayer, Input, Model
from tests.helpers import assert_close, rand

f32, i32 = np.float32, np.int32


# -- roi_align.tests.c --------------------------------------------------------------------------


def _ramp_image() -> np.ndarray:
    """NNC's a [12, 24, 3]: pixel i (row-major over 12 x 24) holds i in every channel."""
    return np.repeat(np.arange(12 * 24, dtype=f32)[:, None], 3, axis=1).reshape(12, 24, 3)


def test_compare_roi_align_forward_against_block_means() -> None:
    """NNC: "compare ROI align forward": the unit box (0, 0, 1, 1) over a [12, 24, 3] ramp
    pooled to 4 x 4 is, bin by bin, the mean of its 3 x 6 block of pixels ("no bi-linear
    filtering at all"), computed by the C test's own loops."""
    a = _ramp_image()
    got = np.asarray(ops.roi_align(size=(4, 4))(a, np.array([0, 0, 1, 1], f32)))
    want = np.zeros((4, 4, 3), f32)
    for i in range(4):
        for j in range(4):
            v = 0.0
            for y in range(3):
                for x in range(6):
                    v += a[i * 3 + y, j * 6 + x, 0]
            want[i, j, :] = v / (3 * 6)
    assert got.shape == (4, 4, 3)
    assert_close(got, want, rtol=1e-6, atol=0)


def test_compare_roi_align_backward_with_average_pool_batch_of_2() -> None:
    """NNC: "compare ROI align backward with average pool, batch of 2": two images, one
    unit box each ([2, 4]), output gradient [2, 4, 4, 3] holding the bin index i; each
    image's gradient is average pool 3 x 6's backward of it (each bin's value / 18 spread
    over its block), within NNC's 1e-5."""
    g1 = np.repeat(np.arange(16, dtype=f32)[:, None], 3, axis=1).reshape(4, 4, 3)
    g = np.stack([g1, g1])
    boxes = np.array([[0, 0, 1, 1], [0, 0, 1, 1]], f32)
    cmd = ops.roi_align(size=(4, 4))
    spec = jax.ShapeDtypeStruct((2, 12, 24, 3), f32)
    da, dboxes = cmd.definition.backward((g,), (spec, boxes), (None,), **cmd.kwargs)
    pooled_back = np.repeat(np.repeat(g1, 3, axis=0), 6, axis=1) / 18
    assert np.asarray(da).shape == (2, 12, 24, 3) and dboxes is None
    for k in range(2):
        assert_close(np.asarray(da)[k], pooled_back, rtol=0, atol=1e-5)


# -- nms.tests.c ------------------------------------------------------------------------------


def test_compare_non_maximal_suppression_forward_with_tensor_views() -> None:
    """NNC: "compare non-maximal suppression forward with tensor views": the boxes are the
    first 5 columns of a [10, 8] (row i = (i, i, 0, 1, 1), score i), the sorted boxes go
    into the first 5 columns of a zeroed [10, 6]; nothing overlaps at IoU 0.5, so all ten
    come out by descending score, column 5 stays 0 and the indices are 9 .. 0."""
    b = GraphBuilder()
    a = b.input((10, 8), name="a")
    out = b.tensor((10, 6), name="b")
    c = b.tensor((10,), i32, name="c")
    b.exec(
        ops.nms(iou_threshold=0.5),
        b.alias(a, (10, 5), stride=(8, 1)),
        outputs=[b.alias(out, (10, 5), stride=(6, 1)), c],
    )
    graph = b.build([out, c])
    av = np.zeros((10, 8), f32)
    for i in range(10):
        av[i, :5] = (i, i, 0, 1, 1)
    want = np.zeros((10, 6), f32)
    for i in range(10):
        want[i, :5] = (9 - i, 9 - i, 0, 1, 1)
    for got_b, got_c in (interpret(graph, av), compile(graph)(av)):
        np.testing.assert_array_equal(got_b, want)
        np.testing.assert_array_equal(got_c, np.arange(9, -1, -1))


# -- upsample.tests.c: the chessbox cases ----------------------------------------------------


def _chessbox(h: int = 8, w: int = 12) -> np.ndarray:
    """A stand-in for NNC's samples/chessbox.png (not shipped with fnnc): 2 x 2 squares
    of black and white, the three channels scaled differently, as float32 HWC."""
    board = ((np.arange(h)[:, None] // 2 + np.arange(w)[None, :] // 2) % 2) * 255.0
    return np.stack([board, board * 0.5, 255.0 - board], axis=-1).astype(f32)


def _nnc_bilinear_matrix(src: int, dst: int) -> np.ndarray:
    """NNC's ``_ccv_nnc_init_bi_coeffs`` without align corners as a [dst, src] matrix:
    xs = (i + 0.5) * (src / dst) - 0.5, taps (int)xs and min((int)(xs + 1), src - 1)."""
    s = np.float32(src) / np.float32(dst)
    m = np.zeros((dst, src), np.float64)
    for i in range(dst):
        xs = float(np.float32((i + 0.5) * s - 0.5))
        s0, s1 = int(xs), min(int(xs + 1), src - 1)  # C's (int) truncates toward zero
        m[i, s0] += 1 - (xs - s0)
        m[i, s1] += xs - s0
    return m


@pytest.mark.parametrize("nchw", [False, True], ids=["nhwc", "nchw"])
def test_upsample_and_downsample_chessbox(nchw) -> None:
    """NNC: "upsample chessbox", "downsample chessbox", "upsample chessbox in NCHW" and
    "downsample chessbox in NCHW": a batch-less HWC image, bilinear x2 without align
    corners (CMD_UPSAMPLE_FORWARD(BILINEAR, 2, 2, 0)), and the backward of that command
    read from the image (down to half size). NNC checks both against stored files
    (data/upsample.*.bin); here NNC's CPU kernel, written as the separable matrices
    My x Mxᵀ and its transpose, is the oracle, and the NCHW twins (through
    format_transform, as the C tests do) must agree with it too."""
    img = _chessbox()
    h, w, _ = img.shape
    my, mx = _nnc_bilinear_matrix(h, 2 * h), _nnc_bilinear_matrix(w, 2 * w)
    up_want = np.einsum("yh,hwc,xw->yxc", my, img.astype(np.float64), mx)
    dy, dx = _nnc_bilinear_matrix(h // 2, h), _nnc_bilinear_matrix(w // 2, w)
    down_want = np.einsum("hy,hwc,wx->yxc", dy, img.astype(np.float64), dx)
    up = ops.upsample(scale=(2, 2), mode="bilinear", align_corners=False)
    params = dict(scale=(2, 2), mode="bilinear", align_corners=False)

    def downsample(g):  # CMD_UPSAMPLE_BACKWARD read from g into the half-size tensor
        small = jax.ShapeDtypeStruct((h // 2, w // 2, 3), f32)
        return ops.upsample.definition.backward((g,), (small,), (None,), **params)[0]

    if nchw:  # NNC's CHW copy; fnnc's upsample is NHWC, so format_transform goes around it
        to_chw = ops.format_transform(src="NHWC", dst="NCHW")
        to_hwc = ops.format_transform(src="NCHW", dst="NHWC")
        chw = to_chw(img)
        got_up = to_hwc(to_chw(up(to_hwc(chw))))  # back to HWC, as NNC does for the file
        got_down = to_hwc(to_chw(downsample(to_hwc(chw))))
    else:
        got_up, got_down = up(img), downsample(img)
    assert np.asarray(got_up).shape == (2 * h, 2 * w, 3)
    assert np.asarray(got_down).shape == (h // 2, w // 2, 3)
    assert_close(got_up, up_want, rtol=1e-5, atol=1e-3)
    assert_close(got_down, down_want, rtol=1e-5, atol=1e-3)


# -- rotate_half.tests.c -----------------------------------------------------------------------


def test_rotate_half_of_a_tensor_view_through_aliases() -> None:
    """NNC: "rotate half of a tensor view": the [2, 4] view at column 1 of [[1 .. 6],
    [7 .. 12]] rotated into the same view of a zeroed [2, 6], as a graph of alias symbols:
    [[0, 4, 5, 2, 3, 0], [0, 10, 11, 8, 9, 0]]."""
    b = GraphBuilder()
    a = b.input((2, 6), name="a")
    out = b.tensor((2, 6), name="b")
    b.exec(
        ops.rotate_half(),
        b.alias(a, (2, 4), offset=(0, 1)),
        outputs=[b.alias(out, (2, 4), offset=(0, 1))],
    )
    graph = b.build([out])
    av = np.arange(1, 13, dtype=f32).reshape(2, 6)
    want = [[0, 4, 5, 2, 3, 0], [0, 10, 11, 8, 9, 0]]
    np.testing.assert_array_equal(interpret(graph, av), want)
    np.testing.assert_array_equal(compile(graph)(av), want)


def test_ccv_cnnp_rotate_half() -> None:
    """NNC: "ccv_cnnp rotate half": a model of one rotate_half layer on [2, 4] gives
    [[3, 4, 1, 2], [7, 8, 5, 6]]."""
    x = Input()
    model = Model([x], [CommandLayer(ops.rotate_half(), name="rotate_half")(x)])
    a = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], f32)
    model.compile([a])
    np.testing.assert_array_equal(model.evaluate([a]), [[3, 4, 1, 2], [7, 8, 5, 6]])


# -- signed_sqrt.tests.c -----------------------------------------------------------------------


def _signed_sqrt_gradient(floor: float, n: int = 0) -> object:
    """NNC's CMD_SIGNED_SQRT_BACKWARD(floor) on [n] tensors: fnnc's ``gradient`` of it
    (reads the output gradient and the forward input, its ``backward_uses``)."""
    spec = (((n,), np.dtype(f32)),)
    return ops.gradient(
        of=ops.signed_sqrt(floor=floor),
        in_specs=spec,
        out_specs=spec,
        grad_mask=(True,),
        wants=(0,),
    )


def test_signed_sqrt_backward_of_empty_tensors_is_a_no_op() -> None:
    """NNC: "signed sqrt validates floors and handles empty tensors", its valid half: the
    forward and the backward of [0] tensors at floor 1e-6 run and give [0] tensors."""
    grad = _signed_sqrt_gradient(1e-6)
    empty = np.zeros((0,), f32)
    assert np.asarray(ops.signed_sqrt(floor=1e-6)(empty)).shape == (0,)
    assert np.asarray(grad(empty, empty)).shape == (0,)


def test_signed_sqrt_backward_validates_floors() -> None:
    """NNC: "signed sqrt validates floors and handles empty tensors": "backward also
    validates the floor" for 0, -1, inf and NaN, on empty tensors."""
    empty = np.zeros((0,), f32)
    for floor in (0.0, -1.0, float("inf"), float("nan")):
        grad = _signed_sqrt_gradient(floor)
        with pytest.raises(CommandError, match="floor"):
            grad(empty, empty)


def test_signed_sqrt_model_copies_its_floor_and_retains_input_for_backward() -> None:
    """NNC: "signed sqrt model copies its floor and retains input for backward": a model of
    one signed_sqrt(0.25) layer, copied before compiling (the original freed), evaluated
    with requires_grad on [-4, -0.25, -0.125, -0, 0, 0.125, 0.25, 4], then backward with
    gradient 2: the copy keeps floor 0.25 (outputs +-0.5 below it) and the gradient is
    2 * 0.5 / sqrt(|x|) at and above the floor, 0 below it."""
    x = Input()
    original = Model([x], [CommandLayer(ops.signed_sqrt(floor=0.25), name="signed_root")(x)])
    model = copy.deepcopy(original)
    del original
    values = np.array([-4, -0.25, -0.125, -0.0, 0, 0.125, 0.25, 4], f32)
    model.compile([np.zeros((8,), f32)])
    b = model.evaluate([values], requires_grad=True)
    (h,) = model.backward([np.full((8,), 2, f32)])
    assert_close(b, np.array([-2, -0.5, -0.5, -0.5, 0.5, 0.5, 0.5, 2], f32), rtol=0, atol=1e-6)
    assert_close(h, np.array([0.5, 2, 0, 0, 0, 0, 2, 0.5], f32), rtol=0, atol=1e-6)


# -- complex.tests.c ---------------------------------------------------------------------------


def test_compare_cmul_gradient_with_gemm_computed_result_on_graphs() -> None:
    """NNC: "compare cmul gradient with gemm computed result" as NNC builds it: a symbolic
    graph z = cmul(x, y) of [10] (5 complex pairs) differentiated for x, against a graph
    z = gemm(x [5, 1, 2], Y [5, 2, 2]ᵀ) (NNC's TRANSPOSE(1, 2)) differentiated for x, where
    each Y is [[re, -im], [im, re]]; z and dx agree within NNC's 1e-5.

    NNC TEST_CASE covered here:
    "compare cmul with gemm computed result".
    """
    x, dz, y = (rand([10], lo=0.0, hi=1.0, seed=s) for s in (1, 2, 3))
    yg = np.zeros((5, 2, 2), f32)
    yg[:, 0, 0], yg[:, 0, 1] = y[0::2], -y[1::2]
    yg[:, 1, 0], yg[:, 1, 1] = y[1::2], y[0::2]

    b = GraphBuilder()
    xs, ys, dzs = b.input((10,), name="x"), b.input((10,), name="y"), b.input((10,), name="dz")
    z = b.exec(ops.cmul(), xs, ys)
    cmul_graph, _ = backward(b.build([z]), z, [xs], df=dzs)

    g = GraphBuilder()
    gx, gy = g.input((5, 1, 2), name="x"), g.input((5, 2, 2), name="y")
    gdz = g.input((5, 1, 2), name="dz")
    gz = g.exec(ops.gemm(transpose_b=True), gx, gy)
    gemm_graph, _ = backward(g.build([gz]), gz, [gx], df=gdz)

    z_cmul, dx_cmul = compile(cmul_graph)(x, y, dz)
    z_gemm, dx_gemm = compile(gemm_graph)(x.reshape(5, 1, 2), yg, dz.reshape(5, 1, 2))
    assert_close(np.asarray(z_cmul), np.asarray(z_gemm).reshape(10), rtol=0, atol=1e-5)
    assert_close(np.asarray(dx_cmul), np.asarray(dx_gemm).reshape(10), rtol=0, atol=1e-5)


def test_conjugating_cmul_computes_asymmetric_gradients() -> None:
    """NNC: "conjugating cmul computes asymmetric gradients": CMUL_BACKWARD with conjugate
    set, on 4 interleaved (re, im) pairs: dA = g * b, dB = a * conj(g) (the gradients of
    a * conj(b)); with no output gradient (NNC's null, the complex one (1, 0) per pair
    here) dA = b and dB = a."""
    g = np.array([1, 2, -3, 4, 0.5, -0.25, 10, -2], f32)
    a = np.array([5, 6, 7, -8, -2, 0.5, 0.25, 3], f32)
    b = np.array([-4, 3, 2, 9, 1.5, -2, 7, 0.125], f32)
    want_da, want_db = np.zeros(8, f32), np.zeros(8, f32)
    for i in range(0, 8, 2):
        want_da[i] = g[i] * b[i] - g[i + 1] * b[i + 1]
        want_da[i + 1] = g[i] * b[i + 1] + g[i + 1] * b[i]
        want_db[i] = a[i] * g[i] + a[i + 1] * g[i + 1]
        want_db[i + 1] = a[i + 1] * g[i] - a[i] * g[i + 1]
    cmd = ops.cmul(conjugate=True)
    da, db = cmd.definition.backward((g,), (a, b), (None,), **cmd.kwargs)
    assert_close(da, want_da, rtol=0, atol=1e-6)
    assert_close(db, want_db, rtol=0, atol=1e-6)
    unit = np.tile(np.array([1, 0], f32), 4)
    da, db = cmd.definition.backward((unit,), (a, b), (None,), **cmd.kwargs)
    assert_close(da, b, rtol=0, atol=1e-6)
    assert_close(db, a, rtol=0, atol=1e-6)
    # the forward: NumPy's complex a * conj(b)
    want = (a[0::2] + 1j * a[1::2]) * np.conj(b[0::2] + 1j * b[1::2])
    got = np.asarray(cmd(a, b))
    np.testing.assert_allclose(got[0::2] + 1j * got[1::2], want, rtol=1e-6, atol=1e-6)


# -- gemm.tests.c: the forward cases ----------------------------------------------------------

A = [[1, 2], [3, 4], [5, 6], [7, 8]]
A2 = [[2, 3], [4, 5], [6, 7], [8, 9]]
B = [[7, 8, 9], [10, 11, 12]]
B2 = [[80, 90, 10], [110, 120, 13]]


def _t(m: list) -> list:
    return [list(r) for r in zip(*m)]


def _product(a: list, b: list, bias: list | None = None) -> list:
    """The C test's hand-written sums, e.g. 1 * 7 + 2 * 10 - 1."""
    bias = bias or [0] * len(b[0])
    return [[sum(x * y for x, y in zip(r, c)) + d for c, d in zip(_t(b), bias)] for r in a]


GEMM_TESTS = {
    # name: (a as stored, b as stored, bias, transpose_a, transpose_b, NNC's result)
    "[[1, 2], [3, 4], [5, 6], [7, 8]] * [[7, 8, 9], [10, 11, 12]]": (
        A,
        B,
        None,
        False,
        False,
        _product(A, B),
    ),
    "[1, 2] * [[7, 8, 9], [10, 11, 12]]": ([1, 2], B, None, False, False, _product([[1, 2]], B)[0]),
    "[[1, 2], [3, 4], [5, 6], [7, 8]] * [[7, 10], [8, 11], [9, 12]]^T": (
        A,
        _t(B),
        None,
        False,
        True,
        _product(A, B),
    ),
    "[[1, 3, 5, 7], [2, 4, 6, 8]]^T * [[7, 10], [8, 11], [9, 12]]^T": (
        [_t(A)],
        _t(B),
        None,
        True,
        True,
        [_product(A, B)],
    ),
    "[[1, 2], [3, 4], [5, 6], [7, 8]] * [[7, 8, 9], [10, 11, 12]] + [-1, 0, 1]": (
        A,
        B,
        [-1, 0, 1],
        False,
        False,
        _product(A, B, [-1, 0, 1]),
    ),
    "[[1, 2], [3, 4], [5, 6], [7, 8]], [[2, 3], [4, 5], [6, 7], [8, 9]] * "
    "[[7, 8, 9], [10, 11, 12]]": (
        [A, A2],
        B,
        None,
        False,
        False,
        [_product(A, B), _product(A2, B)],
    ),
    "[[1, 2], [3, 4], [5, 6], [7, 8]], [[2, 3], [4, 5], [6, 7], [8, 9]] * "
    "[[7, 8, 9], [10, 11, 12]], [[80, 90, 10], [110, 120, 13]]": (
        [A, A2],
        [B, B2],
        None,
        False,
        False,
        [_product(A, B), _product(A2, B2)],
    ),
    "[[1, 3, 5, 7], [2, 4, 6, 8]], [[2, 4, 6, 8], [3, 5, 7, 9]]^T * [[7, 8, 9], [10, 11, 12]] "
    "+ [-1, 0, 1]": (
        [_t(A), _t(A2)],
        B,
        [-1, 0, 1],
        True,
        False,
        [_product(A, B, [-1, 0, 1]), _product(A2, B, [-1, 0, 1])],
    ),
    "[[1, 2], [3, 4], [5, 6], [7, 8]], [[2, 3], [4, 5], [6, 7], [8, 9]] * [[7, 10], [8, 11], "
    "[9, 12]], [[80, 110], [90, 120], [10, 13]]^T + [-1, 0, 1], [2, 3, -4]": (
        [A, A2],
        [_t(B), _t(B2)],
        [[[-1, 0, 1]], [[2, 3, -4]]],
        False,
        True,
        [_product(A, B, [-1, 0, 1]), _product(A2, B2, [2, 3, -4])],
    ),
}


@pytest.mark.parametrize("case", list(GEMM_TESTS), ids=range(len(GEMM_TESTS)))
def test_gemm_forward_hand_written(case) -> None:
    """NNC: the nine forward cases of gemm.tests.c, named by their products (the keys of
    GEMM_TESTS, e.g. "[1, 2] * [[7, 8, 9], [10, 11, 12]]"): a [4, 2] or [2] or
    a batch [2, 4, 2] (stored [.., 2, 4] under TRANSPOSE of its last two axes) times a
    shared [2, 3] or a batch [2, 2, 3] (stored [.., 3, 2] under TRANSPOSE), with a bias
    [3] or a per-batch [2, 1, 3]; the result has NNC's shape ([3] for the vector, [1, 4, 3]
    for the batch of one) and NNC's hand-written sums."""
    a, b, bias, ta, tb, want = GEMM_TESTS[case]
    extra = [] if bias is None else [np.array(bias, f32)]
    got = ops.gemm(transpose_a=ta, transpose_b=tb)(np.array(a, f32), np.array(b, f32), *extra)
    np.testing.assert_array_equal(np.asarray(got), np.array(want, f32))


# -- grid_sample.tests.c -----------------------------------------------------------------------


def test_grid_sample_forward_without_align_corners() -> None:
    """NNC: "grid_sample forward" (CMD_GRID_SAMPLE_FORWARD(0)): [1, 2] on [[1, 2], [3, 4]]
    sampled at (-1, -1) and (1, 1) without align corners lands on the outer pixel edges,
    half a pixel outside each axis, so a zero border weighs 3 / 4: [0.25, 1]."""
    a = np.arange(1, 5, dtype=f32).reshape(1, 2, 2, 1)
    grid = np.array([-1, -1, 1, 1], f32).reshape(1, 1, 2, 2)
    got = ops.grid_sample(align_corners=False)(a, grid)
    assert np.asarray(got).shape == (1, 1, 2, 1)
    assert_close(np.asarray(got).reshape(-1), np.array([0.25, 1], f32), rtol=0, atol=1e-5)
