"""Audit 10, recurrent ops: gated_delta's 16-bit forms against a float64 NumPy loop of
NNC's scalar reference (``ccv_nnc_gated_delta_cpu_ref.c``)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError, DTypeError, ShapeError


def _gated_delta_f64(q, k, v, log_decay, beta, state):
    """NNC's recurrence in float64: ``S = e^g S; S += beta (v - S k) k^T; y = S q``."""
    r = v.shape[2] // q.shape[2]
    qe, ke = np.repeat(q, r, axis=2), np.repeat(k, r, axis=2)
    s, ys = state.copy(), np.zeros(v.shape)
    for t in range(q.shape[1]):
        s = s * np.exp(log_decay[:, t])[..., None, None]
        memory = np.einsum("bhvk,bhk->bhv", s, ke[:, t])
        s = s + ((v[:, t] - memory) * beta[:, t][..., None])[..., None] * ke[:, t][:, :, None]
        ys[:, t] = np.einsum("bhvk,bhk->bhv", s, qe[:, t])
    return ys, s


@pytest.fixture(scope="module")
def delta_inputs():
    """128 steps with a slow decay (a long memory), each value exact in bfloat16."""
    rng = np.random.default_rng(0)
    b, t, hk, dk, hv, dv = 1, 128, 1, 8, 2, 4
    k = rng.normal(size=(b, t, hk, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    raw = [rng.normal(size=(b, t, hk, dk)) * 0.3, k, rng.normal(size=(b, t, hv, dv)),
           -rng.uniform(0.001, 0.02, (b, t, hv)), rng.uniform(0.2, 0.8, (b, t, hv)),
           rng.normal(size=(b, hv, dv, dk)) * 0.1]  # fmt: skip
    exact = [np.asarray(jnp.asarray(a, jnp.bfloat16), np.float64) for a in raw]
    return exact, _gated_delta_f64(*exact)


def _rel(got, want):
    return np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max()


@pytest.mark.parametrize("state_type", ["bfloat16", "float32"])
def test_gated_delta_16bit_runs_the_state_in_float32(delta_inputs, state_type):
    """NNC's 16-bit form (bfloat16 q, k, v; float32 log_decay, beta, state, the types its
    MPS kernel requires) raised a DTypeError ('inputs must share one dtype'), and an
    all-bfloat16 call rounded the state to bfloat16 at every step: y 0.0089 off the float64
    recurrence (relative), 5x the 0.0017 of a float32 state rounded once."""
    inputs, (want_y, want_state) = delta_inputs
    wide = jnp.float32 if state_type == "float32" else jnp.bfloat16
    args = [jnp.asarray(a, jnp.bfloat16) for a in inputs[:3]]
    args += [jnp.asarray(a, jnp.float32).astype(wide) for a in inputs[3:]]
    y, state = ops.gated_delta()(*args)
    assert (y.dtype, state.dtype) == (jnp.bfloat16, np.dtype(wide))
    assert _rel(y, want_y) < 0.003
    assert _rel(state, want_state) < (0.004 if state_type == "bfloat16" else 1e-5)


def test_gated_delta_16bit_rejects_other_mixed_types():
    q = jnp.zeros((1, 2, 1, 2), jnp.bfloat16)
    gate = jnp.zeros((1, 2, 1), jnp.float16)
    state = jnp.zeros((1, 1, 2, 2), jnp.float32)
    with pytest.raises(DTypeError, match=r"log_decay float16\[1, 2, 1\] should be bfloat16"):
        ops.gated_delta()(q, q, q, gate, gate, state)
    with pytest.raises(DTypeError, match="share one dtype"):
        ops.gated_delta()(q, q.astype(jnp.float32), q, gate, gate, state)


def _sig(x):
    return 1 / (1 + np.exp(-x))


def _hc_split_f64(mix, scale, base, residual, n, iterations, eps):
    """NNC's ``_ccv_nnc_hyper_connection_split_row`` (cpu_ref) in float64, then the
    pre-weighted sum of the residual streams."""
    z = mix * np.repeat(scale, [n, n, n * n]) + base
    pre, post = _sig(z[..., :n]) + eps, 2 * _sig(z[..., n : 2 * n])
    logits = z[..., 2 * n :].reshape(*z.shape[:-1], n, n)
    comb = np.exp(logits - logits.max(-1, keepdims=True))
    comb = comb / comb.sum(-1, keepdims=True) + eps
    comb = comb / (comb.sum(-2, keepdims=True) + eps)
    for _ in range(iterations - 1):
        comb = comb / (comb.sum(-1, keepdims=True) + eps)
        comb = comb / (comb.sum(-2, keepdims=True) + eps)
    weighted = np.einsum("...id,...i->...d", residual, pre)
    return post, comb.reshape(*z.shape[:-1], n * n), weighted


def test_hyper_connection_16bit_rounds_once():
    """bfloat16 mHC split: computed in float32 and rounded once, nearly every output is
    the float64 result rounded to bfloat16 (a bfloat16 Sinkhorn matched 69% of post)."""
    rng = np.random.default_rng(1)
    n, rows = 4, 16
    raw = [rng.normal(size=(rows, 2 * n + n * n)), rng.normal(size=3),
           rng.normal(size=2 * n + n * n), rng.normal(size=(rows, n, 8))]  # fmt: skip
    exact = [np.asarray(jnp.asarray(a, jnp.bfloat16), np.float64) for a in raw]
    want = _hc_split_f64(*exact, n, 20, 1e-6)
    got = ops.hyper_connection(count=n)(*(jnp.asarray(a, jnp.bfloat16) for a in exact))
    for g, w in zip(got, want):
        assert g.dtype == jnp.bfloat16
        rounded = np.asarray(jnp.asarray(w, jnp.float32).astype(jnp.bfloat16), np.float64)
        same = np.mean(np.asarray(g, np.float64) == rounded)
        assert same > 0.95, f"{same:.3f} of the outputs are the float64 result rounded"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"sinkhorn_iterations": 0}, "sinkhorn_iterations=0; expected at least 1"),
        ({"epsilon": -1e-6}, r"epsilon=-1e-06; expected a number >= 0"),
        ({"epsilon": float("nan")}, r"epsilon=nan; expected a number >= 0"),
    ],
)
def test_hyper_connection_split_rejects_nnc_invalid_parameters(params, message):
    """NNC's split returns EXEC_INVALID for these; fnnc had run them (0 iterations as 1,
    a negative epsilon making comb negative, NaN everywhere)."""
    mix, scale, base = jnp.zeros((2, 8)), jnp.ones(3), jnp.zeros(8)
    with pytest.raises(CommandError, match=message):
        ops.hyper_connection(count=2, **params)(mix, scale, base)


def test_gated_delta_without_key_heads_is_a_shape_error():
    """Hk = 0 (NNC asserts Hk > 0) reached ``hv % hk`` in the shape rule: a RuleError
    wrapping ZeroDivisionError instead of the shapes expected."""
    z = lambda *s: jnp.zeros(s, jnp.float32)
    with pytest.raises(ShapeError, match=r"Hk >= 1 divides Hv.*got q float32\[1, 2, 0, 2\]"):
        ops.gated_delta()(z(1, 2, 0, 2), z(1, 2, 0, 2), z(1, 2, 2, 2), z(1, 2, 2), z(1, 2, 2),
                          z(1, 2, 2, 2))  # fmt: skip


def test_lstm_without_c0_names_a_w_hh_that_is_not_4h():
    """Without c0 the hidden size is w_hh's rows / 4: w_hh [15, 4] was read as H = 3 and
    blamed the right w_ih ('w_ih float32[16, 3] should be [12, 3]')."""
    x, w_ih = jnp.ones((2, 3, 3)), jnp.ones((16, 3))
    with pytest.raises(ShapeError, match=r"w_hh float32\[15, 4\] should be \[4H, P\]"):
        ops.lstm()(x, None, None, w_ih, jnp.ones((15, 4)))
    y = ops.lstm()(x, None, None, w_ih, jnp.zeros((16, 4)))[0]  # H = 4, zero states
    i, _, g, o = np.split(np.ones(3) @ np.ones((3, 16)), 4)  # step 0 from zeros
    c0 = 1 / (1 + np.exp(-i)) * np.tanh(g)
    np.testing.assert_allclose(y[0, 0], 1 / (1 + np.exp(-o)) * np.tanh(c0), rtol=1e-6)
