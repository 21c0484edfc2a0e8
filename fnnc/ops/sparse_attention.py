"""Sparse attention family: scaled_dot_product_arg_partition, sparse_indexed_attention
and sol_attention (NNC's commands of the same names, liuliu/ccv ``lib/nnc/cmd``).

* ``scaled_dot_product_arg_partition(q [T, H, D], k [C, D], head_w [T, H])`` is the
  indexer of DeepSeek's sparse attention: row ``c``'s score for query ``t`` is
  ``scale * sum_h head_w[t, h] * relu(q[t, h] . k[c])``; the top ``kth`` visible rows
  (ties to the lower row) come out as int32 ``[T, kth]``, ``-1`` past the visible
  ones. Causal: query ``t`` sees ``(query_offset + t + 1) // compression_ratio``
  rows. With ``C <= kth`` every visible row is taken in row order; ``sort_indices``
  sorts a top-k in row order too. (NNC's optional candidate-block pool, its fourth
  input and second output, is not implemented.) Indices have no gradient.
* ``sparse_indexed_attention(q [T, H, D], dense_k, dense_v [Rd, D], sparse_k,
  sparse_v [Rs, D], indices [T, K], sinks [H] or [1])``: one softmax over the dense
  rows (causal: the last ``T`` rows line up with the queries; ``sliding_window``
  keeps the last ``w`` of them), the sparse rows ``indices[t]`` names (up to its
  first negative entry; rows out of range are skipped; ``indices [T]`` names none,
  as NNC's one-axis indices have ``K = 0``), and, with
  ``attention_sinks``, one sink logit per head that takes weight but adds no value.
  A query that attends nothing gets zeros.
* ``sol_attention(q, k, v [N, T, H, D])``: block-routed approximate attention. Keys
  are grouped in blocks of ``block_size`` and queries in blocks of
  ``query_block_size`` (0: ``block_size``); a key block is attended exactly when it
  is near the query block (``local_block_radius``), outside
  ``[approximation_start, approximation_end)``, or when the block means' logit
  clears ``mean + tau * std`` of the logits against all block means (log2 units);
  every other block counts as one key, its mean key and mean value, weighted by its
  length.

NNC has no backward for any of them; fnnc differentiates the two attentions from
``jax.vjp`` of the reference (the routing and index choices are constants of it), so
they train as the dense attention does.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import Spec, defcommand
from fnnc.core.dtypes import at_least_float32
from fnnc.errors import DTypeError
from fnnc.ops._rules import fail, require_float, require_same_dtype, show
from fnnc.ops.attention import check_scale, default_scale, scaled_dot_product_attention


def _arg_partition_shape(
    q, k, head_w, *, kth, scale, is_causal, compression_ratio, query_offset, sort_indices
):
    name = "scaled_dot_product_arg_partition"
    require_float(name, q, k, head_w)
    if q.ndim != 3 or k.ndim != 2 or k.shape[1] != q.shape[2] or tuple(head_w.shape) != q.shape[:2]:
        fail(
            f"{name}: expected q [T, H, D], k [C, D] and head_w [T, H]; got {show(q)}, {show(k)}, "
            f"{show(head_w)}"
        )
    if kth <= 0 or compression_ratio <= 0:
        fail(f"{name}: kth ({kth}) and compression_ratio ({compression_ratio}) must be positive")
    return Spec((q.shape[0], kth), np.int32)


@defcommand(family="attention", shape=_arg_partition_shape, differentiable=False)
def scaled_dot_product_arg_partition(
    q,
    k,
    head_w,
    *,
    kth=1,
    scale=1.0,
    is_causal=False,
    compression_ratio=1,
    query_offset=0,
    sort_indices=False,
):
    """The indexer's top-``kth`` key rows per query (see the module docstring).

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> q = jnp.ones((2, 1, 2)); k = jnp.array([[1.0, 0], [3, 0], [2, 0]])
    >>> ops.scaled_dot_product_arg_partition(kth=2)(q, k, jnp.ones((2, 1)))
    Array([[1, 2],
           [1, 2]], dtype=int32)
    """
    t, c = q.shape[0], k.shape[0]
    x = q.astype(jnp.float32)
    dots = jnp.maximum(jnp.einsum("thd,cd->thc", x, k.astype(jnp.float32)), 0)
    score = jnp.einsum("thc,th->tc", dots, head_w.astype(jnp.float32)) * scale
    rows = jnp.arange(t)
    visible = (
        jnp.clip((query_offset + rows + 1) // compression_ratio, 0, c)
        if is_causal
        else jnp.full((t,), c)
    )
    slot = jnp.arange(kth)
    if c <= kth:
        return jnp.where(slot[None] < visible[:, None], slot[None], -1).astype(jnp.int32)
    cols = jnp.arange(c)
    score = jnp.where(cols[None] < visible[:, None], score, -jnp.inf)
    picked = lax.top_k(score, kth)[1]
    picked = jnp.where(slot[None] < visible[:, None], picked, -1)
    if sort_indices:
        picked = jnp.sort(jnp.where(picked < 0, c, picked), axis=1)
        picked = jnp.where(picked == c, -1, picked)
    return picked.astype(jnp.int32)


def _sparse_shape(
    q, dense_k, dense_v, sparse_k, sparse_v, indices, sinks=None, *, scale, is_causal,
    attention_sinks, sliding_window
):  # fmt: skip
    name = "sparse_indexed_attention"
    check_scale(name, scale)
    floats = [q, dense_k, dense_v, sparse_k, sparse_v] + ([sinks] if sinks is not None else [])
    require_float(name, *floats)
    require_same_dtype(name, *floats)
    if np.dtype(indices.dtype) != np.int32:
        raise DTypeError(f"{name}: indices must be int32, got {show(indices)}")
    if q.ndim != 3:
        fail(f"{name}: q {show(q)} must be [T, H, D]")
    t, h, d = q.shape
    for label, s in (("dense_k", dense_k), ("dense_v", dense_v)):
        if s.ndim != 2 or tuple(s.shape) != (dense_k.shape[0], d):
            fail(f"{name}: {label} {show(s)} must be [Rd, {d}] like dense_k {show(dense_k)}")
    for label, s in (("sparse_k", sparse_k), ("sparse_v", sparse_v)):
        if s.ndim != 2 or tuple(s.shape) != (sparse_k.shape[0], d):
            fail(f"{name}: {label} {show(s)} must be [Rs, {d}] like sparse_k {show(sparse_k)}")
    if indices.ndim not in (1, 2) or indices.shape[0] != t:
        fail(f"{name}: indices {show(indices)} must be [T, K] (or [T]) for T = {t} queries")
    if attention_sinks != (sinks is not None):
        fail(
            f"{name}: attention_sinks={attention_sinks} but sinks were "
            f"{'given' if sinks is not None else 'not given'}; pass sinks [H] exactly when set"
        )
    if sinks is not None and math.prod(sinks.shape) not in (1, h):
        fail(f"{name}: sinks {show(sinks)} must hold 1 or H = {h} values")
    if sliding_window < 0 or (sliding_window > 0 and not is_causal):
        fail(f"{name}: sliding_window={sliding_window} needs is_causal and must be >= 0")
    return Spec(tuple(q.shape), q.dtype)


def _softmax_rows(logits, keep):
    """Softmax over the last axis of the kept entries; rows keeping none are zero."""
    logits = jnp.where(keep, logits, -jnp.inf)
    m = lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    e = jnp.exp(logits - jnp.where(jnp.isfinite(m), m, 0))
    total = jnp.sum(e, axis=-1, keepdims=True)
    return e / jnp.where(total == 0, 1, total)


@defcommand(family="attention", shape=_sparse_shape)
def sparse_indexed_attention(
    q,
    dense_k,
    dense_v,
    sparse_k,
    sparse_v,
    indices,
    sinks=None,
    *,
    scale=None,
    is_causal=False,
    attention_sinks=False,
    sliding_window=0,
):
    """Attention over dense rows, indexed sparse rows and sinks (see the module docstring).

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> q = jnp.zeros((1, 1, 2)); kv = jnp.array([[1.0, 0], [0, 1]])
    >>> ops.sparse_indexed_attention(scale=1.0)(q, kv, kv, kv, kv, jnp.array([[1]], jnp.int32))
    Array([[[0.33333334, 0.6666667 ]]], dtype=float32)
    """
    # In float32 at least, rounded once (as the dense attention): 16-bit logits,
    # exponentials and products had left 3-4x the error of one rounding.
    dtype, wide = q.dtype, at_least_float32(q.dtype)
    q, dense_k, dense_v, sparse_k, sparse_v = _widened(
        wide, q, dense_k, dense_v, sparse_k, sparse_v
    )
    sinks = None if sinks is None else sinks.astype(wide)
    t, h, d = q.shape
    rd, rs = dense_k.shape[0], sparse_k.shape[0]
    scale = default_scale(d) if scale is None else scale
    # [T] indices are NNC's K = 0 (its indices_nd == 1): dense rows and sinks only
    idx = indices if indices.ndim == 2 else indices[:, None][:, :0]
    rows = jnp.arange(rd)
    if is_causal:
        end = jnp.clip(rd - t + jnp.arange(t) + 1, 0, rd)
        start = jnp.where(end > sliding_window, end - sliding_window, 0) if sliding_window else 0
        start = jnp.broadcast_to(jnp.asarray(start), (t,))
        dense_keep = (rows[None] < end[:, None]) & (rows[None] >= start[:, None])
    else:
        dense_keep = jnp.ones((t, rd), bool)
    sparse_keep = (jnp.cumprod(idx >= 0, axis=1) > 0) & (idx < rs)
    safe = jnp.clip(idx, 0, rs - 1)
    sk, sv = jnp.take(sparse_k, safe, axis=0), jnp.take(sparse_v, safe, axis=0)  # [T, K, D]
    logits = [
        jnp.einsum("thd,rd->thr", q, dense_k),
        jnp.einsum("thd,tkd->thk", q, sk),
    ]
    logits = jnp.concatenate(logits, axis=-1) * jnp.asarray(scale, q.dtype)
    keep = jnp.concatenate([dense_keep, sparse_keep], axis=-1)[:, None, :]
    keep = jnp.broadcast_to(keep, logits.shape)
    if sinks is not None:
        sink = jnp.broadcast_to(jnp.reshape(sinks, (-1,)), (h,))
        logits = jnp.concatenate([logits, jnp.broadcast_to(sink[None, :, None], (t, h, 1))], -1)
        keep = jnp.concatenate([keep, jnp.ones((t, h, 1), bool)], axis=-1)
    p = _softmax_rows(logits, keep)
    out = jnp.einsum("thr,rd->thd", p[..., :rd], dense_v)
    return (out + jnp.einsum("thk,tkd->thd", p[..., rd : rd + idx.shape[1]], sv)).astype(dtype)


def _widened(wide, *xs):
    return tuple(x.astype(wide) for x in xs)


def _sol_shape(
    q, k, v, is_dense_attention=None, *, scale, tau, block_size, approximation_start,
    approximation_end, query_block_size, local_block_radius
):  # fmt: skip
    name = "sol_attention"
    check_scale(name, scale)
    require_float(name, q, k, v)
    require_same_dtype(name, q, k, v)
    flag = is_dense_attention
    if flag is not None and (np.dtype(flag.dtype) != np.int32 or math.prod(flag.shape) != 1):
        fail(
            f"{name}: is_dense_attention must be one int32 (non-zero: dense attention), "
            f"got {show(flag)}"
        )
    if q.ndim != 4 or tuple(k.shape) != tuple(q.shape) or tuple(v.shape) != tuple(q.shape):
        fail(
            f"{name}: q, k, v must share one [N, T, H, D] shape; got {show(q)}, {show(k)}, "
            f"{show(v)}"
        )
    t = q.shape[1]
    if block_size <= 0 or query_block_size < 0 or local_block_radius < 1:
        fail(
            f"{name}: block_size ({block_size}) must be positive, query_block_size "
            f"({query_block_size}) >= 0 and local_block_radius ({local_block_radius}) >= 1"
        )
    if not 0 <= approximation_start <= approximation_end <= t:
        fail(
            f"{name}: need 0 <= approximation_start ({approximation_start}) <= "
            f"approximation_end ({approximation_end}) <= T ({t})"
        )
    return Spec(tuple(q.shape), q.dtype)


def _block_means(x, size: int):
    """``[N, H, ceil(T / size), D]`` means of consecutive blocks (the last may be short)."""
    n, t, h, d = x.shape
    blocks = -(-t // size)
    padded = jnp.pad(x, ((0, 0), (0, blocks * size - t), (0, 0), (0, 0)))
    sums = jnp.sum(jnp.reshape(padded, (n, blocks, size, h, d)), axis=2)
    counts = np.minimum(size, t - np.arange(blocks) * size).astype(np.float32)
    per_block = jnp.reshape(jnp.asarray(counts, x.dtype), (1, 1, blocks, 1))
    return jnp.transpose(sums, (0, 2, 1, 3)) / per_block, counts


@defcommand(family="attention", shape=_sol_shape)
def sol_attention(
    q,
    k,
    v,
    is_dense_attention=None,
    *,
    scale=1.0,
    tau=0.5,
    block_size=64,
    approximation_start=0,
    approximation_end=0,
    query_block_size=0,
    local_block_radius=1,
):
    """Block-routed approximate attention over ``[N, T, H, D]`` (see the module docstring).

    ``is_dense_attention`` (optional, one int32): where it is non-zero the command is
    dense scaled dot-product attention at ``scale`` instead (NNC's fourth input), chosen
    at run time.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> x = jnp.ones((1, 4, 1, 2))
    >>> ops.sol_attention(block_size=2)(x, x, x).shape
    (1, 4, 1, 2)
    """

    def routed(q, k, v):
        return _sol(
            q, k, v, scale, tau, block_size, approximation_start, approximation_end,
            query_block_size, local_block_radius,
        )  # fmt: skip

    if is_dense_attention is None:
        return routed(q, k, v)

    def dense(q, k, v):
        return scaled_dot_product_attention.definition.forward(q, k, v, scale=scale)

    # one of the two runs, chosen on the device (the flag is an input, not a parameter)
    return lax.cond(jnp.reshape(is_dense_attention, ()) != 0, dense, routed, q, k, v)


def _sol(
    q, k, v, scale, tau, block_size, approximation_start, approximation_end,
    query_block_size, local_block_radius,
):  # fmt: skip
    """The routed attention of :func:`sol_attention`, in float32 at least (rounded once)."""
    dtype = q.dtype
    q, k, v = _widened(at_least_float32(dtype), q, k, v)
    t = q.shape[1]
    b = block_size
    qb = query_block_size or b
    qm, _ = _block_means(q, qb)  # [N, H, QJ, D]
    km, counts = _block_means(k, b)  # [N, H, J, D]
    vm, _ = _block_means(v, b)
    j_count, qj_count = km.shape[2], qm.shape[2]
    mean = jnp.mean(km, axis=2, keepdims=True)
    var = jnp.maximum(jnp.mean(km * km, axis=2, keepdims=True) - mean * mean, 0)
    g = scale * 1.4426950408889634
    mu = jnp.sum(qm * mean, axis=-1)  # [N, H, QJ]
    spread = jnp.sum(qm * qm * var, axis=-1)
    threshold = g * mu + tau * jnp.sqrt(g * g * spread + 1e-6)
    block_logit = jnp.einsum("nhqd,nhjd->nhqj", qm, km) * g
    qi, ji = np.arange(qj_count)[:, None], np.arange(j_count)[None]
    start, end = approximation_start, approximation_end
    fixed = (
        (qi * qb < start)
        | (np.minimum((qi + 1) * qb, t) > end)
        | (ji * b < start)
        | (np.minimum((ji + 1) * b, t) > end)
        | (np.abs(qi * qb // b - ji) <= local_block_radius)
    )
    routed = lax.stop_gradient(
        jnp.asarray(fixed)[None, None] | (block_logit > threshold[..., None])
    )
    rows = np.arange(t) // qb
    cols = np.arange(t) // b
    routed_rows = routed[:, :, rows]  # [N, H, T, J]
    exact = jnp.einsum("nrhd,nshd->nhrs", q, k) * jnp.asarray(scale, q.dtype)
    pooled = jnp.einsum("nrhd,nhjd->nhrj", q, km) * jnp.asarray(scale, q.dtype)
    pooled = pooled + jnp.reshape(jnp.asarray(np.log(counts), q.dtype), (1, 1, 1, -1))
    logits = jnp.concatenate([exact, pooled], axis=-1)
    keep = jnp.concatenate([routed_rows[..., cols], ~routed_rows], axis=-1)
    p = _softmax_rows(logits, keep)
    out = jnp.einsum("nhrs,nshd->nrhd", p[..., :t], v)
    return (out + jnp.einsum("nhrj,nhjd->nrhd", p[..., t:], vm)).astype(dtype)
