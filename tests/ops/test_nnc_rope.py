"""NNC's ``rotate_half.tests.c`` and ``complex.tests.c`` (cmul), translated."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fnnc import ops
from tests.helpers import assert_close, rand


def test_rotate_half_of_a_tensor():
    a = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.float32)
    np.testing.assert_array_equal(ops.rotate_half()(a), [[3, 4, 1, 2], [7, 8, 5, 6]])


def test_rotate_half_backward_of_a_tensor():
    g = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.float32)
    cmd = ops.rotate_half()
    (h,) = cmd.definition.backward((g,), (None,), (None,))
    np.testing.assert_array_equal(h, [[3, 4, 1, 2], [7, 8, 5, 6]])


def test_rotate_half_of_a_tensor_view():
    """NNC rotates a [2, 4] view at column 1 of a [2, 6] tensor and writes it into the
    same view of a zero tensor."""
    a = np.arange(1, 13, dtype=np.float32).reshape(2, 6)
    b = np.zeros((2, 6), np.float32)
    b[:, 1:5] = ops.rotate_half()(a[:, 1:5])
    np.testing.assert_array_equal(b, [[0, 4, 5, 2, 3, 0], [0, 10, 11, 8, 9, 0]])


def _as_gemm(y):
    """NNC's test writes each complex y = (re, im) as the 2x2 matrix [[re, -im], [im, re]]."""
    re, im = y[0::2], y[1::2]
    return jnp.stack([jnp.stack([re, -im], -1), jnp.stack([im, re], -1)], -2)  # [5, 2, 2]


def _gemm_product(x, y):
    gemm = ops.gemm(transpose_b=True)
    return gemm(jnp.reshape(x, (5, 1, 2)), _as_gemm(y)).reshape(10)


def test_cmul_matches_gemm():
    x, y = rand([10], lo=0, hi=1, seed=1), rand([10], lo=0, hi=1, seed=2)
    assert_close(ops.cmul()(x, y), _gemm_product(x, y), atol=1e-5)


def test_cmul_gradient_matches_gemm():
    """The test's title; NNC compares only the products there. Here the gradient of x
    through cmul's backward equals the one through gemm's (a product by conj(y))."""
    x, y = rand([10], lo=0, hi=1, seed=1), rand([10], lo=0, hi=1, seed=2)
    g = rand([10], seed=3)
    cmd = ops.cmul()
    gx, _ = cmd.definition.backward((g,), (x, y), (None,))
    _, pullback = jax.vjp(lambda x: _gemm_product(x, y), jnp.asarray(x))
    assert_close(gx, pullback(jnp.asarray(g))[0], atol=1e-5)
