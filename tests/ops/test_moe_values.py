"""segmented_gemm, moe_routing and comm_all_to_all against NumPy ports of NNC's CPU
references (``ccv_nnc_segmented_gemm_cpu_ref.c``, ``ccv_nnc_moe_routing_cpu_ref.c``,
``ccv_nnc_comm_cpu_ref.c``), loop for loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import DTypeError, ShapeError


def _segmented_reference(a, indices, counts, w, bias, transpose_b):
    out = np.zeros((a.shape[0], w.shape[1] if transpose_b else w.shape[2]))
    off = 0
    for e, n in zip(indices, counts):
        we = w[e].T if transpose_b else w[e]
        for i in range(off, off + n):
            out[i] = a[i] @ we + (bias[e] if bias is not None else 0)
        off += n
    return out


@pytest.mark.parametrize("transpose_b", [False, True])
def test_segmented_gemm_matches_nnc_reference(transpose_b):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(9, 4)).astype(np.float32)
    w = rng.normal(size=(3, 5, 4) if transpose_b else (3, 4, 5)).astype(np.float32)
    bias = rng.normal(size=(3, 5)).astype(np.float32)
    indices, counts = np.array([2, 0, 2, 1], np.int32), np.array([3, 1, 2, 2], np.int32)
    got = ops.segmented_gemm(transpose_b=transpose_b)(a, indices, counts, w, bias)
    want = _segmented_reference(a, indices, counts, w, bias, transpose_b)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not np.asarray(got)[8].any()  # past the segments


def test_segmented_gemm_rejects_bad_inputs():
    a, w = np.zeros((4, 3), np.float32), np.zeros((2, 3, 5), np.float32)
    with pytest.raises(ShapeError, match="columns"):
        ops.segmented_gemm(transpose_b=True).shape(
            a, np.zeros(2, np.int32), np.zeros(2, np.int32), w
        )
    with pytest.raises(DTypeError, match="counts must be int32"):
        ops.segmented_gemm().shape(a, np.zeros(2, np.int32), np.zeros(2, np.float32), w)


def _routing_reference(logits, route, activation, kth, weight_scale, preselected, normalize=True):
    """``_ccv_nnc_moe_routing_forw`` for T > 1."""
    t, e = logits.shape
    pairs = []
    for token in range(t):
        prob = np.sqrt(np.maximum(logits[token], 0) + np.log1p(np.exp(-np.abs(logits[token]))))
        if preselected:
            selected = list(route[token])
        else:
            selected = [-1] * kth
            for expert in range(e):
                score = prob[expert] + route[expert]
                for slot in range(kth):
                    s = selected[slot]
                    if s < 0 or score > prob[s] + route[s]:
                        selected[slot + 1 :] = selected[slot:-1]
                        selected[slot] = expert
                        break
        # fnnc's rule for a preselected id outside [0, E): the pair is dropped (weight
        # 0, out of the sum and the groups, sorted last as expert E)
        ok = [0 <= s < e for s in selected]
        valid = sum(prob[s] for s, v in zip(selected, ok) if v)
        total = max(valid, 6.103515625e-5) if normalize else 1.0
        for slot, (s, v) in enumerate(zip(selected, ok)):
            pairs.append(
                (s, token, slot, prob[s] / total * weight_scale) if v else (e, token, slot, 0)
            )
    pairs.sort(key=lambda p: p[:3])
    groups = min(t * kth, e)
    experts, counts = [-1] * groups, [0] * groups
    g = -1
    for p in pairs:
        if p[0] == e:
            continue
        if g < 0 or experts[g] != p[0]:
            g += 1
            experts[g] = p[0]
        counts[g] += 1
    tokens = [p[1] for p in pairs]
    return activation[tokens], [p[3] for p in pairs], tokens, experts, counts


@pytest.mark.parametrize("preselected", [False, True])
def test_moe_routing_matches_nnc_reference(preselected):
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(6, 8)).astype(np.float32) * 2
    activation = rng.normal(size=(6, 5)).astype(np.float32)
    if preselected:
        route = np.stack([rng.permutation(8)[:3] for _ in range(6)]).astype(np.int32)
    else:
        route = rng.normal(size=(8,)).astype(np.float32)
    got = ops.moe_routing(kth=3, weight_scale=2.5, preselected=preselected)(
        logits, route, activation
    )
    want = _routing_reference(logits, route, activation, 3, 2.5, preselected)
    np.testing.assert_allclose(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    for g, w in zip(got[2:], want[2:]):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("kth", [1, 3])
def test_moe_routing_without_normalize_weights_by_the_probability_and_has_a_gradient(kth):
    """NNC's renormalised top-1 weight is p / p: constant, so a top-1 router never
    trained. normalize=False keeps p (Switch Transformer's gate)."""
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(5, 4)).astype(np.float32) * 2
    route = rng.normal(size=(4,)).astype(np.float32)
    act = rng.normal(size=(5, 3)).astype(np.float32)
    routing = ops.moe_routing(kth=kth, weight_scale=1.5, normalize=False)
    got = routing(logits, route, act)
    want = _routing_reference(logits, route, act, kth, 1.5, False, normalize=False)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    for g, w in zip(got[2:], want[2:]):
        np.testing.assert_array_equal(g, w)
    # d(sum c * w)/d logits: w = 1.5 * sqrt(softplus(l)) at each chosen (token, expert)
    c = rng.normal(size=got[1].shape).astype(np.float32)
    grad = jax.grad(lambda z: jnp.sum(routing(z, route, act)[1] * c))(logits)
    want_grad = np.zeros_like(logits)
    sig = 1 / (1 + np.exp(-logits.astype(np.float64)))
    soft = np.log1p(np.exp(logits.astype(np.float64)))
    experts = np.repeat(np.asarray(got[3]), np.asarray(got[4]))  # each row's expert
    for ci, token, expert in zip(c, np.asarray(got[2]), experts):
        want_grad[token, expert] += (
            ci * 1.5 * sig[token, expert] / (2 * np.sqrt(soft[token, expert]))
        )
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)
    if kth == 1:
        normalised = ops.moe_routing(kth=1, weight_scale=1.5)
        g1 = jax.grad(lambda z: jnp.sum(normalised(z, route, act)[1] * c))(logits)
        # NNC's formula: the documented zero gradient (d(p/p) is zero up to rounding)
        np.testing.assert_allclose(g1, 0, atol=1e-6)


@pytest.mark.parametrize("bad", [-1, 4, 7])
def test_moe_routing_drops_preselected_experts_out_of_range(bad):
    """An id outside [0, E) was read three ways: its weight from the clipped expert, its
    count at the wrapped index (-1 counted for expert E - 1) and its row sorted first,
    so the segments handed OTHER tokens' rows to the wrong experts."""
    rng = np.random.default_rng(11)
    logits = rng.normal(size=(3, 4)).astype(np.float32)
    act = rng.normal(size=(3, 5)).astype(np.float32)
    route = np.array([[0, bad], [1, 2], [bad, bad]], np.int32)  # token 2: no valid expert
    got = ops.moe_routing(kth=2, weight_scale=1.5, preselected=True)(logits, route, act)
    want = _routing_reference(logits, route, act, 2, 1.5, True)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    for g, w in zip(got[2:], want[2:]):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got[3], [0, 1, 2, -1])
    np.testing.assert_array_equal(got[4], [1, 1, 1, 0])
    # Through the experts and back: each token gets only its valid experts' rows.
    w = rng.normal(size=(4, 5, 2)).astype(np.float32)
    y = ops.segmented_gemm()(got[0], got[3], got[4], w) * np.asarray(got[1])[:, None]
    out = np.zeros((3, 2), np.float32)
    np.add.at(out, np.asarray(got[2]), np.asarray(y))
    prob = np.sqrt(np.log1p(np.exp(logits.astype(np.float64))))
    oracle = np.zeros((3, 2))
    for token, chosen in enumerate(route):
        ok = [c for c in chosen if 0 <= c < 4]
        for c in ok:
            oracle[token] += 1.5 * prob[token, c] / prob[token, ok].sum() * (act[token] @ w[c])
    np.testing.assert_allclose(out, oracle, rtol=1e-5, atol=1e-5)
    # A single token: valid pairs keep slot order, the dropped one goes last, count 0.
    one = ops.moe_routing(kth=3, preselected=True)(
        logits[:1], np.array([[2, bad, 0]], np.int32), act[:1]
    )
    np.testing.assert_array_equal(one[3], [2, 0, -1])
    np.testing.assert_array_equal(one[4], [1, 1, 0])
    p = prob[0, [2, 0]]
    np.testing.assert_allclose(one[1], [*(p / p.sum()), 0], rtol=1e-6)


def test_moe_routing_ties_go_to_the_lower_expert_and_unused_groups_are_minus_one():
    logits = np.zeros((2, 6), np.float32)  # every expert ties
    _gathered, weights, tokens, experts, counts = ops.moe_routing(kth=2)(
        logits, np.zeros(6, np.float32), np.eye(2, 3, dtype=np.float32)
    )
    np.testing.assert_array_equal(experts, [0, 1, -1, -1])
    np.testing.assert_array_equal(counts, [2, 2, 0, 0])
    np.testing.assert_array_equal(tokens, [0, 1, 0, 1])
    np.testing.assert_allclose(weights, 0.5)


def test_moe_routing_single_token_keeps_slot_order():
    logits = np.array([[0.0, 3.0, 1.0, 2.0]], np.float32)
    act = np.arange(3, dtype=np.float32)[None]
    full = ops.moe_routing(kth=3)(logits, np.zeros(4, np.float32), act)
    np.testing.assert_array_equal(full[3], [1, 3, 2])  # by score, not sorted by expert
    np.testing.assert_array_equal(full[4], [1, 1, 1])
    assert full[0].shape == (3, 3)
    compact = ops.moe_routing(kth=3, compact_single_token=True)(
        logits, np.zeros(4, np.float32), act
    )
    assert compact[0].shape == (1, 3)


def test_comm_all_to_all_matches_nnc_reference():
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(2, 6, 3)).astype(np.float32) for _ in range(3)]
    got = ops.comm_all_to_all(axis=1)(*xs)
    for j in range(3):
        for i in range(3):
            np.testing.assert_array_equal(got[j][:, 2 * i : 2 * i + 2], xs[i][:, 2 * j : 2 * j + 2])
    with pytest.raises(ShapeError, match="not divisible"):
        ops.comm_all_to_all(axis=0).shape(*xs)
