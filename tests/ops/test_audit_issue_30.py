"""Audit of issue 30 (NNC's whole command set and the dataframe add-ons), from the issue text.

Checks, each against an independent oracle (NumPy, SciPy, ml_dtypes, ``jax.grad``):

- every command the issue lists is an ``ops.<name>`` factory in the registry;
- forward values of sort, partition (top-k), unique_consecutive, scatter_add, rotate_half,
  cmul, ewsin, ewcos, ewpow, reduce_logsumexp, signed_sqrt, fill_if_less_than,
  gumbel_argmax, swish (``beta``), swish_mul, swiglu, rmsnorm_gated, segmented_gemm,
  moe_routing, comm_all_to_all, grid_sample, nms, histogram, conform_data_format,
  walsh_hadamard_transform, and LSTM's layers / bidirectional / projection options;
- backward (fnnc's ``backward`` pass, NNC's convention) equals ``jax.grad``;
- trace rules: sort, top_k, scatter-add, sin, cos, ``x ** 2.5``, ragged_dot, logsumexp,
  RoPE and SwiGLU idioms leave no generic ``primitive`` node, save/load and differentiate;
- the cnnp layers SwiGLU, RotaryEmbedding and MoE against formulas on their parameters;
- the dataframe: synchronous ``prefetch(n)``, the add-ons, ``sample`` reading through
  ``gather``, and NNC's label-shape rule for ``softmax_crossentropy``.
"""

from __future__ import annotations

import collections
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy
from jax import lax

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, compile, interpret, load, save, trace

RNG = np.random.default_rng(30)


def f32(*shape, lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


def close(got, want, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(
        np.asarray(got, np.float64), np.asarray(want, np.float64), rtol, atol
    )


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# -- the command set -----------------------------------------------------------------
ISSUE_COMMANDS = [
    "scatter_add",
    "sort",
    "partition",
    "unique_consecutive",
    "rotate_half",
    "cmul",
    "ewsin",
    "ewcos",
    "ewpow",
    "reduce_logsumexp",
    "signed_sqrt",
    "fill_if_less_than",
    "gumbel_argmax",
    "swiglu",
    "swish_mul",
    "segmented_swiglu",
    "rmsnorm_gated",
    "rmsnorm_cmul",
    "segmented_gemm",
    "moe_routing",
    "comm_all_to_all",
    "scaled_dot_product_arg_partition",
    "sparse_indexed_attention",
    "sol_attention",
    "gated_delta",
    "grid_sample",
    "roi_align",
    "nms",
    "histogram",
    "conform_data_format",
    "walsh_hadamard_transform",
    "hyper_connection",
]


def test_every_command_the_issue_lists_is_an_ops_factory_in_the_registry():
    """The commands fnnc lacked are ``ops.<name>`` factories registered under that name."""
    registry = ops.registry()
    missing = [
        n for n in ISSUE_COMMANDS if n not in registry or not callable(getattr(ops, n, None))
    ]
    assert not missing


# -- sorting family ------------------------------------------------------------------
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("axis", [0, 1])
def test_sort_gives_values_and_int32_indices_of_a_stable_sort(axis, descending):
    """sort: values and int32 indices, ties in input order (a stable sort)."""
    x = RNG.integers(0, 3, (5, 6)).astype(np.float32)  # many ties
    values, indices = ops.sort(axis=axis, descending=descending)(x)
    key = -x if descending else x
    want = np.argsort(key, axis=axis, kind="stable")
    assert np.asarray(indices).dtype == np.int32
    np.testing.assert_array_equal(indices, want)
    np.testing.assert_array_equal(values, np.take_along_axis(x, want, axis=axis))


def test_partition_descending_is_lax_top_k_and_ascending_the_k_smallest():
    """partition: top-k values and int32 indices (``lax.top_k``), or the k smallest."""
    x = RNG.integers(0, 4, (3, 7)).astype(np.float32)
    values, indices = ops.partition(kth=3, axis=1, descending=True)(x)
    want_v, want_i = lax.top_k(x, 3)
    np.testing.assert_array_equal(values, want_v)
    np.testing.assert_array_equal(indices, want_i)
    assert np.asarray(indices).dtype == np.int32
    values, indices = ops.partition(kth=2, axis=0)(x)
    order = np.argsort(x, axis=0, kind="stable")[:2]
    np.testing.assert_array_equal(indices, order)
    np.testing.assert_array_equal(values, np.take_along_axis(x, order, axis=0))


def test_unique_consecutive_is_the_run_length_code():
    """unique_consecutive: each run's value and length; -1 and 0 pad, runs past bincount drop."""
    x = np.array([4, 4, 1, 1, 1, 7, 4, 4, 9], np.int32)
    runs = [(k, len(list(g))) for k, g in itertools.groupby(x.tolist())]
    values, counts = ops.unique_consecutive(bincount=7)(x)
    np.testing.assert_array_equal(values, [v for v, _ in runs] + [-1] * (7 - len(runs)))
    np.testing.assert_array_equal(counts, [c for _, c in runs] + [0] * (7 - len(runs)))
    values, counts = ops.unique_consecutive(bincount=3)(x)
    np.testing.assert_array_equal(values, [v for v, _ in runs[:3]])
    np.testing.assert_array_equal(counts, [c for _, c in runs[:3]])


def test_scatter_add_sums_rows_into_their_index_and_drops_out_of_range():
    """scatter_add: row i of x adds into row indices[i] (np.add.at); bad indices dropped."""
    x = f32(6, 3)
    idx = np.array([2, 0, 2, -1, 4, 0], np.int32)
    got = ops.scatter_add(bincount=4)(x, idx)
    want = np.zeros((4, 3), np.float32)
    keep = (idx >= 0) & (idx < 4)
    np.add.at(want, idx[keep], x[keep])
    close(got, want)
    assert ops.scatter_add()(x, idx).shape == (6, 3)  # bincount 0: indices' length


# -- RoPE and transcendental ---------------------------------------------------------
def test_rotate_half_swaps_halves_and_cmul_is_a_complex_product():
    """rotate_half swaps the two halves; cmul multiplies interleaved (re, im) pairs."""
    x = f32(2, 3, 8)
    close(ops.rotate_half()(x), np.concatenate([x[..., 4:], x[..., :4]], -1), 0, 0)
    a, b = f32(2, 3, 8), f32(1, 3, 8)
    ca = a[..., 0::2] + 1j * a[..., 1::2]
    cb = b[..., 0::2] + 1j * b[..., 1::2]
    product = ca * cb
    want = np.stack([product.real, product.imag], -1).reshape(2, 3, 8)
    close(ops.cmul()(a, b), want, 1e-5, 1e-6)


def test_ewsin_ewcos_ewpow_signed_sqrt_and_fill_if_less_than_match_numpy():
    """The elementwise transcendental commands equal their NumPy formulas."""
    x = f32(3, 5, lo=-3, hi=3)
    close(ops.ewsin()(x), np.sin(x))
    close(ops.ewcos()(x), np.cos(x))
    base, exponent = f32(3, 5, lo=0.1, hi=2), f32(1, 5, lo=-2, hi=3)
    close(ops.ewpow()(base, exponent), base.astype(np.float64) ** exponent, rtol=2e-5)
    close(ops.signed_sqrt()(x), np.sign(x) * np.sqrt(np.maximum(np.abs(x), 1e-6)))
    selector = f32(3, 5)
    got = ops.fill_if_less_than(value=-9.0)(x, selector, np.float32(0.25))
    np.testing.assert_array_equal(got, np.where(selector < 0.25, np.float32(-9.0), x))


def test_reduce_logsumexp_keeps_reduced_axes_and_is_stable_for_large_values():
    """reduce_logsumexp over axes (kept as size 1, as NNC's reductions) equals SciPy's."""
    x = f32(3, 4, 5, lo=-2, hi=2) + np.float32(500.0)  # exp overflows float32 unshifted
    got = ops.reduce_logsumexp(axes=(1, 2))(x)
    assert got.shape == (3, 1, 1)
    close(got, scipy.special.logsumexp(x.astype(np.float64), axis=(1, 2), keepdims=True))


def test_gumbel_argmax_samples_the_softmax():
    """gumbel_argmax: int32 samples in range whose frequencies follow softmax(x)."""
    logits = np.log(np.array([0.1, 0.6, 0.3], np.float32))
    x = np.broadcast_to(logits, (6000, 3)).copy()
    got = np.asarray(ops.gumbel_argmax(axis=-1)(x, jax.random.PRNGKey(3)))
    assert got.dtype == np.int32 and got.min() >= 0 and got.max() <= 2
    freq = np.bincount(got.reshape(-1), minlength=3) / got.size
    close(freq, [0.1, 0.6, 0.3], rtol=0, atol=0.03)


# -- gated family --------------------------------------------------------------------
def test_swish_beta_swish_mul_swiglu_and_rmsnorm_gated_match_their_formulas():
    """swish(beta), swish_mul(beta, scale), swiglu(a, gate_w, up_w), rmsnorm_gated."""
    a, b = f32(4, 6, lo=-3, hi=3), f32(4, 6, lo=-3, hi=3)
    close(ops.swish(beta=2.0)(a), a * sigmoid(2.0 * a))
    close(ops.swish_mul(beta=1.5, scale=0.5)(a, b), 0.5 * a * b * sigmoid(1.5 * b), 1e-5, 1e-6)
    gate_w, up_w = f32(5, 6), f32(5, 6)
    g = a @ gate_w.T
    close(ops.swiglu()(a, gate_w, up_w), g * sigmoid(g) * (a @ up_w.T), 1e-4, 1e-5)
    scale = f32(6)
    want = a / np.sqrt(np.mean(a * a, -1, keepdims=True) + 1e-6) * scale * b * sigmoid(b)
    close(ops.rmsnorm_gated(epsilon=1e-6)(a, b, scale), want, 1e-4, 1e-5)


# -- quantize and statistics ---------------------------------------------------------
def test_walsh_hadamard_transform_is_the_hadamard_matrix_times_scale():
    """walsh_hadamard_transform of the last axis (natural order) times scale."""
    x = f32(3, 16)
    want = 0.25 * x.astype(np.float64) @ scipy.linalg.hadamard(16).T
    close(ops.walsh_hadamard_transform(scale=0.25)(x), want, 1e-5, 1e-5)


def test_conform_data_format_is_fp8_e4m3_fake_quantisation():
    """conform_data_format: values rounded to FP8-E4M3 (3 mantissa bits) with a power-of-
    two block scale: idempotent, within half an FP8 ulp, preserved tail untouched."""
    x = f32(2, 128, lo=-4, hi=4)
    q = np.asarray(ops.conform_data_format()(x))
    assert q.dtype == np.float32 and q.shape == x.shape
    np.testing.assert_array_equal(ops.conform_data_format()(q), q)
    big = np.abs(x) > 0.05  # away from FP8's subnormals whatever the block scale
    rel = np.abs(q - x)[big] / np.abs(x)[big]
    assert rel.max() <= 2.0**-4 + 1e-7
    mantissa, _ = np.frexp(q[big])  # 3 stored bits: 2 * mantissa * 8 is an integer
    np.testing.assert_array_equal(mantissa * 16, np.round(mantissa * 16))
    wide = f32(2, 69, lo=-4, hi=4)  # 64 quantised, the last 5 kept
    tail = np.asarray(ops.conform_data_format(preserved_tail=5)(wide))
    np.testing.assert_array_equal(tail[:, -5:], wide[:, -5:])
    assert not np.array_equal(tail[:, :64], wide[:, :64])


def test_histogram_even_counts_below_bins_above_and_nan():
    """histogram 'even': [below min, each bin, at or above max, NaN] and [min, max, sum, sumsq]."""
    x = np.array([-1.0, 0.0, 0.1, 0.49, 0.5, 0.99, 1.0, 3.0, np.nan], np.float32)
    counts, stats = ops.histogram(bins=4, min=0.0, max=1.0)(x)
    finite = x[np.isfinite(x)]
    inside, _ = np.histogram(finite[(finite >= 0) & (finite < 1)], bins=4, range=(0, 1))
    np.testing.assert_array_equal(
        counts, [np.sum(finite < 0), *inside, np.sum(finite >= 1), np.isnan(x).sum()]
    )
    close(stats[:2], [finite.min(), finite.max()])


# -- mixture of experts --------------------------------------------------------------
@pytest.mark.parametrize("transpose_b", [False, True])
def test_segmented_gemm_multiplies_each_segment_by_its_expert(transpose_b):
    """segmented_gemm: rows off_n..off_n+counts[n] times expert indices[n] (+ bias); rows past
    the last segment are zero."""
    a = f32(7, 3)
    w = f32(3, 4, 3) if transpose_b else f32(3, 3, 4)
    bias = f32(3, 4)
    indices, counts = np.array([2, 0, 2], np.int32), np.array([2, 3, 1], np.int32)
    got = ops.segmented_gemm(transpose_b=transpose_b)(a, indices, counts, w, bias)
    want = np.zeros((7, 4), np.float32)
    start = 0
    for e, c in zip(indices, counts):
        we = w[e].T if transpose_b else w[e]
        want[start : start + c] = a[start : start + c] @ we + bias[e]
        start += c
    close(got, want, 1e-5, 1e-6)


def test_moe_routing_picks_top_k_experts_and_sorts_rows_by_expert():
    """moe_routing: top-k of sqrt(softplus(logits)) + route; weights p / sum p; pairs
    sorted by expert, then token; counts per used expert, -1 / 0 past them."""
    t, e, k, d = 5, 6, 2, 3
    logits, activation = f32(t, e, lo=-2, hi=2), f32(t, d)
    route = np.zeros(e, np.float32)
    gathered, weights, tokens, experts, counts = ops.moe_routing(kth=k)(logits, route, activation)
    p = np.sqrt(np.log1p(np.exp(logits.astype(np.float64))))
    pairs = []
    for token in range(t):
        chosen = np.argsort(-(p[token] + route), kind="stable")[:k]
        norm = max(p[token, chosen].sum(), 2.0**-14)
        pairs += [(int(ex), token, slot, p[token, ex] / norm) for slot, ex in enumerate(chosen)]
    pairs.sort(key=lambda q: (q[0], q[1], q[2]))
    np.testing.assert_array_equal(tokens, [q[1] for q in pairs])
    close(weights, [q[3] for q in pairs], 1e-5, 1e-6)
    close(gathered, activation[[q[1] for q in pairs]], 0, 0)
    used = collections.Counter(q[0] for q in pairs)
    groups = min(t * k, e)
    pad = groups - len(used)
    np.testing.assert_array_equal(experts, sorted(used) + [-1] * pad)
    np.testing.assert_array_equal(counts, [used[x] for x in sorted(used)] + [0] * pad)


def test_comm_all_to_all_gives_rank_j_chunk_j_of_every_rank():
    """comm_all_to_all: output j is chunk j (along axis) of every input, in rank order."""
    xs = [f32(6, 2) for _ in range(3)]
    outs = ops.comm_all_to_all(axis=0)(*xs)
    assert len(outs) == 3
    for j, out in enumerate(outs):
        close(out, np.concatenate([x[2 * j : 2 * j + 2] for x in xs], axis=0), 0, 0)


def test_segmented_swiglu_runs_each_rows_expert_and_scales_by_its_route_weight():
    """segmented_swiglu: row r of segment s gets expert indices[s]'s SwiGLU times
    route_weight[r]; rows past sum(counts) are zero."""
    a, gate_w, up_w = f32(6, 3), f32(2, 4, 3), f32(2, 4, 3)
    weight = f32(6, lo=0, hi=1)
    indices, counts = np.array([1, 0], np.int32), np.array([3, 2], np.int32)
    got = ops.segmented_swiglu()(a, indices, counts, gate_w, up_w, weight)
    want = np.zeros((6, 4))
    owner = [1, 1, 1, 0, 0]
    for r, ex in enumerate(owner):
        g = gate_w[ex] @ a[r]
        want[r] = g * sigmoid(g) * (up_w[ex] @ a[r]) * weight[r]
    close(got, want, 1e-4, 1e-5)


def test_rmsnorm_cmul_is_rms_norm_then_complex_product():
    """rmsnorm_cmul: RMS norm over the last axis times scale, then cmul with freqs."""
    x, freqs, scale = f32(2, 3, 8), f32(1, 3, 8), f32(8)
    normed = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, -1, keepdims=True) + 1e-6) * scale
    cn = normed[..., 0::2] + 1j * normed[..., 1::2]
    cf = freqs[..., 0::2] + 1j * freqs[..., 1::2]
    product = cn * cf
    want = np.stack([product.real, product.imag], -1).reshape(x.shape)
    close(ops.rmsnorm_cmul(epsilon=1e-6)(x, freqs, scale), want, 1e-4, 1e-5)


def test_gated_delta_is_the_gated_deltanet_recurrence_with_grouped_keys():
    """gated_delta: S = exp(g) S; S += beta (v - S k) k^T; y = S q; value head h reads key
    head h // (Hv / Hk)."""
    b, t, hk, hv, dk, dv = 1, 4, 1, 2, 3, 2
    q, k = f32(b, t, hk, dk), f32(b, t, hk, dk)
    v = f32(b, t, hv, dv)
    log_decay, beta = f32(b, t, hv, lo=-1, hi=0), f32(b, t, hv, lo=0, hi=1)
    state = f32(b, hv, dv, dk)
    y, out = ops.gated_delta()(q, k, v, log_decay, beta, state)
    s = state.astype(np.float64).copy()
    want = np.zeros((b, t, hv, dv))
    for step in range(t):
        for h in range(hv):
            kh, qh = k[0, step, h // (hv // hk)], q[0, step, h // (hv // hk)]
            s[0, h] *= np.exp(log_decay[0, step, h])
            s[0, h] += beta[0, step, h] * np.outer(v[0, step, h] - s[0, h] @ kh, kh)
            want[0, step, h] = s[0, h] @ qh
    close(y, want, 1e-4, 1e-5)
    close(out, s, 1e-4, 1e-5)


def test_hyper_connection_expand_mixes_the_residual_streams():
    """hyper_connection(mode='expand'): out[i] = block post[i] + sum_j comb[j, i] residual[j]."""
    n, d = 3, 4
    block, residual = f32(2, d), f32(2, n, d)
    post, comb = f32(2, n), f32(2, n, n)
    got = ops.hyper_connection(mode="expand", count=n)(block, residual, post, comb)
    want = block[:, None, :] * post[:, :, None] + np.einsum("bji,bjd->bid", comb, residual)
    close(got, want, 1e-5, 1e-5)


# -- vision --------------------------------------------------------------------------
def _grid_sample_numpy(a, grid, align_corners):
    n, h, w, c = a.shape
    out = np.zeros((n, *grid.shape[1:3], c), np.float64)
    for b in range(n):
        for i, j in np.ndindex(grid.shape[1:3]):
            gx, gy = grid[b, i, j]
            if align_corners:
                x, y = (gx + 1) / 2 * (w - 1), (gy + 1) / 2 * (h - 1)
            else:
                x, y = ((gx + 1) * w - 1) / 2, ((gy + 1) * h - 1) / 2
            x0, y0 = int(np.floor(x)), int(np.floor(y))
            for yy, xx in itertools.product((y0, y0 + 1), (x0, x0 + 1)):
                weight = (1 - abs(x - xx)) * (1 - abs(y - yy))
                if 0 <= yy < h and 0 <= xx < w:
                    out[b, i, j] += weight * a[b, yy, xx]
    return out


@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_is_bilinear_with_zeros_outside(align_corners):
    """grid_sample: bilinear at normalised (x, y), zeros outside, both corner conventions."""
    a, grid = f32(2, 4, 5, 3), f32(2, 3, 3, 2, lo=-1.2, hi=1.2)
    got = ops.grid_sample(align_corners=align_corners)(a, grid)
    close(got, _grid_sample_numpy(a, grid, align_corners), 1e-5, 1e-5)


def test_nms_keeps_greedy_survivors_by_score():
    """nms: rows (score, x, y, w, h) by score; a row with IoU >= threshold with a kept one
    is dropped; kept rows first with their source indices, -1 after."""
    rows = np.array(
        [
            [0.6, 0, 0, 4, 4],  # overlaps row 2 heavily
            [0.3, 10, 10, 2, 2],
            [0.9, 0.5, 0.5, 4, 4],
            [0.8, 3.5, 3.5, 4, 4],  # small overlap with row 2
            [0.1, 10.2, 10.2, 2, 2],  # overlaps row 1
        ],
        np.float32,
    )

    def iou(p, q):
        ix = max(0.0, min(p[1] + p[3], q[1] + q[3]) - max(p[1], q[1]))
        iy = max(0.0, min(p[2] + p[4], q[2] + q[4]) - max(p[2], q[2]))
        inter = ix * iy
        return inter / (p[3] * p[4] + q[3] * q[4] - inter)

    kept = []
    for i in np.argsort(-rows[:, 0], kind="stable"):
        if all(iou(rows[i], rows[j]) < 0.5 for j in kept):
            kept.append(int(i))
    out, indices = ops.nms(iou_threshold=0.5)(rows)
    np.testing.assert_array_equal(indices, kept + [-1] * (5 - len(kept)))
    close(np.asarray(out)[: len(kept)], rows[kept], 0, 0)


# -- LSTM options --------------------------------------------------------------------
def _lstm_numpy(x, h0, c0, weights, layers, directions, proj):
    """cuDNN-order gates (i, f, g, o); weights per layer and direction: w_ih, w_hh, b, [w_hr]."""
    per = 4 if proj else 3
    seq, hs, cs = x, [], []
    for layer in range(layers):
        outs = []
        for d in range(directions):
            unit = layer * directions + d
            w_ih, w_hh, bias, *rest = weights[unit * per : (unit + 1) * per]
            h, c = h0[unit].astype(np.float64), c0[unit].astype(np.float64)
            ys = [None] * seq.shape[1]
            steps = range(seq.shape[1]) if d == 0 else reversed(range(seq.shape[1]))
            for t in steps:
                z = seq[:, t] @ w_ih.T + h @ w_hh.T + bias
                i, f, g, o = np.split(z, 4, axis=-1)
                c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
                h = sigmoid(o) * np.tanh(c)
                if rest:
                    h = h @ rest[0].T
                ys[t] = h
            outs.append(np.stack(ys, axis=1))
            hs.append(h)
            cs.append(c)
        seq = np.concatenate(outs, axis=-1)
    return seq, np.stack(hs), np.stack(cs)


def test_lstm_two_bidirectional_layers_with_projection_match_numpy():
    """lstm(num_layers=2, bidirectional=True, proj_size=P) equals a NumPy LSTMP."""
    b, t, i, h, p, layers, dirs = 2, 3, 4, 5, 3, 2, 2
    x = f32(b, t, i)
    h0, c0 = f32(layers * dirs, b, p), f32(layers * dirs, b, h)
    weights = []
    for layer in range(layers):
        width = i if layer == 0 else dirs * p
        for _ in range(dirs):
            weights += [f32(4 * h, width), f32(4 * h, p), f32(4 * h), f32(p, h)]
    cmd = ops.lstm(num_layers=layers, bidirectional=True, proj_size=p)
    y, h_t, c_t = cmd(x, h0, c0, *weights)
    want_y, want_h, want_c = _lstm_numpy(x, h0, c0, weights, layers, dirs, p)
    close(y, want_y, 1e-4, 1e-5)
    close(h_t, want_h, 1e-4, 1e-5)
    close(c_t, want_c, 1e-4, 1e-5)


# -- backward (fnnc's convention) against jax.grad -------------------------------------
def _fnnc_vjp(cmd, args, wrt, cotangent_seed=0):
    """Gradients of sum(output 0 * c) through fnnc's ``backward`` pass, compiled."""
    b = GraphBuilder()
    syms = [b.input(np.shape(a), np.asarray(a).dtype) for a in args]
    y = b.exec(cmd, *syms)
    y = y[0] if isinstance(y, tuple) else y
    dy = b.input(y.shape, y.dtype)
    graph, _ = backward(b.build([y]), y, [syms[i] for i in wrt], df=[dy])
    c = np.random.default_rng(cotangent_seed).standard_normal(y.shape).astype(np.float32)
    return compile(graph)(*args, c)[1:], c


SEGMENTS = (np.array([1, 0], np.int32), np.array([2, 3], np.int32))
SCATTER_INDEX = np.array([2, 0, 2], np.int32)


def _segmented(a, w):
    return jnp.concatenate([a[:2] @ w[1], a[2:] @ w[0]])


def _cmul(a, b):
    re = a[..., 0::2] * b[..., 0::2] - a[..., 1::2] * b[..., 1::2]
    im = a[..., 0::2] * b[..., 1::2] + a[..., 1::2] * b[..., 0::2]
    return jnp.stack([re, im], -1).reshape(a.shape)


GRAD_CASES = {
    "ewcos": (ops.ewcos(), jnp.cos, lambda: [f32(3, 4)], [0]),
    "ewpow": (ops.ewpow(), jnp.power, lambda: [f32(3, 4, lo=0.5, hi=2), f32(3, 4)], [0, 1]),
    "reduce_logsumexp": (
        ops.reduce_logsumexp(axes=(1,)),
        lambda x: jax.nn.logsumexp(x, axis=1, keepdims=True),
        lambda: [f32(3, 4)],
        [0],
    ),
    "cmul": (ops.cmul(), _cmul, lambda: [f32(2, 6), f32(2, 6)], [0, 1]),
    "rotate_half": (
        ops.rotate_half(),
        lambda x: jnp.concatenate([x[..., 3:], x[..., :3]], -1),
        lambda: [f32(2, 6)],
        [0],
    ),
    "scatter_add": (
        ops.scatter_add(bincount=4),
        lambda x, i: jnp.zeros((4, 5)).at[SCATTER_INDEX].add(x),
        lambda: [f32(3, 5), SCATTER_INDEX],
        [0],
    ),
    "sort": (ops.sort(axis=1), lambda x: jnp.sort(x, axis=1), lambda: [f32(3, 5)], [0]),
    "partition": (
        ops.partition(kth=2, axis=1, descending=True),
        lambda x: lax.top_k(x, 2)[0],
        lambda: [f32(3, 5)],
        [0],
    ),
    "swiglu": (
        ops.swiglu(),
        lambda a, g, u: jax.nn.silu(a @ g.T) * (a @ u.T),
        lambda: [f32(3, 4), f32(5, 4), f32(5, 4)],
        [0, 1, 2],
    ),
    "swish_mul": (
        ops.swish_mul(beta=1.5, scale=0.5),
        lambda a, b: 0.5 * a * b * jax.nn.sigmoid(1.5 * b),
        lambda: [f32(3, 4), f32(3, 4)],
        [0, 1],
    ),
    "rmsnorm_gated": (
        ops.rmsnorm_gated(),
        lambda x, g, s: (
            x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * s[None] * jax.nn.silu(g)
        ),
        lambda: [f32(3, 4), f32(3, 4), f32(4)],
        [0, 1, 2],
    ),
    "segmented_gemm": (
        ops.segmented_gemm(),
        lambda a, i, c, w: _segmented(a, w),
        lambda: [f32(5, 3), *SEGMENTS, f32(2, 3, 4)],
        [0, 3],
    ),
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_backward_in_fnncs_convention_equals_jax_grad(name):
    """Each differentiable new command's backward node gives jax.grad's gradient."""
    cmd, reference, make, wrt = GRAD_CASES[name]
    args = make()
    got, c = _fnnc_vjp(cmd, args, wrt)

    def loss(*diff):
        full = list(args)
        for i, v in zip(wrt, diff):
            full[i] = v
        return jnp.sum(reference(*full) * c)

    want = jax.grad(loss, argnums=tuple(range(len(wrt))))(*[jnp.asarray(args[i]) for i in wrt])
    for g, w in zip(got, want, strict=True):
        close(g, w, 1e-4, 1e-5)


# -- trace rules -----------------------------------------------------------------------
def _counts(graph):
    return collections.Counter(n.cmd.name for n in graph.nodes)


def _ragged(x, w):
    return lax.ragged_dot(x, w, jnp.array([2, 0, 3], jnp.int32))


def _silu_by_hand(h):
    return h * jax.nn.sigmoid(h)


TRACE_CASES = {
    "pow_2_5": (lambda x: jnp.abs(x) ** 2.5, lambda: [f32(3, 4)], "ewpow"),
    "sin_cos": (lambda x: jnp.sin(x) * jnp.cos(2.0 * x), lambda: [f32(3, 4)], "ewsin ewcos"),
    "top_k": (lambda x: lax.top_k(x, 2)[0] * 3.0, lambda: [f32(3, 5)], "partition"),
    "sort": (lambda x: jnp.sort(x, axis=0), lambda: [f32(4, 3)], "sort"),
    "segment_sum": (
        lambda x: jax.ops.segment_sum(x, jnp.array([0, 0, 2, 1]), num_segments=3),
        lambda: [f32(4, 2)],
        "scatter_add",
    ),
    "ragged_dot": (_ragged, lambda: [f32(5, 3), f32(3, 3, 2)], "segmented_gemm"),
    "swiglu_sigmoid": (
        lambda x, g, u: _silu_by_hand(x @ g) * (x @ u),
        lambda: [f32(3, 4), f32(4, 5), f32(4, 5)],
        "swish_mul",
    ),
}


@pytest.mark.parametrize("name", sorted(TRACE_CASES))
def test_traced_jax_code_is_the_command_saves_loads_and_differentiates(name, tmp_path):
    """JAX's primitive or idiom traces to the command, no generic node; the graph saves and
    loads; fnnc's backward of it equals jax.grad."""
    f, make, commands = TRACE_CASES[name]
    args = make()
    graph = trace(f, *args)
    names = _counts(graph)
    assert "primitive" not in names and set(commands.split()) <= set(names), str(graph)
    close(interpret(graph, *args), f(*args), 1e-5, 1e-5)
    path = tmp_path / "g.json"
    save(graph, str(path))
    loaded = load(str(path))
    assert _counts(loaded) == names
    # gradient of sum(f * c) through fnnc's backward pass
    b = GraphBuilder.from_graph(graph)
    (out,) = [graph.symbols[i] for i in graph.outputs]
    dy = b.input(out.shape, out.dtype)
    wrt = [graph.symbols[i] for i in graph.inputs]
    g, _ = backward(b.build([out]), out, wrt, df=[dy])
    c = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    got = compile(g)(*args, c)[1:]
    want = jax.grad(lambda *a: jnp.sum(f(*a) * c), argnums=tuple(range(len(args))))(*args)
    for gv, wv in zip(got, want, strict=True):
        close(gv, wv, 1e-4, 1e-5)


def test_descending_jnp_sort_traces_without_a_generic_node():
    """``jnp.sort(x, descending=True)`` (sort then JAX's ``rev``) is sort, no generic node."""
    x = f32(3, 5)
    graph = trace(lambda x: jnp.sort(x, axis=-1, descending=True), x)
    close(interpret(graph, x), -np.sort(-x, axis=-1), 0, 0)
    assert "primitive" not in _counts(graph), str(graph)


def test_descending_jnp_argsort_traces_to_sort():
    """``jnp.argsort(x, descending=True)`` is sort's (or argsort's) indices, no generic node."""
    x = RNG.integers(0, 3, (3, 6)).astype(np.float32)
    graph = trace(lambda x: jnp.argsort(x, axis=-1, descending=True), x)
    np.testing.assert_array_equal(interpret(graph, x), jnp.argsort(x, axis=-1, descending=True))
    assert "primitive" not in _counts(graph), str(graph)


def test_logsumexp_with_keepdims_traces_to_reduce_logsumexp():
    """``jax.nn.logsumexp(x, axis=-1, keepdims=True)`` is reduce_logsumexp, no generic node."""
    x = f32(4, 5, lo=-3, hi=3)
    f = lambda x: jax.nn.logsumexp(x, axis=-1, keepdims=True)
    graph = trace(f, x)
    close(interpret(graph, x), f(x), 1e-5, 1e-5)
    names = _counts(graph)
    assert "primitive" not in names and "reduce_logsumexp" in names, str(graph)


def test_integer_scatter_add_counting_tokens_per_expert_traces_to_scatter_add():
    """``jnp.zeros(E, int32).at[experts].add(1)`` (an MoE load count) is scatter_add."""
    experts = np.array([0, 3, 3, 1, 0, 3], np.int32)
    f = lambda e: jnp.zeros(4, jnp.int32).at[e].add(1)
    graph = trace(f, experts)
    np.testing.assert_array_equal(interpret(graph, experts), np.bincount(experts, minlength=4))
    names = _counts(graph)
    assert "primitive" not in names and "scatter_add" in names, str(graph)


def test_scatter_add_promised_in_bounds_traces_to_scatter_add():
    """``x.at[i].add(u, mode="promise_in_bounds")`` (indices in range) is scatter_add."""
    rows, idx = f32(5, 3), np.array([0, 3, 3, 1, 0], np.int32)
    f = lambda u, i: jnp.zeros((4, 3), jnp.float32).at[i].add(u, mode="promise_in_bounds")
    graph = trace(f, rows, idx)
    close(interpret(graph, rows, idx), f(rows, idx), 1e-6, 1e-6)
    names = _counts(graph)
    assert "primitive" not in names and "scatter_add" in names, str(graph)


def _rope_interleaved(x):
    """Meta's Llama RoPE on interleaved (re, im) pairs, written with real arithmetic."""
    t, d = x.shape[1], x.shape[-1]
    inv = 1.0 / (10000.0 ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    angle = jnp.arange(t, dtype=jnp.float32)[:, None] * inv[None]
    cos, sin = jnp.cos(angle)[None, :, None, :], jnp.sin(angle)[None, :, None, :]
    re, im = x[..., 0::2], x[..., 1::2]
    return jnp.stack([re * cos - im * sin, re * sin + im * cos], -1).reshape(x.shape)


def test_interleaved_rope_traces_without_a_generic_node():
    """Interleaved (complex-pair) RoPE traces to commands only and matches JAX."""
    x = f32(2, 3, 2, 8)
    graph = trace(_rope_interleaved, x)
    close(interpret(graph, x), _rope_interleaved(x), 1e-5, 1e-5)
    assert "primitive" not in _counts(graph), str(graph)


# -- cnnp layers -----------------------------------------------------------------------
def test_swiglu_layer_is_w_down_of_silu_gate_times_up():
    """SwiGLU layer: W_down (swish(W_gate x) * W_up x) with NNC's [out, in] weights."""
    from fnnc.models import Input, Model, SwiGLU

    x = Input()
    model = Model(x, SwiGLU(6, name="mlp")(x))
    data = f32(3, 4)
    model.compile(data)
    p = model.parameters()
    wg, wu, wd = p["t-mlp-0-0"], p["t-mlp-0-1"], p["t-mlp-0-2"]
    assert wg.shape == wu.shape == (6, 4) and wd.shape == (4, 6)
    g = data @ wg.T
    close(model.evaluate(data), (g * sigmoid(g) * (data @ wu.T)) @ wd.T, 1e-4, 1e-5)


def test_rotary_embedding_layer_rotates_half_by_position():
    """RotaryEmbedding: x cos(t theta) + rotate_half(x) sin(t theta), theta_i = base^(-2i/D)."""
    from fnnc.models import Input, Model, RotaryEmbedding

    x = Input()
    model = Model(x, RotaryEmbedding(base=100.0)(x))
    data = f32(2, 5, 3, 8)
    model.compile(data)
    theta = 100.0 ** (-np.arange(4) * 2 / 8)
    angle = np.arange(5)[:, None] * theta[None]
    angle = np.concatenate([angle, angle], -1)[None, :, None, :]
    rotated = np.concatenate([-data[..., 4:], data[..., :4]], -1)
    close(model.evaluate(data), data * np.cos(angle) + rotated * np.sin(angle), 1e-5, 1e-5)


def test_moe_layer_is_the_weighted_sum_of_its_top_k_swiglu_experts():
    """MoE: router, top-k of sqrt(softplus) scores, each token the weighted sum of its
    experts' SwiGLU outputs (experts as segmented GEMMs); load = rows per expert."""
    from fnnc.models import Input, Model, MoE

    e, hidden, k, d = 4, 6, 2, 5
    x = Input()
    out, load = MoE(e, hidden, k=k, return_load=True, name="moe")(x)
    model = Model(x, [out, load])
    data = f32(7, d)
    model.compile(data)
    p = {key: np.asarray(v, np.float64) for key, v in model.parameters().items()}
    router, route, w_gate, w_up, w_down = (p[f"t-moe-0-{i}"] for i in range(5))
    scores = np.sqrt(np.log1p(np.exp(data @ router.T)))
    want = np.zeros((7, d))
    hits = np.zeros(e)
    for token in range(7):
        chosen = np.argsort(-(scores[token] + route), kind="stable")[:k]
        norm = scores[token, chosen].sum()
        for ex in chosen:
            g = w_gate[ex] @ data[token]
            y = w_down[ex] @ (g * sigmoid(g) * (w_up[ex] @ data[token]))
            want[token] += scores[token, ex] / norm * y
            hits[ex] += 1
    got_out, got_load = model.evaluate(data)
    close(got_out, want, 1e-4, 1e-5)
    close(got_load, hits, 0, 0)


# -- dataframe -------------------------------------------------------------------------
def test_prefetch_reads_now_and_reports_the_end():
    """it.prefetch(n) reads the next n rows now; fewer at the end, 0 past it; next() takes
    them without reading again."""
    from fnnc.data import DataFrame
    from fnnc.data.sources import ArrayColumn

    class Reads(ArrayColumn):
        count = 0

        def read(self, row):
            Reads.count += 1
            return super().read(row)

    df = DataFrame({"x": Reads(np.arange(5) * 10)})
    it = df.iterator("x")
    assert it.prefetch(2) == 2 and Reads.count == 2
    assert int(next(it)) == 0 and int(next(it)) == 10 and Reads.count == 2
    assert it.prefetch(5) == 3 and Reads.count == 5
    assert it.prefetch(1) == 0
    assert [int(v) for v in it] == [20, 30, 40] and Reads.count == 5


def test_sample_reads_through_gather_once_per_group():
    """sample: 8 rows in groups of 3 read the column 3 times (NNC), through its gather."""
    from fnnc.data import DataFrame
    from fnnc.data.sources import ArrayColumn

    class Gathers(ArrayColumn):
        reads = gathers = 0

        def read(self, row):
            Gathers.reads += 1
            return super().read(row)

        def gather(self, rows):
            Gathers.gathers += 1
            return super().gather(rows)

    df = DataFrame({"x": Gathers(np.arange(8))}).sample(3, lambda xs: int(np.sum(xs)), inputs="x")
    assert list(df.iterator("sample")) == [3, 12, 13]
    assert (Gathers.reads, Gathers.gathers) == (0, 3)


def test_one_hot_copy_scalar_one_squared_and_truncate_add_ons():
    """NNC's add-ons as dataframe methods, batched and row-wise, against NumPy."""
    from fnnc.data import DataFrame

    labels = np.array([2, 0, 1, 2], np.int32)
    lengths = np.array([3, 1, 2, 2], np.int32)
    seq = f32(4, 5)
    df = DataFrame.from_arrays(y=labels, n=lengths, s=seq)
    df = df.one_hot("y", 3, on=0.9, off=0.05).copy_scalar("n").one_squared("n", 4)
    df = df.batch(4).truncate("s", "n")
    (row,) = list(df.iterator(["y_one_hot", "n_scalar", "n_mask", "s_truncated"]))
    hot, scalar, mask, cut = row
    close(hot, np.where(np.eye(3)[labels] == 1, 0.9, 0.05), 0, 1e-7)
    assert scalar.shape == (4, 1) and scalar.dtype == np.float32
    close(scalar[:, 0], lengths, 0, 0)
    inside = np.arange(4)[None] < lengths[:, None]
    np.testing.assert_array_equal(mask, (inside[:, :, None] & inside[:, None, :]).astype(np.int32))
    close(cut, seq[:, :3], 0, 0)


def test_image_random_jitter_is_seeded_per_row_and_epoch():
    """image_random_jitter: float32 crops of the asked size, replayed from (seed, epoch)."""
    from fnnc.data import DataFrame

    images = RNG.integers(0, 256, (4, 8, 8, 3)).astype(np.uint8)
    df = DataFrame.from_arrays(im=images).image_random_jitter("im", size=(6, 6), symmetric=True)

    def run(seed, epoch):
        return np.stack(list(df.iterator("im_jitter", seed=seed, epoch=epoch)))

    first = run(0, 0)
    assert first.shape == (4, 6, 6, 3) and first.dtype == np.float32
    np.testing.assert_array_equal(first, run(0, 0))
    assert not np.array_equal(first, run(0, 1))


def test_softmax_crossentropy_takes_nnc_label_shape():
    """logits [16, 1, 1, 8] with labels [16]: dimension 0 is the batch (NNC's rule)."""
    logits = f32(16, 1, 1, 8, lo=-3, hi=3)
    labels = RNG.integers(0, 8, 16).astype(np.int32)
    loss, softmax = ops.softmax_crossentropy()(logits, labels)
    flat = logits.reshape(16, 8).astype(np.float64)
    log_p = flat - scipy.special.logsumexp(flat, axis=1, keepdims=True)
    close(np.asarray(loss).reshape(16), -log_p[np.arange(16), labels], 1e-5, 1e-6)
    close(np.asarray(softmax).reshape(16, 8), np.exp(log_p), 1e-5, 1e-6)


def test_a_model_with_nhwc_logits_trains_on_labels_of_the_batch_alone():
    """Model loss='softmax_crossentropy' on [16, 1, 1, 8] outputs takes labels [16]: the
    fit loss is the mean cross-entropy of the flattened logits."""
    import optax

    from fnnc.models import Conv, Input, Model

    x = Input()
    model = Model(x, Conv(8, 1, name="head")(x))
    images = f32(16, 1, 1, 3)
    labels = RNG.integers(0, 8, 16).astype(np.int32)
    model.compile(images, loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    logits = np.asarray(model.evaluate(images), np.float64).reshape(16, 8)
    log_p = logits - scipy.special.logsumexp(logits, axis=1, keepdims=True)
    want = -np.mean(log_p[np.arange(16), labels])
    np.testing.assert_allclose(float(model.fit(images, labels)), want, rtol=1e-5)
