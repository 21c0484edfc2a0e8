"""NNC's ``test/unit/nnc/sol_attention.tests.c``, translated (the CPU cases; NNC's
optional fourth "dense" input is not part of fnnc's command: dense attention is
``scaled_dot_product_attention``)."""

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import ShapeError


def test_cpu_sol_all_exact_matches_dense_attention_and_infers_output_shape():
    n, t, h, d = 2, 137, 2, 16
    rng = np.random.default_rng(42)
    q, k, v = (rng.uniform(-1, 1, size=(n, t, h, d)).astype(np.float32) for _ in range(3))
    cmd = ops.sol_attention(scale=0.25, tau=0.5, block_size=32)
    spec = jax.ShapeDtypeStruct(q.shape, np.float32)
    assert cmd.shape(spec, spec, spec)[0].shape == q.shape
    dense = ops.scaled_dot_product_attention(scale=0.25)(q, k, v)
    np.testing.assert_allclose(cmd(q, k, v), dense, atol=1e-5)
    with pytest.raises(ShapeError, match="approximation_end"):
        ops.sol_attention(block_size=32, approximation_end=t + 1).shape(spec, spec, spec)
    with pytest.raises(ShapeError, match="local_block_radius"):
        ops.sol_attention(block_size=32, approximation_end=t, local_block_radius=0).shape(
            spec, spec, spec
        )


def test_cpu_sol_summaries_preserve_uniform_attention_with_a_partial_block():
    t, h, d = 139, 2, 7
    rng = np.random.default_rng(51)
    q, k = rng.uniform(size=(2, 1, t, h, d)).astype(np.float32)
    v = (rng.uniform(-1, 1, size=(1, t, h, d)) * 100).astype(np.float32)
    # scale 0: every logit is 0, so pooled blocks must weigh as many keys as they hold
    cmd = ops.sol_attention(
        scale=0.0, tau=0.5, block_size=16, approximation_start=17, approximation_end=t - 3,
        query_block_size=8,
    )  # fmt: skip
    got = np.asarray(cmd(q, k, v))
    np.testing.assert_allclose(
        got, np.broadcast_to(v.mean(axis=1, keepdims=True), got.shape), atol=1e-4
    )
