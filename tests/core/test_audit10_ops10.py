"""Audit 10 (ops10): NumPy float scalars as hyper-parameters."""

import numpy as np

from fnnc import ops


def test_numpy_float_hyper_parameters_are_the_python_floats_they_equal():
    # np.float32(2) against upsample's tuple default compared as an array, so printing
    # the command (which every eager call does) raised "truth value ... is ambiguous".
    x = np.arange(4, dtype=np.float32).reshape(1, 2, 2, 1)
    cmd = ops.upsample(scale=np.float32(2))
    assert cmd == ops.upsample(scale=2.0) and hash(cmd) == hash(ops.upsample(scale=2.0))
    assert str(cmd) == "upsample[scale=2.0]"
    np.testing.assert_array_equal(np.asarray(cmd(x)), np.repeat(np.repeat(x, 2, 1), 2, 2))
    a = ops.scalar_mul(a=np.float32(0.1)).param("a")
    assert type(a) is float and a == float(np.float32(0.1))  # the value given, exactly
    assert str(ops.scalar_mul(a=np.float32("nan"))) == "scalar_mul[a=nan]"
    assert ops.scalar_mul(a=np.float16(-0.0)) == ops.scalar_mul(a=-0.0)
    assert ops.scalar_mul(a=np.float16(-0.0)) != ops.scalar_mul(a=0.0)
