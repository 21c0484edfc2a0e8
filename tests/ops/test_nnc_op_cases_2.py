"""NNC's op tests (liuliu/ccv ``test/unit/nnc/*.tests.c``), continued from
``test_nnc_op_cases.py``: gemm (``cblas.tests.c``), 3x3 convolution
(``winograd.tests.c``), smooth L1, and layer norm, RMS norm and GELU against NNC's
graphs of primitive commands differentiated by the backward pass.

NNC's ``TRANSPOSE(i, j)`` of a gemm operand names its last two axes in every case here,
so it is fnnc's ``transpose_a`` / ``transpose_b``. Where a C test compares two NNC
backends (cblas against the reference, winograd against direct convolution), the port
compares fnnc's command with NumPy in float64 instead.
"""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, compile, interpret
from tests.helpers import assert_close, rand

f32 = np.float32


def _t(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2).copy()


def _ids(name: str) -> str:
    return name.replace(",", "").replace(" ", "-")


# -- cblas.tests.c: small gemms with hand-computed results -----------------------------

A = np.array([[1, 2], [3, 4], [5, 6], [7, 8]], f32)
B = np.array([[7, 8, 9], [10, 11, 12]], f32)
A_PLUS_1 = A + 1  # the second batch of "batch 2": [[2, 3], [4, 5], ...]
B_SECOND = np.array([[80, 90, 10], [110, 120, 13]], f32)  # stored transposed in the C test


def _gemm_case(a, b, ta, tb, bias=None):
    """Operands as the C test stores them (transposed where asked), the expected
    product from the untransposed ones."""
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    want = want if bias is None else want + bias
    return (_t(a) if ta else a), (_t(b) if tb else b), ta, tb, bias, want


GEMM_FORWARD = {
    "no transpose": _gemm_case(A, B, False, False),
    "transpose a": _gemm_case(A, B, True, False),
    "transpose b": _gemm_case(A, B, False, True),
    "transpose a and b": _gemm_case(A, B, True, True),
    "no transpose with bias": _gemm_case(A, B, False, False, np.tile(f32([1, -1, 1]), (4, 1))),
    "no transpose batch 2": _gemm_case(np.stack([A, A_PLUS_1]), B, False, False),
    "transpose a batch 2": _gemm_case(np.stack([A, A_PLUS_1]), B, True, False, f32([-1, 0, 1])),
    "transpose b batch 2": _gemm_case(
        np.stack([A, A_PLUS_1]),
        np.stack([B, B_SECOND]),
        False,
        True,
        f32([[[-1, 0, 1]], [[2, 3, -4]]]),
    ),
}


@pytest.mark.parametrize("case", sorted(GEMM_FORWARD), ids=_ids)
def test_gemm_forward(case) -> None:
    """NNC's "gemm no transpose", "gemm transpose a", "gemm transpose b", "gemm transpose a
    and b", "gemm no transpose with bias" (a full [4, 3] bias), "gemm no transpose batch 2",
    "gemm transpose a batch 2" (bias [3]) and "gemm transpose b batch 2" (bias [2, 1, 3])."""
    a, b, ta, tb, bias, want = GEMM_FORWARD[case]
    got = ops.gemm(transpose_a=ta, transpose_b=tb)(a, b, *([] if bias is None else [bias]))
    np.testing.assert_array_equal(got, want.astype(f32))


def test_gemm_forward_spot_values() -> None:
    """A few of the C test's hand-written entries, independent of NumPy's matmul."""
    c = np.asarray(ops.gemm()(A, B))
    assert c[0, 0] == 1 * 7 + 2 * 10 and c[3, 2] == 7 * 9 + 8 * 12
    a, b, _, _, bias, _ = GEMM_FORWARD["transpose b batch 2"]
    c = np.asarray(ops.gemm(transpose_b=True)(a, b, bias))
    assert c[1, 0, 0] == 2 * 80 + 3 * 110 + 2 and c[1, 3, 2] == 8 * 10 + 9 * 13 - 4


G = np.arange(1, 13, dtype=f32).reshape(4, 3)
GA = np.array([[13, 14], [15, 16], [17, 18], [19, 20]], f32)
GB = np.array([[21, 22, 23], [24, 25, 26]], f32)
GA_SECOND = np.array([[131, 141], [151, 161], [171, 181], [191, 201]], f32)
GB_SECOND = np.array([[212, 222, 232], [242, 252, 262]], f32)

GEMM_BACKWARD = {
    # name: (g, a, b, transpose_a, transpose_b, bias shape)
    "no transpose": (G, GA, GB, False, False, (3,)),
    "transpose a": (G, GA, GB, True, False, (3,)),
    "transpose b": (G, GA, GB, False, True, (3,)),
    "transpose a and b": (G, GA, GB, True, True, (3,)),
    "no transpose batch 2, same b": (
        np.stack([G, 10 * G]),
        np.stack([GA, GA_SECOND]),
        GB,
        False,
        False,
        (3,),
    ),
    "no transpose batch 2, batched b": (
        np.stack([G, 10 * G]),
        np.stack([GA, GA_SECOND]),
        np.stack([GB, GB_SECOND]),
        False,
        False,
        (2, 1, 3),
    ),
    "transpose a batch 2, same b": (
        np.stack([G, 10 * G]),
        np.stack([GA, GA_SECOND]),
        GB,
        True,
        False,
        (3,),
    ),
    "transpose b batch 2, batched b": (
        np.stack([G, 10 * G]),
        np.stack([GA, GA_SECOND]),
        np.stack([GB, GB_SECOND]),
        False,
        True,
        (2, 1, 3),
    ),
    "transpose a and b batch 2, same b": (
        np.stack([G, 10 * G]),
        np.stack([GA, GA_SECOND]),
        GB,
        True,
        True,
        (3,),
    ),
}


@pytest.mark.parametrize("case", sorted(GEMM_BACKWARD), ids=_ids)
def test_gemm_backward(case) -> None:
    """The nine "backward gemm with ..." cases: for y = a b + bias, the input gradient
    g bᵀ, the weight gradient aᵀ g (summed over the batch when b is shared) and the bias
    gradient (g summed to the bias's shape), each stored transposed where its operand is.

    NNC TEST_CASE covered here:
    "backward gemm with transpose a batch 2, same b".
    """
    g, a, b, ta, tb, bias_shape = GEMM_BACKWARD[case]
    cmd = ops.gemm(transpose_a=ta, transpose_b=tb)
    bias = np.zeros(bias_shape, f32)  # NNC passes none; its shape picks dbias's
    ha, hb, hbias = cmd.definition.backward(
        (g,), (_t(a) if ta else a, _t(b) if tb else b, bias), (None,), **cmd.kwargs
    )
    g64, a64, b64 = (v.astype(np.float64) for v in (g, a, b))
    want_h = g64 @ _t(b64)
    want_db = _t(a64) @ g64
    want_db = want_db if b.ndim == want_db.ndim else want_db.sum(0)
    want_bias = g64.sum(-2, keepdims=True)
    want_bias = (
        want_bias.reshape(bias_shape) if len(bias_shape) == 3 else want_bias.reshape(-1, 3).sum(0)
    )
    np.testing.assert_array_equal(ha, (_t(want_h) if ta else want_h).astype(f32))
    np.testing.assert_array_equal(hb, (_t(want_db) if tb else want_db).astype(f32))
    np.testing.assert_array_equal(hbias, want_bias.astype(f32))


def test_gemm_backward_spot_values() -> None:
    """Hand-written entries of "backward gemm with no transpose batch 2, same b"."""
    g, a, b, *_ = GEMM_BACKWARD["no transpose batch 2, same b"]
    cmd = ops.gemm()
    ha, hb, hbias = cmd.definition.backward((g,), (a, b, np.zeros(3, f32)), (None,), **cmd.kwargs)
    np.testing.assert_array_equal(hbias, [22 + 220, 26 + 260, 30 + 300])
    assert np.asarray(ha)[1, 3, 1] == 100 * 24 + 110 * 25 + 120 * 26
    first = 1 * 13 + 4 * 15 + 7 * 17 + 10 * 19 + 10 * 131 + 40 * 151 + 70 * 171 + 100 * 191
    assert np.asarray(hb)[0, 0] == first


# -- cblas.tests.c: dense layers and batched gemms through strided views ------------------


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_dense_gemm_forward_and_backward(with_bias) -> None:
    """NNC's "cblas forward gemm" / "... no bias" and "cblas backward gemm" / "... no bias"
    (NNC's one-row CPU result against its batched GPU one): x [10, 128] times a weight
    [64, 128] plus a bias [64]; row 0 alone gives row 0; the gradients match NumPy.

    NNC TEST_CASEs covered here:
    "cblas forward gemm no bias",
    "cblas backward gemm no bias".
    """
    x, w = rand([10, 128], lo=0.0, hi=1.0), rand([64, 128], seed=1, lo=0.0, hi=1.0) / (64 * 128)
    bias = [rand([64], seed=2, lo=0.0, hi=1.0)] if with_bias else []
    cmd = ops.gemm(transpose_b=True)
    y = np.asarray(cmd(x, w, *bias))
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    assert_close(y, x64 @ w64.T + (bias[0] if bias else 0), rtol=1e-5, atol=1e-6)
    assert_close(cmd(x[:1], w, *bias), y[:1], rtol=1e-6, atol=1e-6)
    g = rand([10, 64], seed=3, lo=0.0, hi=1.0)
    grads = cmd.definition.backward((g,), (x, w, *bias), (y,), **cmd.kwargs)
    want = [g @ w64, g.T.astype(np.float64) @ x64] + ([g.sum(0)] if bias else [])
    assert_close(grads, tuple(want), rtol=1e-5, atol=1e-5)


def test_gemm_reads_permuted_views() -> None:
    """NNC's "cblas handle permute": a [10, 2, 128] and w [64, 2, 128] read as [2, 10, 128] and
    [2, 64, 128] through strides (128, 256, 1): one gemm per slice of axis 1."""
    b = GraphBuilder()
    a = b.input((10, 2, 128), name="a")
    w = b.input((64, 2, 128), name="w")
    view = dict(stride=(128, 256, 1))
    y = b.exec(
        ops.gemm(transpose_b=True),
        b.alias(a, (2, 10, 128), **view),
        b.alias(w, (2, 64, 128), **view),
    )
    graph = b.build([y])
    av, wv = rand([10, 2, 128], lo=0.0, hi=1.0), rand([64, 2, 128], seed=1) / (64 * 128)
    want = np.einsum("ibk,jbk->bij", av.astype(np.float64), wv.astype(np.float64))
    for got in (interpret(graph, av, wv), compile(graph)(av, wv)):
        assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("batched_w", [True, False], ids=["batched-w", "broadcast-w"])
def test_generalized_batched_gemm_through_views(batched_w, with_bias) -> None:
    """The eight "generalized batched gemm with batch (2, 4)" cases (with / without bias,
    batched / broadcast weight, and their "compare cblas" twins): a [2, 10, 4, 128] read
    as [2, 4, 10, 128] through strides (5120, 128, 512, 1), every leading axis a batch."""
    b = GraphBuilder()
    a = b.input((2, 10, 4, 128), name="a")
    a_view = b.alias(a, (2, 4, 10, 128), stride=(10 * 4 * 128, 128, 4 * 128, 1))
    if batched_w:
        w = b.input((2, 64, 4, 128), name="w")
        w_view = b.alias(w, (2, 4, 64, 128), stride=(64 * 4 * 128, 128, 4 * 128, 1))
    else:
        w = w_view = b.input((64, 128), name="w")
    ins = [b.input((64,), name="bias")] if with_bias else []
    y = b.exec(ops.gemm(transpose_b=True), a_view, w_view, *ins)
    graph = b.build([y])
    av = rand([2, 10, 4, 128], lo=0.0, hi=1.0)
    wv = rand([2, 64, 4, 128] if batched_w else [64, 128], seed=1, lo=0.0, hi=1.0) / (64 * 128)
    biases = [rand([64], seed=2, lo=0.0, hi=1.0) / 64] if with_bias else []
    at = np.swapaxes(av, 1, 2).astype(np.float64)  # the C test's transposed copies
    wt = np.swapaxes(wv, 1, 2) if batched_w else wv
    want = np.matmul(at, _t(wt.astype(np.float64))) + (biases[0] if biases else 0)
    assert_close(interpret(graph, av, wv, *biases), want, rtol=1e-5, atol=1e-6)


# -- winograd.tests.c: 3x3 convolution, NNC's automatic padding ---------------------------


def _conv3x3_same(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """Stride 1, one pixel of zero padding on each side, in float64 (NHWC, w [O, 3, 3, I])."""
    _, h, wd, _ = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    patches = np.stack(
        [xp[:, i : i + h, j : j + wd] for i in range(3) for j in range(3)], axis=3
    )  # [N, H, W, 9, I]
    y = np.einsum("nhwki,oki->nhwo", patches, w.reshape(w.shape[0], 9, -1).astype(np.float64))
    return y if bias is None else y + bias


@pytest.mark.parametrize(
    "size, channels, with_bias",
    [(8, 16, True), (7, 16, True), (12, 3, True), (8, 16, False)],
    ids=["even", "odd", "rgb", "no-bias"],
)
def test_convolution_3x3_keeps_the_size(size, channels, with_bias) -> None:
    """NNC's "convolutional network of 3x3 on 56x56 / 55x55 with non-uniform weights", "... on
    224x224 with non-uniform weights and RGB channels" and "... on 56x56 with no bias"
    (NNC's winograd backend against its reference), at smaller sizes: 16 filters with
    weights in [0, 1) / (9 * in), bias i / 16, padding 1 so the output keeps H and W.

    NNC TEST_CASEs covered here:
    "convolutional network of 3x3 on 56x56 with non-uniform weights",
    "convolutional network of 3x3 on 55x55 with non-uniform weights",
    "convolutional network of 3x3 on 224x224 with non-uniform weights and RGB channels",
    "convolutional network of 3x3 on 56x56 with no bias".
    """
    x = rand([1, size, size, channels], lo=0.0, hi=1.0)
    w = rand([16, 3, 3, channels], seed=1, lo=0.0, hi=1.0) / (9 * channels)
    bias = np.arange(16, dtype=f32) / 16 if with_bias else None
    got = ops.convolution(padding=1)(x, w, *([] if bias is None else [bias]))
    assert got.shape == (1, size, size, 16)
    assert_close(got, _conv3x3_same(x, w, bias), rtol=1e-5, atol=1e-5)


# -- smooth_l1.tests.c ------------------------------------------------------------------------


def test_smooth_l1_values_and_gradient() -> None:
    """NNC's "compare smooth L1": against zero labels, sample 0 (L1 distance 2.0001 >= 1) costs
    2.0001 - 0.5 and gets sign(a); sample 1 (0.9 < 1) costs 0.5 * sum(a^2) and gets a."""
    a = np.array([[-0.0001, 1, -1], [-0.5, 0.4, 0]], f32)
    label = np.zeros((2, 3), f32)
    cmd = ops.smooth_l1(beta=1.0)
    loss = cmd(a, label)
    assert_close(loss, np.array([[1.5001], [0.205]], f32), rtol=1e-6, atol=1e-6)
    da, _ = cmd.definition.backward((np.ones((2, 1), f32),), (a, label), (loss,), **cmd.kwargs)
    assert_close(da, np.array([[-1, 1, -1], [-0.5, 0.4, 0]], f32), rtol=1e-6, atol=1e-7)


# -- layer.norm.tests.c, rmsnorm.tests.c, gelu.tests.c: fused commands vs primitive graphs --

SHAPE = (8, 4, 4, 10)
AXES = (1, 2, 3)
PER_SAMPLE = 4 * 4 * 10


def _normalise_graph(centre: bool):
    """NNC's graph of primitives over axes 1..3 of x, with the output's gradient dy as a
    second input: (x - mean when ``centre``), var = its mean square, std =
    exp(log(var) / 2), y = (x - mean) / std. The graph returns y and dx."""
    b = GraphBuilder()
    x = b.input(SHAPE, name="x")
    dy = b.input(SHAPE, name="dy")

    def mean_of(t):
        return b.exec(ops.scalar_mul(a=1.0 / PER_SAMPLE), b.exec(ops.reduce_sum(axes=AXES), t))

    w = b.exec(ops.add(q=-1.0), x, mean_of(x)) if centre else x
    var = mean_of(b.exec(ops.ewprod(), w, w))
    std = b.exec(ops.ewexp(), b.exec(ops.scalar_mul(a=0.5), b.exec(ops.ewlog(), var)))
    inv_std = b.exec(ops.ewdiv(), b.constant(np.float32(1.0)), std)
    y = b.exec(ops.mul(), w, inv_std)
    graph, _ = backward(b.build([y]), y, [x], df=dy)
    return graph


@pytest.mark.parametrize("affine", [True, False], ids=["scale-bias", "plain"])
def test_layer_norm_matches_primitive_graph(affine) -> None:
    """NNC's "implement layer norm with other symbolic graph" and "compare layer norm gradient
    with other symbolic graph", each also "without scale / bias": layer_norm over axes
    1..3 with epsilon 0 (scale 1, bias 0) gives the primitive graph's y, and its backward
    the gradient the backward pass derives through the primitives."""
    x, dy = rand(SHAPE, lo=0.0, hi=1.0), rand(SHAPE, seed=1)
    y_ref, dx_ref = interpret(_normalise_graph(centre=True), x, dy)
    cmd = ops.layer_norm(axes=AXES, epsilon=0.0)
    params = (np.ones(SHAPE[1:], f32), np.zeros(SHAPE[1:], f32)) if affine else ()
    outs = cmd(x, *params)
    assert_close(outs[0], y_ref, rtol=1e-4, atol=1e-5)
    grads = cmd.definition.backward((dy, None, None), (x, *params), outs, **cmd.kwargs)
    assert_close(grads[0], dx_ref, rtol=1e-4, atol=1e-4)
    if affine:
        xhat = np.asarray(outs[0]).astype(np.float64)
        assert_close(grads[1:], ((dy * xhat).sum(0), dy.sum(0)), rtol=1e-4, atol=1e-4)


def test_rms_norm_matches_primitive_graph() -> None:
    """NNC's "implement rmsnorm with other symbolic graph" and "compare rmsnorm gradient with
    other symbolic graph": rms_norm over axes 1..3 with epsilon 0 and scale 1 against the
    primitive graph without the mean, forward and backward."""
    x, dy = rand(SHAPE, lo=0.0, hi=1.0), rand(SHAPE, seed=1)
    y_ref, dx_ref = interpret(_normalise_graph(centre=False), x, dy)
    cmd = ops.rms_norm(axes=AXES, epsilon=0.0)
    scale = np.ones(SHAPE[1:], f32)
    outs = cmd(x, scale)
    assert_close(outs[0], y_ref, rtol=1e-4, atol=1e-5)
    grads = cmd.definition.backward((dy, None), (x, scale), outs, **cmd.kwargs)
    assert_close(grads[0], dx_ref, rtol=1e-4, atol=1e-4)


def test_tanh_gelu_matches_primitive_graph() -> None:
    """NNC's "compare fast GELU gradient with fine-grained symbolic graph": gelu with the tanh
    approximation against 0.5 x (1 + tanh(0.79788456 (x + 0.044715 x^3))) built from mul,
    add, scalar_mul, tanh and a set, forward and backward."""
    b = GraphBuilder()
    x = b.input((10,), name="x")
    dy = b.input((10,), name="dy")
    one = b.exec(ops.set(shape=(10,), value=1.0))
    x_cube = b.exec(ops.mul(p=0.044715), b.exec(ops.mul(), x, x), x)
    inner = b.exec(ops.scalar_mul(a=0.797884560802865355), b.exec(ops.add(), x, x_cube))
    y = b.exec(ops.mul(p=0.5), x, b.exec(ops.add(), b.exec(ops.tanh(), inner), one))
    graph, _ = backward(b.build([y]), y, [x], df=dy)
    xv, dyv = rand([10], seed=1, lo=0.0, hi=1.0), rand([10], seed=2)
    y_ref, dx_ref = interpret(graph, xv, dyv)
    cmd = ops.gelu(approximate=True)
    got = cmd(xv)
    assert_close(got, y_ref, rtol=1e-5, atol=1e-6)
    (dx,) = cmd.definition.backward((dyv,), (xv,), (got,), **cmd.kwargs)
    assert_close(dx, dx_ref, rtol=1e-5, atol=1e-6)
