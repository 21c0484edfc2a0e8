"""NNC passes its commands' flags as ints (``CMD_SCALED_DOT_PRODUCT_ATTENTION_FORWARD(scale,
1)``, ``CMD_GEMM_FORWARD(NO_TRANSPOSE, TRANSPOSE(0, 1))``): a bool hyper-parameter takes
``0`` / ``1`` as the bool it means, as the layers' flags do; other ints stay refused."""

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError


def test_a_bool_hyper_parameter_takes_nncs_int_flags():
    for one in (1, np.int32(1)):
        cmd = ops.scaled_dot_product_attention(is_causal=one)
        assert cmd == ops.scaled_dot_product_attention(is_causal=True)
        assert cmd.kwargs["is_causal"] is True and str(cmd) == str(
            ops.scaled_dot_product_attention(is_causal=True)
        )
    assert ops.gemm(transpose_b=0) == ops.gemm()
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((4, 3), np.float32)
    np.testing.assert_allclose(ops.gemm(transpose_b=1)(a, b), a @ b.T)  # NumPy
    for bad in (2, -1, 1.0, "1"):
        with pytest.raises(CommandError, match=r"'transpose_b' is .*expected a bool"):
            ops.gemm(transpose_b=bad)
