"""NNC's GPU-against-CPU integration tests ``test/int/nnc/cublas.tests.c`` and
``mpsblas.tests.c`` (liuliu/ccv c6ce5b1), ported where no other fnnc test covers the
configuration; ``test_nnc_int_blas_2.py`` continues with the elementwise, attention and
cmul cases.

NNC runs each command on the GPU and compares it with its CPU reference; here fnnc's
command is compared with NumPy in float64 (or ``jax.vjp`` of plain ``jnp``), at NNC's
own tolerance where the C test runs in half precision. Shapes are NNC's where they are
small, shrunk otherwise. The float32 gemm cases of these files are NNC's
``cblas.tests.c`` cases again and live in ``test_nnc_op_cases_2.py`` (hand-computed
products, batched and broadcast backward, permuted views forward) and
``test_gemm_broadcast.py`` (every batch broadcast, both transposes); this file adds the
half-precision gemms, palettized weights, gradients through strided views and the
partial gradients of the MPS backward cases, then SET and the datatype-conversion and
masked-fill cases of earlier versions of ``cublas.tests.c`` (85b48f6).

Translations: NNC's ``TRANSPOSE(i, j)`` of a gemm operand names its last two axes here,
so it is ``transpose_a`` / ``transpose_b``; a tensor view is an alias symbol
(``GraphBuilder.alias``); a backward that NNC asks only some gradients of is the graph
``backward`` pass with the wanted ``wrt``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, compile, interpret
from fnnc.io.palettize import depalettize, float_to_half, palettize
from tests.helpers import assert_close

f16, f32, f64 = np.float16, np.float32, np.float64
bf16 = ml_dtypes.bfloat16
DTYPES = {"float32": f32, "float16": f16, "bfloat16": bf16}


def _bwd(cmd, grads, inputs, outputs=None):
    """The command's backward in NNC's convention: gradients of the inputs."""
    outputs = (None,) * len(grads) if outputs is None else outputs
    return cmd.definition.backward(tuple(grads), tuple(inputs), tuple(outputs), **cmd.kwargs)


def _wide(x) -> np.ndarray:
    return np.asarray(x).astype(f64)


def _uniform(shape, seed, scale=1.0):
    """NNC's ``dsfmt_genrand_open_close`` draws: uniform in (0, 1], times ``scale``."""
    return (np.random.default_rng(seed).uniform(0.0, 1.0, shape) * scale).astype(f32)


# -- cublas / mps forward and backward gemm in half precision ---------------------------

# A dense layer x [10, 128] times w [64, 128] (NNC scales w by 1 / (64 * 128)), bias [64].
X, W, BIAS, G = (
    _uniform((10, 128), 1),
    _uniform((64, 128), 2, 1 / (64 * 128)),
    _uniform((64,), 3),
    _uniform((10, 64), 4),
)
HALF = {"float16": (np.float16, 1e-3, 1e-2), "bfloat16": (bf16, 1e-2, 5e-2)}
"""dtype -> (dtype, tolerance of outputs and input gradients, of weight and bias ones):
NNC's 1e-3 / 1e-2 for 16F; eight times that for bfloat16 (3 fewer mantissa bits)."""


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("half", sorted(HALF))
def test_dense_gemm_in_half_precision(half, with_bias) -> None:
    """NNC's "cublas forward gemm in half precision", "... no bias in half precision" and
    "cublas backward gemm in half precision" / "... no bias in half precision" (mps
    twins): the 16-bit product, input, weight and bias gradients against float64."""
    dtype, tol, wide_tol = HALF[half]
    cmd = ops.gemm(transpose_b=True)
    bias = [BIAS] if with_bias else []
    ins = [jnp.asarray(t, dtype) for t in (X, W, *bias)]
    y = cmd(*ins)
    assert y.dtype == dtype
    x64, w64 = X.astype(f64), W.astype(f64)
    assert_close(y, x64 @ w64.T + (BIAS if with_bias else 0), rtol=0, atol=tol)
    grads = _bwd(cmd, [jnp.asarray(G, dtype)], ins, [y])
    assert [g.dtype for g in grads] == [dtype] * len(ins)
    assert_close(grads[0], G @ w64, rtol=0, atol=tol)
    assert_close(grads[1], G.T.astype(f64) @ x64, rtol=0, atol=wide_tol)
    if with_bias:
        assert_close(grads[2], G.sum(0, dtype=f64), rtol=0, atol=wide_tol)


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("half", sorted(HALF))
def test_gemv_in_half_precision(half, with_bias) -> None:
    """NNC's "cublas forward gemv in half precision, variant 1" (a row [1, 128] times
    wᵀ, with and without bias) and "... no bias, variant 2" (w [64, 128] times a column
    [128, 1], no transpose); mps twins."""
    dtype, tol, _ = HALF[half]
    row = X[:1]
    bias = [BIAS] if with_bias else []
    got = ops.gemm(transpose_b=True)(*(jnp.asarray(t, dtype) for t in (row, W, *bias)))
    want = row.astype(f64) @ W.T.astype(f64) + (BIAS if with_bias else 0)
    assert got.shape == (1, 64)
    assert_close(got, want, rtol=0, atol=tol)
    column = row.T.copy()
    got = ops.gemm()(jnp.asarray(W, dtype), jnp.asarray(column, dtype))
    assert got.shape == (64, 1)
    assert_close(got, W.astype(f64) @ column, rtol=0, atol=tol)


# -- cublas: palettized weights -----------------------------------------------------------

A = np.array([[1, 2], [3, 4], [5, 6], [7, 8]], f32)
B = np.array([[7, 8, 9], [10, 11, 12]], f32)


def _palettized(b: np.ndarray) -> np.ndarray:
    """``b`` through NNC's 4-bit palette in blocks of 128 (lossless: six values)."""
    blob = palettize(b, bits=4, block_size=128)
    return depalettize(blob, b.dtype, b.size, 4, 128).reshape(b.shape)


def test_gemm_with_bias_and_palettized_weights() -> None:
    """NNC's "gemm no transpose with bias and palettize weights": the palette of six
    distinct weights is exact, so the product is the hand-computed one."""
    bias = np.tile(np.array([1, -1, 1], f32), (4, 1))
    got = np.asarray(ops.gemm()(A, _palettized(B), bias))
    np.testing.assert_array_equal(got, A @ B + bias)
    assert got[0, 1] == 1 * 8 + 2 * 11 - 1 and got[3, 2] == 7 * 9 + 8 * 12 + 1


def test_backward_gemm_with_palettized_weights() -> None:
    """NNC's "backward gemm with no transpose and palettize weights": g [4, 3] = 1..12,
    a = 13..20, b = [[21, 22, 23], [24, 25, 26]] palettized; dbias is g's column sums."""
    g = np.arange(1, 13, dtype=f32).reshape(4, 3)
    a = np.arange(13, 21, dtype=f32).reshape(4, 2)
    b = _palettized(np.array([[21, 22, 23], [24, 25, 26]], f32))
    h, db, dbias = _bwd(ops.gemm(), [g], [a, b, np.zeros(3, f32)])
    np.testing.assert_array_equal(dbias, [22, 26, 30])
    np.testing.assert_array_equal(h, g @ b.T)
    np.testing.assert_array_equal(db, a.T @ g)
    assert np.asarray(h)[3, 1] == 10 * 24 + 11 * 25 + 12 * 26


# -- cublas / mps: generalized batched backward gemm through strided views ---------------

BATCH, ROWS, HEADS, IN, OUT = 2, 5, 3, 8, 6  # NNC's (2, 10, 4, 128) -> 64, shrunk


def _permuted_view(b: GraphBuilder, x, rows: int):
    """``x [BATCH, rows, HEADS, IN]`` read as ``[BATCH, HEADS, rows, IN]`` through strides."""
    stride = (rows * HEADS * IN, IN, HEADS * IN, 1)
    return b.alias(x, (BATCH, HEADS, rows, IN), stride=stride)


def _batched_gemm_graph(batched_w: bool, with_bias: bool):
    b = GraphBuilder()
    a = b.input((BATCH, ROWS, HEADS, IN), name="a")
    w = b.input((BATCH, OUT, HEADS, IN) if batched_w else (OUT, IN), name="w")
    bias = [b.input((OUT,), name="bias")] if with_bias else []
    g = b.input((BATCH, HEADS, ROWS, OUT), name="g")
    w_view = _permuted_view(b, w, OUT) if batched_w else w
    y = b.exec(ops.gemm(transpose_b=True), _permuted_view(b, a, ROWS), w_view, *bias)
    graph, _ = backward(b.build([y]), y, [a, w, *bias], df=[g])
    return graph


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("batched_w", [True, False], ids=["batched-w", "broadcast-w"])
def test_generalized_batched_backward_gemm_through_views(batched_w, with_bias) -> None:
    """NNC's four "generalized batched backward gemm with batch (2, 4)" cases (with /
    without bias, batched / broadcast weight; cublas and mps): a [2, 10, 4, 128] read as
    [2, 4, 10, 128] through strides, the gradients written back through the same views.
    The product and every gradient, interpreted and compiled, against ``jax.vjp`` of
    ``jnp.matmul`` on transposed copies (NNC's CPU side)."""
    graph = _batched_gemm_graph(batched_w, with_bias)
    a = _uniform((BATCH, ROWS, HEADS, IN), 1)
    w = _uniform((BATCH, OUT, HEADS, IN) if batched_w else (OUT, IN), 2, 1 / (OUT * IN))
    bias = [_uniform((OUT,), 3, 1 / OUT)] if with_bias else []
    g = _uniform((BATCH, HEADS, ROWS, OUT), 4)

    def plain(a, w, *bias):
        wt = jnp.swapaxes(w, 1, 2) if batched_w else w
        y = jnp.matmul(jnp.swapaxes(a, 1, 2), jnp.swapaxes(wt, -1, -2))
        return y + jnp.reshape(bias[0], (1, 1, 1, OUT)) if bias else y

    y, pullback = jax.vjp(plain, a, w, *bias)
    want = (y, *pullback(jnp.asarray(g)))
    for got in (interpret(graph, a, w, *bias, g), compile(graph)(a, w, *bias, g)):
        assert [np.shape(t) for t in got] == [np.shape(t) for t in want]
        assert_close(got, want, rtol=1e-5, atol=1e-5)


# -- mps: backward gemm without some of its gradients ------------------------------------


@pytest.mark.parametrize(
    "wanted",
    [("a", "w", "bias"), ("w", "bias"), ("a", "bias"), ("a", "w")],
    ids=["all", "no-h", "no-dw", "no-dbias"],
)
def test_backward_gemm_without_some_gradients(wanted) -> None:
    """NNC's "backward gemm large data set", "backward gemm no h", "backward gemm no dw"
    and "backward gemm no bias" (the dense layer [10, 128] x [64, 128] + [64]): the
    gradients asked for, and only those, through the graph backward pass."""
    b = GraphBuilder()
    syms = {
        "a": b.input((10, 128), name="a"),
        "w": b.input((64, 128), name="w"),
        "bias": b.input((64,), name="bias"),
    }
    g = b.input((10, 64), name="g")
    y = b.exec(ops.gemm(transpose_b=True), syms["a"], syms["w"], syms["bias"])
    graph, grads = backward(b.build([y]), y, [syms[k] for k in wanted], df=[g])
    assert len(grads) == len(wanted)
    x64, w64 = X.astype(f64), W.astype(f64)
    all_grads = {"a": G @ w64, "w": G.T.astype(f64) @ x64, "bias": G.sum(0, dtype=f64)}
    got = compile(graph)(X, W, BIAS, G)
    assert_close(got[0], x64 @ w64.T + BIAS, rtol=1e-5, atol=1e-5)
    assert_close(tuple(got[1:]), tuple(all_grads[k] for k in wanted), rtol=1e-5, atol=1e-5)


# -- mps: batched gemm with a per-batch bias, backward -----------------------------------


@pytest.mark.parametrize("transpose_b", [False, True], ids=["no-transpose", "transpose-b"])
def test_batched_backward_gemm_with_per_batch_bias_and_shared_b(transpose_b) -> None:
    """NNC's "gemm transpose b batch 2, with bias" uses a per-batch bias [2, 1, 3]; with
    b shared by both batches (mps's "gemm no transpose batch 2, no batch b") the bias
    gradient stays per batch while b's sums over it."""
    a = np.stack([A, A + 1])
    b = B.T.copy() if transpose_b else B
    bias = np.array([[[-1, 0, 1]], [[2, 3, -4]]], f32)
    cmd = ops.gemm(transpose_b=transpose_b)
    y = cmd(a, b, bias)
    np.testing.assert_array_equal(y, np.matmul(a, B) + bias)
    g = np.arange(24, dtype=f32).reshape(2, 4, 3)
    ha, hb, hbias = _bwd(cmd, [g], [a, b, bias], [y])
    np.testing.assert_array_equal(ha, g @ B.T)
    db = np.einsum("bmk,bmn->kn", a, g)
    np.testing.assert_array_equal(hb, db.T if transpose_b else db)
    np.testing.assert_array_equal(hbias, g.sum(1, keepdims=True))


# -- set, datatype conversion, masked fill ------------------------------------------------


@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
def test_set(dtype_name) -> None:
    """NNC's "compare set with mps": SET(10) fills [11, 10, 9, 8] (in any layout)."""
    dtype = DTYPES[dtype_name]
    got = ops.set(shape=(11, 10, 9, 8), dtype=dtype, value=10.0)()
    assert got.dtype == dtype and got.shape == (11, 10, 9, 8)
    assert np.all(_wide(got) == 10)


def test_datatype_conversion_float_to_half() -> None:
    """NNC's "data conversion from float to half precision": GPU and CPU agree within one
    unit of the 16-bit pattern (NNC's CPU truncates, ``float_to_half``); fnnc rounds to
    nearest, exactly NumPy's conversion."""
    x = _uniform(128, 9)
    got = np.asarray(ops.datatype_conversion(dtype="float16")(x))
    assert got.dtype == f16
    np.testing.assert_array_equal(got, x.astype(f16))
    nnc_cpu = float_to_half(x).view(np.int16).astype(np.int32)
    assert np.abs(got.view(np.int16).astype(np.int32) - nnc_cpu).max() <= 1


def test_datatype_conversion_double_to_half_and_to_float() -> None:
    """NNC's "data conversion from double to half precision", "... to float" and "...
    from double to half precision and to float" (without x64 a float64 array enters as
    float32, so half is rounded twice): the half within one unit of the 16-bit pattern
    of NumPy's direct conversion (NNC's tolerance), and back to float exactly."""
    x = np.random.default_rng(10).uniform(0.0, 1.0, 128)
    half = ops.datatype_conversion(dtype="float16")(x)
    back = np.asarray(ops.datatype_conversion(dtype="float32")(half))
    assert back.dtype == f32
    np.testing.assert_array_equal(back, np.asarray(half).astype(f32))
    np.testing.assert_allclose(back, x, rtol=2**-11, atol=0)
    units = np.abs(np.asarray(half).view(np.int16).astype(np.int32) - x.astype(f16).view(np.int16))
    assert units.max() <= 1
    np.testing.assert_array_equal(ops.datatype_conversion(dtype="float32")(x), x.astype(f32))


@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
@pytest.mark.parametrize("mask_dtype", [np.int32, f32], ids=["integer", "float"])
def test_masked_fill_forward_and_backward(mask_dtype, dtype_name) -> None:
    """NNC's "masked fill forward with integer" / "... with float" and "masked fill
    backward with integer" / "... with float": x [6, 5, 4], a mask [5, 4] of 1, 0, 1, ...,
    MASKED_FILL(0, -1e8): the fill where the mask is 0, and no gradient there (float16
    fills -1e4: -1e8 is -inf there, the test below)."""
    dtype = DTYPES[dtype_name]
    fill = -1e4 if dtype == f16 else -1e8
    x = jnp.asarray(_uniform((6, 5, 4), 11), dtype)
    mask = (np.arange(20) % 2 == 0).astype(mask_dtype).reshape(5, 4)
    cmd = ops.masked_fill(eq=0, fill=fill)
    y = cmd(x, mask)
    assert y.dtype == dtype
    hit = np.broadcast_to(mask == 0, x.shape)
    np.testing.assert_array_equal(_wide(y), np.where(hit, _wide(np.asarray(fill, dtype)), _wide(x)))
    g = jnp.asarray(_uniform((6, 5, 4), 12), dtype)
    dx, dmask = _bwd(cmd, [g], [x, mask])
    assert dmask is None
    np.testing.assert_array_equal(_wide(dx), np.where(hit, 0, _wide(g)))


def test_masked_fill_with_nnc_s_fill_in_float16() -> None:
    """NNC's "masked fill forward with integer" fill, -1e8, on a float16 tensor: the
    float fill cast to half is -inf, which fnnc writes, as C converts, with no warning."""
    x = np.ones((5, 4), f16)
    mask = (np.arange(20) % 2 == 0).astype(np.int32).reshape(5, 4)
    got = np.asarray(ops.masked_fill(eq=0, fill=-1e8)(x, mask))
    np.testing.assert_array_equal(got, np.where(mask == 0, -np.inf, 1).astype(f16))
