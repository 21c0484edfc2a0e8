"""Audit 9 of the cnnp layers: each fix checked against an independent oracle (float64
NumPy, closed forms, NNC's layouts)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from fnnc.models import BatchNorm, Input, Model

BF16 = ml_dtypes.bfloat16


def test_batch_norm_beside_bfloat16_keeps_float32_statistics_that_move():
    """NNC's ccv_cnnp_batch_norm makes scale, bias, mean and var float32 beside a 16-bit
    input. Kept in bfloat16, a running mean of 2.1875 with momentum 0.99 never moved
    toward a batch mean near 3 (the update, 0.0077, is under half its spacing)."""
    x = Input()
    model = Model([x], [BatchNorm(momentum=0.99, name="bn")(x)])
    data = (np.random.default_rng(0).standard_normal((16, 2)) + 3.0).astype(BF16)
    model.compile([data])
    assert {k: v.dtype for k, v in model.parameters().items()} == dict.fromkeys(
        ["t-bn-0-0", "t-bn-0-1", "r-bn-0-0", "r-bn-0-1"], np.dtype(np.float32)
    )
    old_mean, old_var = np.float32([2.1875, 2.1875]), np.float32([1.0, 1.0])
    model.set_parameters({"r-bn-0-0": old_mean, "r-bn-0-1": old_var})
    y = model.evaluate([data], is_test=False)
    x64 = data.astype(np.float64)
    mu, var = x64.mean(0), x64.var(0)  # biased, as NNC's
    got = model.parameters()
    np.testing.assert_allclose(got["r-bn-0-0"], 0.99 * old_mean + 0.01 * mu, rtol=1e-6)
    np.testing.assert_allclose(got["r-bn-0-1"], 0.99 * old_var + 0.01 * var, rtol=1e-6)
    y = np.asarray(y)
    assert y.dtype == BF16  # the output keeps the input's type, rounded once
    want = (x64 - mu) / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=2**-8, atol=2**-8)
