"""NNC's integration tests of the reductions (liuliu/ccv ``test/int/nnc/reduce.tests.c``):
"reduce sum forward", "reduce mean forward", "reduce max forward", "reduce min forward",
"reduce norm2 forward" and "reduce isnan float".

Each C test reduces ``[[1, 2, 3], [4, 5, 6]]`` over axis 0 once with the CPU reference
kernel and once on the GPU (cuDNN or Metal), both written into a ``[3]`` tensor, and
requires the two to be equal. On fnnc both sides are XLA, so the oracle here is the CPU
kernel's result itself (NNC's literal numbers, float64 NumPy for norm2), checked for the
eager command and for a compiled graph whose output is a ``[3]`` tensor as in the C test
(NNC's reduce writes into an output of the reduced element count; fnnc's command keeps
the reduced axis as size 1). The noop, backward, argmin / argmax and half-precision isnan
cases are in ``test_nnc_int_misc_2.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, compile
from tests.helpers import assert_close

A = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
# NNC's CPU kernels (ccv_nnc_reduce_*_cpu_ref.c) over axis 0 of A, in float64
FORWARD = {
    "reduce sum forward": ("reduce_sum", [5.0, 7.0, 9.0]),
    "reduce mean forward": ("reduce_mean", [2.5, 3.5, 4.5]),
    "reduce max forward": ("reduce_max", [4.0, 5.0, 6.0]),
    "reduce min forward": ("reduce_min", [1.0, 2.0, 3.0]),
    "reduce norm2 forward": ("reduce_norm2", np.sqrt([1 + 16, 4 + 25, 9 + 36])),
}


def _into_vector(cmd, x: np.ndarray, dtype=np.float32) -> np.ndarray:
    """``cmd`` of ``x`` in a compiled graph whose output is a ``[3]`` tensor."""
    b = GraphBuilder()
    a = b.input(x.shape, dtype=x.dtype, name="a")
    out = b.tensor((3,), dtype=dtype, name="b")
    b.exec(cmd, a, outputs=[out])
    return np.asarray(compile(b.build([out]))(x))


@pytest.mark.parametrize("case", list(FORWARD))
def test_reduce_forward_on_axis_0_into_a_vector(case):
    """NNC: "reduce sum forward", "reduce mean forward", "reduce max forward", "reduce min
    forward" and "reduce norm2 forward": CMD_REDUCE_*_FORWARD(0) of [[1, 2, 3], [4, 5,
    6]] into a [3] tensor equals the CPU kernel's result, eagerly and compiled."""
    name, want = FORWARD[case]
    want = np.asarray(want, np.float64)
    cmd = getattr(ops, name)(axes=(0,))
    eager = cmd(A)
    assert eager.shape == (1, 3) and eager.dtype == np.float32
    assert_close(eager, want.reshape(1, 3), rtol=1e-6, atol=0, what=case)
    got = _into_vector(cmd, A)
    assert got.shape == (3,)
    assert_close(got, want, rtol=1e-6, atol=0, what=f"{case}, compiled into [3]")


def test_reduce_isnan_float_on_axis_0_into_a_vector():
    """NNC: "reduce isnan float": CMD_REDUCE_ISNAN_FORWARD(0) of [[NaN, 2, 3], [4, 5, 6]]
    into an int32 [3] tensor is [1, 0, 0]."""
    x = A.copy()
    x[0, 0] = np.nan
    cmd = ops.reduce_isnan(axes=(0,))
    np.testing.assert_array_equal(np.asarray(cmd(x)), [[1, 0, 0]])
    got = _into_vector(cmd, x, dtype=np.int32)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [1, 0, 0])
