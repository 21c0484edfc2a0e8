"""The sparse attention commands against NumPy ports of NNC's CPU references
(``ccv_nnc_scaled_dot_product_arg_partition_cpu_ref.c``,
``ccv_nnc_sparse_indexed_attention_cpu_ref.c``, ``ccv_nnc_sol_attention_cpu_ref.c``)."""

import math

import numpy as np
import pytest

from fnnc import ops


def _partition_reference(q, k, w, kth, scale, causal, ratio, offset, sort):
    t, c = q.shape[0], k.shape[0]
    out = -np.ones((t, kth), np.int32)
    for i in range(t):
        visible = min(max((offset + i + 1) // ratio, 0), c) if causal else c
        if c <= kth:
            out[i, :visible] = np.arange(visible)
            continue
        score = [
            sum(max(q[i, h] @ k[r], 0) * w[i, h] * scale for h in range(q.shape[1]))
            for r in range(visible)
        ]
        top = sorted(range(visible), key=lambda r: (-score[r], r))[:kth]
        out[i, : len(top)] = sorted(top) if sort else top
    return out


@pytest.mark.parametrize(
    "kth,causal,ratio,offset,sort",
    [
        (3, True, 1, 0, False),
        (2, True, 2, 3, True),
        (4, False, 1, 0, False),
        (8, True, 1, 0, False),
    ],
)
def test_arg_partition_matches_nnc_reference(kth, causal, ratio, offset, sort):
    rng = np.random.default_rng(kth)
    q, k, w = rng.normal(size=(5, 2, 3)), rng.normal(size=(7, 3)), rng.uniform(size=(5, 2))
    q, k, w = (x.astype(np.float32) for x in (q, k, w))
    cmd = ops.scaled_dot_product_arg_partition(
        kth=kth, scale=0.3, is_causal=causal, compression_ratio=ratio, query_offset=offset,
        sort_indices=sort,
    )  # fmt: skip
    want = _partition_reference(q, k, w, kth, 0.3, causal, ratio, offset, sort)
    np.testing.assert_array_equal(cmd(q, k, w), want)


def _sparse_reference(q, dk, dv, sk, sv, idx, sinks, scale, causal, window):
    t, h, _d = q.shape
    out = np.zeros(q.shape)
    for i in range(t):
        end = min(max(dk.shape[0] - t + i + 1, 0), dk.shape[0]) if causal else dk.shape[0]
        start = end - window if window and end > window else 0
        rows = [(dk[r], dv[r]) for r in range(start, end)]
        for j in idx[i]:
            if j < 0:
                break
            rows.append((sk[j], sv[j]))
        for hh in range(h):
            logits = [q[i, hh] @ kk * scale for kk, _ in rows]
            if sinks is not None:
                logits.append(sinks[hh if sinks.size > 1 else 0])
            if not logits:
                continue
            m = max(logits)
            e = np.exp(np.array(logits) - m)
            out[i, hh] = sum(e[n] * rows[n][1] for n in range(len(rows))) / e.sum()
    return out


@pytest.mark.parametrize("sinks,window", [(False, 0), (True, 2)])
def test_sparse_indexed_attention_matches_nnc_reference(sinks, window):
    rng = np.random.default_rng(2)
    q = rng.normal(size=(3, 2, 4)).astype(np.float32)
    dk, dv, sk, sv = (rng.normal(size=(n, 4)).astype(np.float32) for n in (4, 4, 6, 6))
    idx = np.array([[5, 1, -1, 2], [0, 0, 3, 4], [-1, 2, 2, 2]], np.int32)
    s = rng.normal(size=(2,)).astype(np.float32) if sinks else None
    cmd = ops.sparse_indexed_attention(
        scale=0.5, is_causal=True, attention_sinks=sinks, sliding_window=window
    )
    args = (q, dk, dv, sk, sv, idx) + ((s,) if sinks else ())
    want = _sparse_reference(q, dk, dv, sk, sv, idx, s, 0.5, True, window)
    np.testing.assert_allclose(cmd(*args), want, rtol=1e-5, atol=1e-6)


def _sol_reference(q, k, v, scale, tau, b, start, end, qb, radius):
    n_, t, h_, _d = q.shape
    out = np.zeros(q.shape)
    j_, qj_ = -(-t // b), -(-t // qb)
    for n in range(n_):
        for h in range(h_):
            qm = np.array([q[n, j * qb : min((j + 1) * qb, t), h].mean(0) for j in range(qj_)])
            km = np.array([k[n, j * b : min((j + 1) * b, t), h].mean(0) for j in range(j_)])
            vm = np.array([v[n, j * b : min((j + 1) * b, t), h].mean(0) for j in range(j_)])
            mean, var = km.mean(0), np.maximum((km * km).mean(0) - km.mean(0) ** 2, 0)
            g = scale * 1.4426950408889634
            for r in range(t):
                qi = r // qb
                thr = g * qm[qi] @ mean + tau * math.sqrt(g * g * (qm[qi] ** 2 @ var) + 1e-6)
                logits, values = [], []
                for j in range(j_):
                    count = min(b, t - j * b)
                    routed = (qi * qb < start or min((qi + 1) * qb, t) > end or j * b < start
                              or min((j + 1) * b, t) > end or abs(qi * qb // b - j) <= radius
                              or qm[qi] @ km[j] * g > thr)  # fmt: skip
                    if routed:
                        for s in range(j * b, j * b + count):
                            logits.append(q[n, r, h] @ k[n, s, h] * scale)
                            values.append(v[n, s, h])
                    else:
                        logits.append(q[n, r, h] @ km[j] * scale + math.log(count))
                        values.append(vm[j])
                e = np.exp(np.array(logits) - max(logits))
                out[n, r, h] = e @ np.array(values) / e.sum()
    return out


def test_sol_attention_matches_nnc_reference():
    rng = np.random.default_rng(4)
    q, k, v = (rng.normal(size=(1, 13, 2, 3)).astype(np.float32) for _ in range(3))
    cmd = ops.sol_attention(scale=0.8, tau=0.1, block_size=2, approximation_start=1,
                            approximation_end=12, query_block_size=3)  # fmt: skip
    want = _sol_reference(q, k, v, 0.8, 0.1, 2, 1, 12, 3, 1)
    got = np.asarray(cmd(q, k, v))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    dense = np.asarray(ops.scaled_dot_product_attention(scale=0.8)(q, k, v))
    assert np.abs(got - dense).max() > 1e-3  # some blocks were approximated
