"""Audit 8 (mixed precision, dtypes): ewabs of unsigned integers and bool is NumPy's
identity (JAX's abs refuses them; the shape rule had let them through to a run-time
failure), oracle NumPy's ``abs``; linear_softmax_crossentropy's 16-bit logits round
where its docstring says, oracle NumPy's float64 loss of the rounded logits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, compile, interpret

DTYPES = [np.uint8, np.uint16, np.uint32, np.bool_, np.int8, np.int32, np.float16]


def _values(dtype):
    if dtype == np.bool_:
        return np.array([True, False, True])
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else None
    low = info.min if info is not None else -3.5
    high = info.max if info is not None else 2.0
    return np.array([low, 0, high], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_ewabs_matches_numpy_for_every_integer_kind(dtype):
    x = _values(dtype)
    want = np.abs(x)  # uint and bool: x itself; int8's -128 stays -128, as in NumPy
    b = GraphBuilder()
    s = b.input(x.shape, dtype)
    graph = b.build([b.exec(ops.ewabs(), s)])
    for got in (ops.ewabs()(x), interpret(graph, x), compile(graph)(x)):
        got = np.asarray(got)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_ewabs_of_bfloat16_still_drops_the_sign():
    x = np.array([-1.5, 0.0, 2.0], ml_dtypes.bfloat16)
    got = np.asarray(ops.ewabs()(x))
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got.astype(np.float32), [1.5, 0.0, 2.0])


# --- linear_softmax_crossentropy: which 16-bit roundings of the logits happen -------------


def _lsce_case(dtype):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 16)).astype(dtype)
    w = rng.normal(size=(8, 16)).astype(dtype)
    b = rng.normal(size=(8,)).astype(dtype)
    return x, w, b, np.array([1, 2, 3, 0], np.int32)


def _lsce_oracle(x, w, b, label, dtype, round_product, round_sum):
    """NumPy float64 loss of logits ``x wᵀ (+ b)`` with the named 16-bit roundings."""
    rnd = lambda a: np.asarray(a, np.float32).astype(dtype).astype(np.float64)
    z = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    z = rnd(z) if round_product else z
    if b is not None:
        z = z + np.asarray(b, np.float64)
        z = rnd(z) if round_sum else z
    top = z.max(axis=1, keepdims=True)
    return top[:, 0] + np.log(np.exp(z - top).sum(axis=1)) - z[np.arange(len(label)), label]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="pins XLA:CPU's roundings")
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=["bfloat16", "float16"])
def test_linear_crossentropy_logits_round_as_its_docstring_says_on_cpu(dtype, with_bias):
    """The docstring of ``_block_logits``: XLA:CPU drops bfloat16's round trips (no bias:
    the product unrounded; a bias: the product rounded, the sum not), eagerly and under
    jit, and keeps float16's. The candidate oracles differ by ~1e-2 here."""
    x, w, b, label = _lsce_case(dtype)
    b = b if with_bias else None
    bf16 = dtype == ml_dtypes.bfloat16
    want = _lsce_oracle(
        x, w, b, label, dtype, round_product=not bf16 or with_bias, round_sum=not bf16
    )
    cmd = ops.linear_softmax_crossentropy()
    args = (x, w, label) if b is None else (x, w, label, b)
    for loss in (cmd(*args)[0], jax.jit(lambda *a: cmd(*a)[0])(*args)):
        np.testing.assert_allclose(np.asarray(loss)[:, 0], want, rtol=0, atol=3e-6)


def test_without_excess_precision_every_16_bit_rounding_is_kept():
    """``XLA_FLAGS=--xla_allow_excess_precision=false``, as the docstring says, keeps
    both roundings of a bfloat16 block (product, then the sum with the bias): checked in
    a fresh process, as XLA reads its flags once."""
    code = textwrap.dedent(
        """
        import ml_dtypes, numpy as np
        from fnnc import ops
        from tests.ops.test_audit8_prec8 import _lsce_case, _lsce_oracle
        x, w, b, label = _lsce_case(ml_dtypes.bfloat16)
        loss = np.asarray(ops.linear_softmax_crossentropy()(x, w, label, b)[0])[:, 0]
        want = _lsce_oracle(x, w, b, label, ml_dtypes.bfloat16, True, True)
        print(float(np.abs(loss - want).max()))
        """
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "XLA_FLAGS": "--xla_allow_excess_precision=false", "JAX_PLATFORMS": "cpu"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip().splitlines()[-1]) < 3e-6
