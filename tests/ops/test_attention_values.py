"""Attention against a NumPy softmax(q kᵀ) v, jax.nn.dot_product_attention, and its errors."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import DTypeError, ShapeError
from tests.helpers import assert_close, rand

sdpa = ops.scaled_dot_product_attention


def _attention(q, k, v, scale, add=0.0, keep=None):
    """Per head, in float64; ``add`` and ``keep`` broadcast to [B, H, S, T]."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    r = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, r, axis=2), np.repeat(v, r, axis=2)
    logits = np.einsum("bshd,bthd->bhst", q, k) * scale + add
    if keep is not None:
        logits = np.where(keep, logits, -np.inf)
    m = logits.max(-1, keepdims=True)
    e = np.exp(logits - np.where(np.isfinite(m), m, 0))
    total = e.sum(-1, keepdims=True)
    return np.einsum("bhst,bthd->bshd", e / np.where(total == 0, 1, total), v)


def test_attention_matches_numpy() -> None:
    q, k, v = rand([2, 3, 2, 4]), rand([2, 5, 2, 4], seed=1), rand([2, 5, 2, 3], seed=2)
    assert_close(sdpa()(q, k, v), _attention(q, k, v, 0.5), atol=1e-6)
    add = rand([2, 1, 3, 5], seed=3)
    assert_close(sdpa(scale=0.3)(q, k, v, add), _attention(q, k, v, 0.3, add=add), atol=1e-6)
    keep = rand([1, 2, 1, 5], seed=4) > 0
    assert_close(sdpa()(q, k, v, keep), _attention(q, k, v, 0.5, keep=keep), atol=1e-6)


def test_causal_is_bottom_right_aligned_like_nnc() -> None:
    q, k, v = rand([1, 2, 1, 3]), rand([1, 4, 1, 3], seed=1), rand([1, 4, 1, 3], seed=2)
    # Query i attends keys j <= i + T - S: here query 0 sees keys 0..2, query 1 all four.
    keep = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
    assert_close(sdpa(is_causal=True)(q, k, v), _attention(q, k, v, 3**-0.5, keep=keep), atol=1e-6)
    # A single query (a decoding step against a KV cache) attends every key.
    assert_close(sdpa(is_causal=True)(q[:, 1:], k, v), sdpa()(q[:, 1:], k, v), atol=1e-6)
    # More queries than keys: the first S - T queries attend nothing and give zeros.
    out = sdpa(is_causal=True)(rand([1, 4, 1, 3]), k[:, :2], v[:, :2])
    np.testing.assert_array_equal(np.asarray(out[:, :2]), 0)


def test_square_causal_and_grouped_heads_match_jax() -> None:
    q, k, v = rand([2, 4, 4, 8]), rand([2, 4, 2, 8], seed=1), rand([2, 4, 2, 8], seed=2)
    want = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    assert_close(sdpa(is_causal=True)(q, k, v), want, atol=1e-6)
    rep = lambda a: np.repeat(a, 2, axis=2)
    assert_close(sdpa()(q, k, v), sdpa()(q, rep(k), rep(v)), atol=1e-6)


def test_attention_errors() -> None:
    q, k = rand([1, 3, 4, 8]), rand([1, 5, 3, 8])
    with pytest.raises(ShapeError, match="q has 4 heads but k and v have 3"):
        sdpa()(q, k, k)
    with pytest.raises(ShapeError, match="disagree"):
        sdpa()(q, rand([1, 5, 4, 6]), rand([1, 5, 4, 6]))
    with pytest.raises(ShapeError, match=r"must broadcast to \[B, H, S, T\] = \[1, 4, 3, 5\]"):
        sdpa()(q, rand([1, 5, 4, 8]), rand([1, 5, 4, 8]), rand([3, 4]))
    with pytest.raises(DTypeError, match="mask"):
        sdpa()(q, rand([1, 5, 4, 8]), rand([1, 5, 4, 8]), np.ones((3, 5), np.int32))
    with pytest.raises(ShapeError, match=r"\[B, S, H, D\]"):
        sdpa()(rand([3, 4, 8]), rand([5, 4, 8]), rand([5, 4, 8]))
