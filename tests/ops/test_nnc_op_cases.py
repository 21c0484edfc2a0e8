"""NNC's op tests (liuliu/ccv ``test/unit/nnc/*.tests.c``) translated to fnnc: data
movement through views, broadcasting, pad, upsample, index_select, concat in a model
and LSSC compression. Each test names the C test case it ports; the expected tensors
are NNC's (hand-written there, or the closed form the C test computes them from).

NNC's tensor views are fnnc's alias symbols (``GraphBuilder.alias``): a command reads a
strided view of a graph input or writes into a view of a tensor whose unwritten part is
zero, as the C tests' zeroed buffers are. NNC's batch-less NHWC / NCHW tensors get a
leading batch axis of 1, and NCHW data goes through ``format_transform``, as fnnc's
spatial commands are NHWC.

The remaining cases (gemm, convolution, losses, normalisation, GELU) are in
``test_nnc_op_cases_2.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, compile, interpret
from fnnc.models import Concat, Dense, Input, Model, Sequential
from tests.helpers import assert_close, rand

f32 = np.float32


def _run(graph, *xs):
    """The graph's outputs, interpreted and compiled: both must agree; returns one list."""
    got_i, got_c = interpret(graph, *xs), compile(graph)(*xs)
    got_i, got_c = (list(g) if len(graph.outputs) > 1 else [g] for g in (got_i, got_c))
    assert_close(got_c, got_i, rtol=0, atol=0, what="compiled vs interpreted")
    return [np.asarray(g) for g in got_i]


# -- transform.tests.c: data transfer, format transform and transpose through views ----


def test_data_transfer_between_views() -> None:
    """NNC's "data transfer between different tensor views": a [2, 3, 4] view at (4, 3, 2) of
    an iota [56, 56, 128] is copied to the corner of a zeroed [24, 32, 64]."""
    b = GraphBuilder()
    a = b.input((56, 56, 128), name="a")
    t = b.tensor((24, 32, 64), name="t")
    b.exec(
        ops.data_transfer(),
        b.alias(a, (2, 3, 4), offset=(4, 3, 2)),
        outputs=[b.alias(t, (2, 3, 4))],
    )
    (got,) = _run(b.build([t]), np.arange(56 * 56 * 128, dtype=f32).reshape(56, 56, 128))
    i, j, k = np.meshgrid(range(2), range(3), range(4), indexing="ij")
    want = np.zeros((24, 32, 64), f32)
    want[:2, :3, :4] = 128 * 56 * (4 + i) + 128 * (3 + j) + 2 + k
    np.testing.assert_array_equal(got, want)


def test_format_transform_nhwc_to_nchw_and_back() -> None:
    """NNC's "format transform between NHWC and NCHW tensors": an iota HWC [4, 3, 2] becomes
    CHW [2, 4, 3] = evens then odds, and back."""
    a = np.arange(24, dtype=f32).reshape(1, 4, 3, 2)
    c = ops.format_transform(src="NHWC", dst="NCHW")(a)
    want = np.concatenate([np.arange(0, 24, 2), np.arange(1, 24, 2)]).reshape(1, 2, 4, 3)
    np.testing.assert_array_equal(c, want)
    np.testing.assert_array_equal(ops.format_transform(src="NCHW", dst="NHWC")(c), a)


def test_format_transform_between_views() -> None:
    """NNC's "format transform between NHWC and NCHW tensor views": the HWC view [4, 3, 2] at
    (3, 2, 1) of a [7, 6, 5] lands in the CHW corner of a zeroed [8, 10, 8] (row stride 8,
    channel stride 80), and comes back into a zeroed [7, 6, 5] equal to the input."""
    i, j, k = np.meshgrid(range(4), range(3), range(2), indexing="ij")
    a = np.zeros((7, 6, 5), f32)
    a[3:7, 2:5, 1:3] = k + j * 2 + i * 3 * 2
    b = GraphBuilder()
    src = b.input((7, 6, 5), name="a")
    chw = b.tensor((8, 10, 8), name="chw")
    hwc = b.tensor((7, 6, 5), name="hwc")
    a_view = dict(offset=(0, 3, 2, 1), stride=(0, 30, 5, 1))
    c_view = dict(stride=(0, 80, 8, 1))
    nchw = ops.format_transform(src="NHWC", dst="NCHW")
    nhwc = ops.format_transform(src="NCHW", dst="NHWC")
    b.exec(
        nchw, b.alias(src, (1, 4, 3, 2), **a_view), outputs=[b.alias(chw, (1, 2, 4, 3), **c_view)]
    )
    b.exec(
        nhwc, b.alias(chw, (1, 2, 4, 3), **c_view), outputs=[b.alias(hwc, (1, 4, 3, 2), **a_view)]
    )
    c, d = _run(b.build([chw, hwc]), a)
    want = np.zeros((8, 10, 8), f32)
    ci, hi, wi = np.meshgrid(range(2), range(4), range(3), indexing="ij")
    want[:2, :4, :3] = ci + 2 * wi + 6 * hi  # c[0:3] = 0, 2, 4; c[8] = 6; c[80] = 1
    np.testing.assert_array_equal(c, want)
    np.testing.assert_array_equal(d, a)


@pytest.mark.parametrize(
    "root_a, root_b, offset, view, perm",
    [
        ((7, 6, 5, 4), (8, 7, 6, 5), (3, 2, 1, 0), (4, 3, 2, 2), (0, 3, 2, 1)),
        ((6, 5, 4), (7, 6, 5), (2, 1, 0), (3, 2, 2), (2, 1, 0)),
    ],
    ids=["4d", "3d"],
)
def test_transpose_between_views(root_a, root_b, offset, view, perm) -> None:
    """NNC's "transpose two 4d tensor views" (axes 1 and 3) and "transpose two 3d tensor views"
    (axes 0 and 2): an iota view of a zeroed tensor, transposed into a view at the same
    offset of a larger zeroed one, and back."""
    n = len(view)
    a = np.zeros(root_a, f32)
    place = tuple(slice(o, o + s) for o, s in zip(offset, view))
    a[place] = np.arange(np.prod(view), dtype=f32).reshape(view)
    tview = tuple(view[p] for p in perm)
    b = GraphBuilder()
    src = b.input(root_a, name="a")
    there = b.tensor(root_b, name="there")
    back = b.tensor(root_a, name="back")
    cmd = ops.transpose(perm=perm)
    b.exec(cmd, b.alias(src, view, offset=offset), outputs=[b.alias(there, tview, offset=offset)])
    b.exec(cmd, b.alias(there, tview, offset=offset), outputs=[b.alias(back, view, offset=offset)])
    c, d = _run(b.build([there, back]), a)
    want = np.zeros(root_b, f32)
    idx = np.indices(view).reshape(n, -1)  # the C loops: c[offset + permuted index] = iota
    want[tuple(np.asarray(offset)[:, None] + idx[list(perm)])] = np.arange(idx.shape[1])
    np.testing.assert_array_equal(c, want)
    np.testing.assert_array_equal(d, a)


def test_strided_view_copy_is_a_transpose() -> None:
    """NNC's "compare permute with transpose": reading [6, 5, 4, 3] through the view [6, 4, 5, 3]
    with strides (60, 3, 12, 1) gives what transposing axes 1 and 2 gives."""
    b = GraphBuilder()
    a = b.input((6, 5, 4, 3), name="a")
    permuted = b.exec(ops.data_transfer(), b.alias(a, (6, 4, 5, 3), stride=(60, 3, 12, 1)))
    transposed = b.exec(ops.transpose(perm=(0, 2, 1, 3)), a)
    x = rand([6, 5, 4, 3], lo=0.0, hi=1.0)
    p, t = _run(b.build([permuted, transposed]), x)
    np.testing.assert_array_equal(p, t)
    np.testing.assert_array_equal(p, np.swapaxes(x, 1, 2))


# -- broadcast.tests.c ----------------------------------------------------------------------

ROW = np.array([1, 2, 3], f32)
M23 = np.array([[1, 2, 3], [4, 5, 6]], f32)
COL = np.array([[1], [2], [3], [4]], f32)


@pytest.mark.parametrize(
    "cmd, a, b, want",
    [
        (ops.add(), ROW, np.array([7], f32), [8, 9, 10]),
        (ops.add(), M23, np.array([7, 8, 9], f32), [[8, 10, 12], [11, 13, 15]]),
        (ops.add(), COL, np.array([5, 6], f32), [[6, 7], [7, 8], [8, 9], [9, 10]]),
        (ops.mul(), np.array([7], f32), ROW, [7, 14, 21]),
        (ops.mul(), M23, np.array([7, 8, 9], f32), [[7, 16, 27], [28, 40, 54]]),
        (ops.mul(), COL, np.array([5, 6], f32), [[5, 6], [10, 12], [15, 18], [20, 24]]),
    ],
    ids=["add-row-1", "add-2x3-row", "add-col-row", "mul-1-row", "mul-2x3-row", "mul-col-row"],
)
def test_add_and_mul_broadcast(cmd, a, b, want) -> None:
    """The six "broadcasting semantics for add / mul" cases: NumPy's rules, NNC's sums.

    NNC TEST_CASEs covered here:
    "broadcasting semantics for add [[1, 2, 3]] + [7]",
    "broadcasting semantics for add [[1, 2, 3], [4, 5, 6]] + [7, 8, 9]",
    "broadcasting semantics for add [[1], [2], [3], [4]] + [5, 6]",
    "broadcasting semantics for mul [7] * [[1, 2, 3]]",
    "broadcasting semantics for mul [[1, 2, 3], [4, 5, 6]] * [7, 8, 9]",
    "broadcasting semantics for mul [[1], [2], [3], [4]] * [5, 6]".
    """
    np.testing.assert_array_equal(cmd(a, b), np.array(want, f32))


# -- pad.tests.c ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode, end, want",
    [
        (
            "constant",
            (1, 0),
            [[0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 2, 3], [0, 4, 5, 6], [0, 0, 0, 0]],
        ),
        (
            "edge",
            (1, 1),
            [[1, 1, 2, 3, 3]] * 3 + [[4, 4, 5, 6, 6]] * 2,
        ),
    ],
    ids=["zero", "replicate"],
)
def test_pad(mode, end, want) -> None:
    """NNC's "implement pad zero" and "implement pad replicate": NNC's begin (2, 1) and end
    pads are fnnc's per-axis (lo, hi) pairs ((2, end[0]), (1, end[1]))."""
    x = np.arange(1, 7, dtype=f32).reshape(2, 3)
    got = ops.pad(pads=((2, end[0]), (1, end[1])), mode=mode)(x)
    np.testing.assert_array_equal(got, np.array(want, f32))


# -- upsample.tests.c -----------------------------------------------------------------------

CORNER = np.array([[1, 2, 0], [3, 4, 0], [0, 0, 0]], f32).reshape(1, 3, 3, 1)
NEAREST_CORNERS = np.repeat(np.repeat(CORNER[0, :, :, 0], 2, 0), 2, 1)
BILINEAR_CORNERS = [
    [1, 1.4, 1.8, 1.6, 0.8, 0],
    [1.8, 2.2, 2.6, 2.24, 1.12, 0],
    [2.6, 3.0, 3.4, 2.88, 1.44, 0],
    [2.4, 2.72, 3.04, 2.56, 1.28, 0],
    [1.2, 1.36, 1.52, 1.28, 0.64, 0],
    [0, 0, 0, 0, 0, 0],
]


def test_upsample_nearest() -> None:
    """NNC's "upsample nearest": an iota [2, 2, 2] HWC doubled, each pixel a 2x2 block."""
    got = ops.upsample(scale=(2, 2))(np.arange(8, dtype=f32).reshape(1, 2, 2, 2))
    want = [[0, 1, 0, 1, 2, 3, 2, 3]] * 2 + [[4, 5, 4, 5, 6, 7, 6, 7]] * 2
    np.testing.assert_array_equal(np.asarray(got).reshape(4, 8), want)


@pytest.mark.parametrize(
    "mode, want", [("nearest", NEAREST_CORNERS), ("bilinear", BILINEAR_CORNERS)]
)
def test_upsample_align_corners(mode, want) -> None:
    """NNC's "upsample nearest, align corners" and "upsample bilinear, align corners": 3x3 to
    6x6 with the corner pixels on each other (source x = i * 2 / 5)."""
    got = ops.upsample(scale=(2, 2), mode=mode, align_corners=True)(CORNER)
    assert_close(np.asarray(got)[0, :, :, 0], np.array(want, f32), rtol=1e-5, atol=1e-6)


def _downsample(g: np.ndarray) -> np.ndarray:
    """NNC's UPSAMPLE_BACKWARD (nearest, x2) of the NHWC ``g``: fnnc's upsample backward."""
    n, h, w, c = g.shape
    x = np.zeros((n, h // 2, w // 2, c), f32)
    (gx,) = ops.upsample.definition.backward(
        (g,), (x,), (None,), scale=(2, 2), mode="nearest", align_corners=False
    )
    return np.asarray(gx)


def test_downsample_nearest_sums_blocks() -> None:
    """NNC's "downsample nearest": the backward of a x2 nearest upsample of an iota [4, 4, 2]
    sums each 2x2 block per channel (0 + 2 + 8 + 10, ...)."""
    got = _downsample(np.arange(32, dtype=f32).reshape(1, 4, 4, 2))
    want = [0 + 2 + 8 + 10, 1 + 3 + 9 + 11, 4 + 6 + 12 + 14, 5 + 7 + 13 + 15]
    want += [16 + 18 + 24 + 26, 17 + 19 + 25 + 27, 20 + 22 + 28 + 30, 21 + 23 + 29 + 31]
    np.testing.assert_array_equal(got.reshape(-1), want)


def test_upsample_and_downsample_nearest_nchw() -> None:
    """NNC's "upsample nearest in NCHW" and "downsample nearest in NCHW": each channel plane is
    resized on its own; NCHW goes through format_transform around the NHWC command."""
    to_nhwc = ops.format_transform(src="NCHW", dst="NHWC")
    to_nchw = ops.format_transform(src="NHWC", dst="NCHW")
    up = to_nchw(ops.upsample(scale=(2, 2))(to_nhwc(np.arange(8, dtype=f32).reshape(1, 2, 2, 2))))
    want = [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3], [2, 2, 3, 3]]
    want += [[4, 4, 5, 5], [4, 4, 5, 5], [6, 6, 7, 7], [6, 6, 7, 7]]
    np.testing.assert_array_equal(np.asarray(up).reshape(8, 4), want)
    down = to_nchw(_downsample(np.asarray(to_nhwc(np.arange(32, dtype=f32).reshape(1, 2, 4, 4)))))
    want = [0 + 1 + 4 + 5, 2 + 3 + 6 + 7, 8 + 9 + 12 + 13, 10 + 11 + 14 + 15]
    want += [16 + 17 + 20 + 21, 18 + 19 + 22 + 23, 24 + 25 + 28 + 29, 26 + 27 + 30 + 31]
    np.testing.assert_array_equal(np.asarray(down).reshape(-1), want)


# -- index.tests.c --------------------------------------------------------------------------

A32 = np.array([[1, 2], [2, 3], [3, 4]], f32)
A5 = np.array([1, 2, 3, 4, 5], f32)
TWICE_1 = np.array([1, 1], np.int32)
PICK_3 = np.array([3, 2, 4], np.int32)


@pytest.mark.parametrize(
    "x, idx, want",
    [(A32, TWICE_1, [[2, 3], [2, 3]]), (A5, PICK_3, [4, 3, 5])],
    ids=["rows", "1d"],
)
def test_index_select(x, idx, want) -> None:
    """NNC's "index select a tensor" and "index select a 1d tensor"."""
    np.testing.assert_array_equal(ops.index_select()(x, idx), np.array(want, f32))


@pytest.mark.parametrize(
    "g, idx, x_shape, want",
    [
        (np.array([[1, 2], [2, 3]], f32), TWICE_1, (3, 2), [[0, 0], [3, 5], [0, 0]]),
        (np.array([4, 3, 5], f32), PICK_3, (5,), [0, 0, 3, 4, 5]),
    ],
    ids=["rows", "1d"],
)
def test_index_select_backward_adds_repeats(g, idx, x_shape, want) -> None:
    """NNC's "backward index select a tensor" (row 1 picked twice gets both rows) and
    "backward index select a 1d tensor"."""
    x = np.zeros(x_shape, f32)
    gx, gidx = ops.index_select.definition.backward((g,), (x, idx), (None,), axis=0)
    np.testing.assert_array_equal(gx, np.array(want, f32))
    assert gidx is None


def test_index_select_views_forward_and_backward() -> None:
    """NNC's "index select a tensor view" and "backward index select a tensor view": columns
    1:3 of a [3, 4] are the table, the result and its gradient are columns 1:3 of [2, 4]
    tensors; the gradient lands in columns 1:3 of a zeroed [3, 4]."""
    b = GraphBuilder()
    a = b.input((3, 4), name="a")
    idx = b.input((2,), np.int32, name="idx")
    g = b.input((2, 4), name="g")
    out = b.tensor((2, 4), name="out")
    y = b.exec(ops.index_select(), b.alias(a, (3, 2), offset=(0, 1)), idx)
    b.exec(ops.data_transfer(), y, outputs=[b.alias(out, (2, 2), offset=(0, 1))])
    dy = b.alias(g, (2, 2), offset=(0, 1))
    graph, _ = backward(b.build([out]), y, [a], df=dy)
    rows = np.array([[1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]], f32)
    grad = np.array([[0, 3, 4, 0], [0, 1, 5, 0]], f32)
    got, got_da = _run(graph, rows, TWICE_1, grad)
    np.testing.assert_array_equal(got, [[0, 3, 4, 0], [0, 3, 4, 0]])
    np.testing.assert_array_equal(got_da, [[0, 0, 0, 0], [0, 4, 9, 0], [0, 0, 0, 0]])
    # NNC writes the gradient into the view of an iota [3, 4], keeping what lies outside.
    iota = np.arange(12, dtype=f32).reshape(3, 4)
    inside = np.zeros((3, 4), bool)
    inside[:, 1:3] = True
    nnc = np.where(inside, got_da, iota)
    np.testing.assert_array_equal(nnc, [[0, 0, 0, 3], [4, 4, 9, 7], [8, 0, 0, 11]])


# -- concat.tests.c: concat in cnnp models --------------------------------------------------

A1 = np.array([-0.5], f32)
B2 = np.array([0.3, 2.0], f32)


def _fill(model, values: dict[str, float]) -> None:
    """NNC's ``ccv_cnnp_model_parameters_map(..., CMD_SET_FORWARD(v))`` per layer name."""
    params = model.parameters()
    model.set_parameters(
        {
            pid: np.full(np.shape(p), v, f32)
            for pid, p in params.items()
            for name, v in values.items()
            if f"-{name}-" in pid
        }
    )


def test_concat_then_dense() -> None:
    """NNC's "concatenate several tensors together": [-0.5] and [0.3, 2] joined, then a dense
    layer without bias whose weights are all 1: the sum -0.5 + 0.3 + 2."""
    x, y = Input(), Input()
    model = Model([x, y], [Dense(1, no_bias=True, name="linear")(Concat(axis=0)(x, y))])
    model.compile([A1, B2])
    _fill(model, {"linear": 1.0})
    assert_close(model.evaluate([A1, B2]), np.array([-0.5 + 0.3 + 2], f32), rtol=1e-5)


def test_sequential_concat_takes_every_input() -> None:
    """NNC's "concatenate several tensors together" as NNC builds it: a sequential model
    [concat, dense] compiled on two inputs."""
    model = Sequential([Concat(axis=0), Dense(1, no_bias=True, name="linear")], name="full")
    model.compile([A1, B2])
    _fill(model, {"linear": 1.0})
    assert_close(model.evaluate([A1, B2]), np.array([-0.5 + 0.3 + 2], f32), rtol=1e-5)


def test_concat_of_dense_outputs() -> None:
    """NNC's "concatenate several tensors together and make sure they are simplified away" (the
    values; NNC's check that its concat becomes in-place writes has no XLA counterpart):
    dense(1) of a at 0.5 and dense(2) of b at -0.5, joined, then dense(1) at 1."""
    x, y = Input(), Input()
    xz = Dense(1, no_bias=True, name="x_linear")(x)
    yz = Dense(2, no_bias=True, name="y_linear")(y)
    z = Dense(1, no_bias=True, name="linear")(Concat(axis=0)(xz, yz))
    model = Model([x, y], [z], name="full")
    model.compile([A1, B2])
    _fill(model, {"x_linear": 0.5, "y_linear": -0.5, "linear": 1.0})
    want = -0.5 * 0.5 + (0.3 + 2) * -0.5 * 2
    assert_close(model.evaluate([A1, B2]), np.array([want], f32), rtol=1e-5)


# -- compression.tests.c --------------------------------------------------------------------


def test_lssc_is_exact_on_two_value_blocks() -> None:
    """NNC's "LSSC should give exact result for 2-value data": five [10, 11] half-precision
    planes whose 4x4 blocks (partial at the edges) hold two values each round-trip
    exactly (min and max are the codec's end levels)."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (10, 11, 5)).astype(np.float16)
    for c in range(5):
        for i in range(0, 10, 4):
            for j in range(0, 11, 4):
                block = x[i : i + 4, j : j + 4, c]
                two = np.array([x[i, j, c], x[i, j + 1, c]])
                block[...] = two[rng.integers(0, 2, block.shape)]
    words = ops.lssc_compress()(x)
    back = ops.lssc_decompress(size=(10, 11))(words)
    assert np.asarray(back).dtype == np.float16
    np.testing.assert_array_equal(np.asarray(back).view(np.uint16), x.view(np.uint16))
