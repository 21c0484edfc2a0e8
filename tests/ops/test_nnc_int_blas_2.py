"""NNC's ``test/int/nnc/cublas.tests.c`` and ``mpsblas.tests.c``, continued from
``test_nnc_int_blas.py``: ewdiv, ewexp, ewlog, ewsqrt, clamp, ADD / MUL / SCALAR_MUL
scalars in half precision, scaled dot-product attention in float16 and cmul.

Each C case runs a command on the GPU (often in 16F) and compares it with NNC's float32
CPU reference. Here the oracle is NumPy in float64 (attention's gradients are written
out by hand in NumPy), at NNC's tolerance where the C test runs in half precision, and
fnnc's float16 / bfloat16 results are also checked where NNC's GPU kernels take them.
NNC's backward inputs keep its order (``g``, the forward inputs, the forward outputs);
where the C test leaves a forward tensor out (``TENSOR_LIST(g, 0, b)``) the port passes
``None`` for it too, so the backward is shown not to read it.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, compile
from tests.helpers import assert_close

f16, f32, f64 = np.float16, np.float32, np.float64
bf16 = ml_dtypes.bfloat16
DTYPES = {"float32": (f32, 1e-6), "float16": (f16, 1e-3), "bfloat16": (bf16, 8e-3)}
"""dtype -> (dtype, relative tolerance of one correctly rounded elementwise result)."""


def _bwd(cmd, grads, inputs, outputs=None):
    """The command's backward in NNC's convention: gradients of the inputs."""
    outputs = (None,) * len(grads) if outputs is None else outputs
    return cmd.definition.backward(tuple(grads), tuple(inputs), tuple(outputs), **cmd.kwargs)


def _uniform(shape, seed, scale=1.0, shift=0.0):
    """NNC's ``dsfmt_genrand_open_close() * scale + shift`` draws."""
    return (np.random.default_rng(seed).uniform(0.0, 1.0, shape) * scale + shift).astype(f32)


def _wide(x) -> np.ndarray:
    return np.asarray(x).astype(f64)


# -- ewdiv, ewexp, ewlog, ewsqrt ---------------------------------------------------------


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_ewdiv_forward_and_backward(name) -> None:
    """NNC's "ewdiv forward with reciprocal" (a nil numerator: fnnc's spelling is a
    tensor of ones), "ewdiv forward", "ewdiv backward with output 1" (da = g / b) and
    "... with output 2" (db = -g c / b): a, b in (0, 0.01], g in (0, 1]. NNC's backward
    reads c, not a; fnnc's reads a (its ``uses``), the same numbers."""
    dtype, rtol = DTYPES[name]
    # NNC's draws in float32; 16-bit quotients of (0, 0.01] overflow, so (0.5, 1.5] there.
    scale, shift = (0.01, 0.0) if dtype == f32 else (1.0, 0.5)
    a, b = (jnp.asarray(_uniform(1000, i, scale, shift), dtype) for i in (1, 2))
    g = jnp.asarray(_uniform(1000, 3), dtype)
    a64, b64, g64 = _wide(a), _wide(b), _wide(g)
    assert_close(ops.ewdiv()(jnp.ones_like(b), b), 1 / b64, rtol=rtol, atol=0)
    cmd = ops.ewdiv()
    c = cmd(a, b)
    assert c.dtype == dtype
    assert_close(c, a64 / b64, rtol=rtol, atol=0)
    da, db = _bwd(cmd, [g], [a, b], [c])
    assert_close(da, g64 / b64, rtol=2 * rtol, atol=0)
    assert_close(db, -g64 * (a64 / b64) / b64, rtol=4 * rtol, atol=0)


UNARY = {
    # name: (command, forward, derivative from (x, y), NNC's draw (scale, shift), uses x)
    "ewexp": (ops.ewexp(), np.exp, lambda x, y: y, (10, -1), False),
    "ewlog": (ops.ewlog(), np.log, lambda x, y: 1 / x, (10, 1e-4), True),
    "ewsqrt": (ops.ewsqrt(), np.sqrt, lambda x, y: 0.5 / y, (10, 1e-4), False),
}


@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_forward_and_backward(op, dtype_name) -> None:
    """NNC's "exp forward" / "ewexp backward" (backward from the output alone:
    ``TENSOR_LIST(g, 0, b)``), "ewlog forward" / "ewlog backward" (from the input) and
    "ewsqrt forward" / "ewsqrt backward" (from the output), on NNC's ranges: exp of
    (-1, 9], log and sqrt of (1e-4, 10]."""
    cmd, fn, derivative, (scale, shift), uses_x = UNARY[op]
    dtype, rtol = DTYPES[dtype_name]
    x = jnp.asarray(_uniform(1000, 5, scale, shift), dtype)
    g = jnp.asarray(_uniform(1000, 6), dtype)
    y = cmd(x)
    assert y.dtype == dtype
    x64 = _wide(x)
    assert_close(y, fn(x64), rtol=rtol, atol=0)
    (dx,) = _bwd(cmd, [g], [x if uses_x else None], [None if uses_x else y])
    want = _wide(g) * derivative(x64, _wide(y))  # the backward's own y, as NNC's
    assert_close(dx, want, rtol=2 * rtol, atol=0)


# -- clamp ---------------------------------------------------------------------------------

CLAMPS = {
    # NNC's (min, max) with NAN for "no bound": fnnc's spelling of NAN is None.
    "clamp": (0.0, 6.0),
    "only max": (None, 6.0),
    "only min": (0.0, None),
}


@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
@pytest.mark.parametrize("case", sorted(CLAMPS))
def test_clamp_forward_and_backward(case, dtype_name) -> None:
    """NNC's "clamp forward" / "clamp backward", "... with only max" and "... with only
    min": x in (-1, 9] (forward; NNC's backward draws (0, 10]), the gradient passes where
    the output is strictly inside the bounds (``ccv_nnc_ew_cpu_ref.c``)."""
    lo, hi = CLAMPS[case]
    dtype, _ = DTYPES[dtype_name]
    x = _uniform(1000, 7, 10, -1).astype(dtype)
    x = jnp.asarray(x[(x != 0) & (x != 6)])  # ties at a bound: the bound test below
    g = jnp.asarray(_uniform(x.shape, 8), dtype)
    cmd = ops.clamp(min=lo, max=hi)
    y = cmd(x)
    x64 = _wide(x)
    np.testing.assert_array_equal(_wide(y), np.clip(x64, lo, hi))
    (dx,) = _bwd(cmd, [g], [x], [y])
    inside = (lo is None or x64 > lo) & (hi is None or x64 < hi)
    np.testing.assert_array_equal(_wide(dx), np.where(inside, _wide(g), 0))


def test_clamp_backward_at_the_bounds_is_zero() -> None:
    """NNC's "clamp backward" rule at a tie: ``h = (b >= max || b <= min) ? 0 : g``, so an
    input exactly at a bound (a ReLU6 input of 0 or 6) gets no gradient."""
    x = np.array([-1, 0, 3, 6, 7], f32)
    cmd = ops.clamp(min=0.0, max=6.0)
    (dx,) = _bwd(cmd, [np.ones(5, f32)], [x], [cmd(x)])
    np.testing.assert_array_equal(dx, [0, 0, 1, 0, 0])


def test_clamp_with_a_nan_bound_is_unbounded_or_rejected() -> None:
    """NNC's "clamp forward with only max" spells the missing bound ``NAN``. fnnc spells
    it ``None``; a NaN bound must not turn every output into NaN silently."""
    x = np.array([-1, 3, 7], f32)
    try:
        got = ops.clamp(min=float("nan"), max=6.0)(x)
    except (TypeError, ValueError):
        return
    np.testing.assert_array_equal(got, [-1, 3, 6])


# -- ADD / MUL / SCALAR_MUL scalars in half precision ------------------------------------


def _rounded_once(value: np.ndarray, dtype) -> np.ndarray:
    """NNC's 16-bit ADD / MUL (cudnnOpTensor, CUDNN_DATA_FLOAT): float math, one rounding."""
    return value.astype(f32).astype(dtype).astype(f64)


SCALARS = {
    # name: (command, its inputs from (x, y), the float64 result with float32 scalars)
    "add": (ops.add(p=1.0, q=-0.99), lambda x, y: (x, x), lambda x, y: x - f64(f32(0.99)) * x),
    "mul": (ops.mul(p=0.3), lambda x, y: (x, y), lambda x, y: f64(f32(0.3)) * x * y),
    "scalar_mul": (ops.scalar_mul(a=0.3), lambda x, y: (x,), lambda x, y: f64(f32(0.3)) * x),
}


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", sorted(SCALARS))
def test_blas_scalars_keep_float_precision_in_half_precision(op, half) -> None:
    """NNC's ADD(p, q), MUL(p) and SCALAR_MUL(a) on 16-bit tensors (cudnnOpTensor with
    float scalars and CUDNN_DATA_FLOAT math): the result is the float one rounded once.
    x = 1..64, y = 1..7 repeated (exact in both 16-bit types)."""
    dtype = DTYPES[half][0]
    cmd, inputs, want = SCALARS[op]
    x, y = np.arange(1, 65).astype(dtype), (np.arange(64) % 7 + 1).astype(dtype)
    got = cmd(*inputs(x, y))
    np.testing.assert_array_equal(_wide(got), _rounded_once(want(_wide(x), _wide(y)), dtype))


# -- scaled dot-product attention in float16 ---------------------------------------------

ATTENTION = [
    # NNC's (B, R, C, Hq, Hk, D, is_causal) trials, shrunk: R > C causal (the first R - C
    # queries see no key), R > C, R < C causal, R == C, grouped heads 4:1 and 4:2.
    (2, 10, 8, 2, 2, 64, True),
    (2, 12, 8, 2, 2, 40, False),
    (1, 7, 16, 2, 2, 56, True),
    (1, 7, 16, 4, 1, 56, False),
    (1, 5, 5, 4, 2, 32, True),
]


def _attention64(q, k, v, go, scale, causal):
    """NNC's CPU reference in float64: output and the gradients of q, k, v."""
    q, k, v, go = (np.asarray(t, f64) for t in (q, k, v, go))
    b, r, h, _ = q.shape
    c, hk = k.shape[1], k.shape[2]
    kk, vv = np.repeat(k, h // hk, axis=2), np.repeat(v, h // hk, axis=2)
    logits = np.einsum("bshd,bthd->bhst", q, kk) * scale
    if causal:  # bottom-right aligned: query i sees keys j <= i + C - R
        logits = np.where(np.arange(c) <= np.arange(r)[:, None] + c - r, logits, -np.inf)
    top = logits.max(-1, keepdims=True)
    e = np.exp(logits - np.where(np.isfinite(top), top, 0))
    total = e.sum(-1, keepdims=True)
    p = e / np.where(total == 0, 1, total)  # a query that sees no key gives zeros
    o = np.einsum("bhst,bthd->bshd", p, vv)
    dp = np.einsum("bshd,bthd->bhst", go, vv)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True))
    fold = lambda t: t.reshape(b, c, hk, h // hk, -1).sum(3)
    dq = np.einsum("bhst,bthd->bshd", ds, kk) * scale
    dk = fold(np.einsum("bhst,bshd->bthd", ds, q) * scale)
    dv = fold(np.einsum("bhst,bshd->bthd", p, go))
    return o, dq, dk, dv


def _ramp(*shape) -> np.ndarray:
    n = int(np.prod(shape))
    return (np.arange(n, dtype=f32) / n).reshape(shape)


@pytest.mark.parametrize("dtype_name", ["float32", "float16"])
@pytest.mark.parametrize("trial", ATTENTION, ids=lambda t: "-".join(map(str, t)))
def test_attention_forward_in_half_precision(trial, dtype_name) -> None:
    """NNC's "scaled dot product attention with flash_attn" (and its mps twin): q, k, v
    ramps i / n, scale 1 / sqrt(D); float16 within NNC's 3e-3 of float64."""
    batch, r, c, hq, hk, d, causal = trial
    q, k, v = _ramp(batch, r, hq, d), _ramp(batch, c, hk, d), _ramp(batch, c, hk, d)
    scale = float(1 / np.sqrt(d))
    dtype = DTYPES[dtype_name][0]
    cmd = ops.scaled_dot_product_attention(scale=scale, is_causal=causal)
    o = cmd(*(jnp.asarray(t, dtype) for t in (q, k, v)))
    assert o.dtype == dtype
    want, *_ = _attention64(q, k, v, np.zeros_like(q), scale, causal)
    assert_close(o, want, rtol=0, atol=3e-3 if dtype == f16 else 1e-6)


@functools.cache  # the float16 dk / dv and dq tests share one computation
def _attention_gradients(trial, dtype):
    batch, r, c, hq, hk, d, causal = trial
    q, k, v, go = (
        _uniform(shape, seed)
        for seed, shape in enumerate(
            [(batch, r, hq, d), (batch, c, hk, d), (batch, c, hk, d), (batch, r, hq, d)]
        )
    )
    scale = float(1 / np.sqrt(d))
    cmd = ops.scaled_dot_product_attention(scale=scale, is_causal=causal)
    ins = [jnp.asarray(t, dtype) for t in (q, k, v)]
    got = _bwd(cmd, [jnp.asarray(go, dtype)], ins, [cmd(*ins)])
    return got, _attention64(q, k, v, go, scale, causal)[1:]


@pytest.mark.parametrize("trial", ATTENTION, ids=lambda t: "-".join(map(str, t)))
def test_attention_gradient_in_float32(trial) -> None:
    """NNC's "scaled dot product attention gradient with flash_attn": the CPU side, dq,
    dk, dv against float64 (fully masked queries of R > C causal get zeros)."""
    got, want = _attention_gradients(trial, f32)
    assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("trial", ATTENTION, ids=lambda t: "-".join(map(str, t)))
def test_attention_key_and_value_gradients_in_half_precision(trial) -> None:
    """NNC's "scaled dot product attention gradient with flash_attn" in 16F (mps twin):
    dk and dv within NNC's 3e-3 and 6e-3 of the float reference."""
    (_, dk, dv), (_, wk, wv) = _attention_gradients(trial, f16)
    assert dk.dtype == dv.dtype == f16
    assert_close(dk, wk, rtol=0, atol=3e-3)
    assert_close(dv, wv, rtol=0, atol=6e-3)


@pytest.mark.parametrize(
    "trial",
    ATTENTION,
    ids=lambda t: "-".join(map(str, t)),
)
def test_attention_query_gradient_in_half_precision(trial) -> None:
    """NNC's "scaled dot product attention gradient with flash_attn" in 16F: dq within
    NNC's 1e-3 of the float reference (flash attention keeps float32 accumulators)."""
    (dq, _, _), (wq, _, _) = _attention_gradients(trial, f16)
    assert dq.dtype == f16
    assert_close(dq, wq, rtol=0, atol=1e-3)


# -- cmul ----------------------------------------------------------------------------------


def _complex(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x).astype(f64)
    return x[..., 0::2] + 1j * x[..., 1::2]


def _pairs(z: np.ndarray) -> np.ndarray:
    return np.stack([z.real, z.imag], -1).reshape(*z.shape[:-1], -1)


CMUL = {
    # NNC's shapes of a and b: [20, 10] each, and the broadcast [1, 5, 8, 128] x
    # [1, 5, 1, 128] (last axis shrunk to 16).
    "same shape": ((20, 10), (20, 10)),
    "broadcast": ((1, 5, 8, 16), (1, 5, 1, 16)),
}


@pytest.mark.parametrize("dtype_name", ["float32", "float16"])
@pytest.mark.parametrize("case", sorted(CMUL))
def test_cmul_through_a_compiled_graph(case, dtype_name) -> None:
    """NNC's "cmul in float", "cmul in half precision" and "cmul in float, broadcast
    semantics" (a symbolic graph compiled and run) and "cmul gradient in float" / "... in
    half precision": the gradients multiply by the conjugate of the other operand, as
    NNC's backward does; b's sums over its broadcast axis."""
    a_shape, b_shape = CMUL[case]
    dtype = DTYPES[dtype_name][0]
    a, b, g = (
        jnp.asarray(_uniform(s, i), dtype) for i, s in enumerate([a_shape, b_shape, a_shape])
    )
    builder = GraphBuilder()
    xa, xb = builder.input(a_shape, dtype), builder.input(b_shape, dtype)
    y = builder.exec(ops.cmul(), xa, xb)
    got = compile(builder.build([y]))(a, b)
    za, zb, zg = _complex(a), _complex(b), _complex(g)
    tol = 2e-3 if dtype == f16 else 1e-6  # NNC's 2e-3 in half precision
    assert_close(got, _pairs(za * zb), rtol=0, atol=tol)
    da, db = _bwd(ops.cmul(), [g], [a, b])
    assert_close(da, _pairs(zg * np.conj(zb)), rtol=0, atol=tol)
    want_db = (zg * np.conj(za)).sum(
        axis=tuple(i for i, n in enumerate(b_shape) if n == 1 and a_shape[i] != 1), keepdims=True
    )
    assert_close(db, _pairs(want_db), rtol=0, atol=4 * tol)
