"""Pallas gemm (tiled product + bias epilogue) against the reference, in interpret mode."""

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.ops.pallas import gemm as kernel
from tests.helpers import rand
from tests.ops.pallas.checks import check_forced_eager, check_kernel, check_unsupported

CASES = [
    ((33, 65), (65, 47), False, False, (47,)),  # ragged M, N and K
    ((2, 16, 32), (64, 32), False, True, (1, 64)),  # a dense layer on [B, S, in]
    ((48, 32), (48, 16), True, False, ()),
    ((65, 33), (47, 65), True, True, None),  # ragged, transposed
    ((32, 48), (16, 48), False, True, (32, 1)),  # a column bias
]


@pytest.mark.parametrize(("a", "b", "ta", "tb", "bias"), CASES)
def test_matches_reference(monkeypatch, a, b, ta, tb, bias):
    monkeypatch.setattr(kernel, "BLOCK_M", 16)  # several output tiles and K steps
    monkeypatch.setattr(kernel, "BLOCK_K", 16)
    args = [rand(a, seed=1), rand(b, seed=2)] + ([] if bias is None else [rand(bias, seed=3)])
    cmd = ops.gemm(transpose_a=ta, transpose_b=tb)
    check_kernel(kernel, cmd, args, diff=list(range(len(args))))


def test_forced_eager_call():
    check_forced_eager(ops.gemm(transpose_b=True), [rand((16, 32)), rand((16, 32), seed=1)])


@pytest.mark.parametrize(
    ("a", "b", "reason"),
    [
        ((2, 16, 32), (2, 32, 16), "needs a rank-2 b"),
    ],
)
def test_unaligned_falls_back_or_explains(a, b, reason):
    check_unsupported(ops.gemm(), [rand(a), rand(b, seed=1)], reason)


def test_wrong_dtype_is_declined():
    spec = jax.ShapeDtypeStruct((16, 16), np.float64)
    assert "float64" in kernel.supports(ops.gemm(), [spec, spec])
