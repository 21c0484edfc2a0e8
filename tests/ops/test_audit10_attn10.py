"""Audit round 10, attention: scaled_dot_product_attention edge cases against a float64
NumPy attention in NNC's ``[B, S, H, D]`` layout."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError


def test_empty_head_dim_is_uniform_attention() -> None:
    """``D = 0`` with the default scale: every logit is 0, so each query averages the
    values it sees (causal: bottom-right); ``1 / sqrt(0)`` raised ZeroDivisionError."""
    rng = np.random.default_rng(0)
    q, k = np.zeros((1, 2, 2, 0), np.float32), np.zeros((1, 3, 1, 0), np.float32)
    v = rng.standard_normal((1, 3, 1, 4)).astype(np.float32)
    seen = np.arange(3)[None] <= np.arange(2)[:, None] + 1  # [S, T], query i: j <= i + 1
    p = seen / seen.sum(-1, keepdims=True)
    want = np.einsum("st,btd->bsd", p, v[:, :, 0].astype(np.float64))[:, :, None]
    sdpa = ops.scaled_dot_product_attention(is_causal=True)

    def loss(v):
        return jnp.sum(sdpa(q, k, v) * jnp.arange(4.0).reshape(1, 1, 1, 4))

    o = sdpa(q, k, v)
    np.testing.assert_allclose(o, np.broadcast_to(want, (1, 2, 2, 4)), rtol=1e-6)
    gv = jax.grad(loss)(v)  # d/dv of sum_s,h p[s, t] v[t] . w: 2 heads read key head 0
    np.testing.assert_allclose(gv[0, :, 0], 2 * p.sum(0)[:, None] * np.arange(4.0), rtol=1e-6)


def test_sparse_indexed_attention_empty_head_dim() -> None:
    """Its ``scale=None`` is ``1 / sqrt(D)`` too: with ``D = 0`` an empty output, not a
    ZeroDivisionError."""
    q, kv = jnp.zeros((1, 1, 0)), jnp.zeros((2, 0))
    out = ops.sparse_indexed_attention()(q, kv, kv, kv, kv, jnp.array([[1]], jnp.int32))
    assert out.shape == (1, 1, 0)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "x", True])
def test_scale_must_be_a_finite_number(scale) -> None:
    """``scale=None`` is the default, so the generic hyper-parameter check let anything
    through: ``"x"`` failed inside ``jnp.asarray``, ``nan`` gave numbers, ``inf`` NaN."""
    q = np.ones((1, 2, 1, 4), np.float32)
    with pytest.raises(CommandError, match=r"scaled_dot_product_attention: scale is .*finite"):
        ops.scaled_dot_product_attention(scale=scale)(q, q, q)
    with pytest.raises(CommandError, match=r"sparse_indexed_attention: scale is"):
        kv = np.ones((2, 4), np.float32)
        ops.sparse_indexed_attention(scale=scale)(q[0], kv, kv, kv, kv, np.ones((2, 1), np.int32))
    with pytest.raises(CommandError, match=r"sol_attention: .*sc.* is"):  # nan: NaN out
        ops.sol_attention(scale=scale, block_size=2)(q, q, q)


def test_integral_scale_still_works() -> None:
    q = np.random.default_rng(1).standard_normal((1, 2, 1, 4)).astype(np.float32)
    logits = np.einsum("sd,td->st", q[0, :, 0], q[0, :, 0]).astype(np.float64) * 2
    p = np.exp(logits - logits.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ q[0, :, 0].astype(np.float64)
    got = ops.scaled_dot_product_attention(scale=np.int64(2))(q, q, q)
    np.testing.assert_allclose(np.asarray(got)[0, :, 0], want, rtol=1e-5)


def test_unify_head_rounds_16_bit_output_once() -> None:
    """The fused output projection ``joined @ W^T + bias`` in bfloat16: the product was
    rounded, then the bias added and rounded again (up to 1.3 ulps off); now summed in
    float32 and rounded once (NNC's loop sums bias and products in float), <= 0.5 ulp
    of the float64 projection of the command's own ``o``."""
    rng = np.random.default_rng(0)
    bf16 = jnp.bfloat16
    q, k, v = (jnp.asarray(rng.standard_normal((1, 4, 2, 16)), bf16) for _ in range(3))
    w = jnp.asarray(rng.standard_normal((8, 32)) / np.sqrt(32), bf16)
    bias = jnp.asarray(rng.standard_normal(8) * 4, bf16)
    y, o = ops.scaled_dot_product_attention()(q, k, v, None, w, bias)
    want = np.asarray(o, np.float64).reshape(1, 4, 32) @ np.asarray(w, np.float64).T
    want += np.asarray(bias, np.float64)
    ulp = np.spacing(np.abs(want).astype(bf16)).astype(np.float64)
    assert y.dtype == bf16
    assert np.max(np.abs(np.asarray(y, np.float64) - want) / ulp) <= 0.51
