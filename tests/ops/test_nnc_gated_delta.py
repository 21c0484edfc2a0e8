"""NNC's ``test/unit/nnc/gated_delta.tests.c``, translated: the command against NNC's
scalar reference (ported to NumPy), log decay against precomputed decay, prefill
against repeated one-step decode, and the reverse state checkpoints."""

import numpy as np

from fnnc import ops


def _value(n: int, multiplier: int, modulus: int, scale: float) -> np.ndarray:
    i = np.arange(n)
    return ((((i * multiplier) % modulus) - modulus // 2) * scale).astype(np.float32)


def _reference(q, k, v, log_decay, beta, state):
    """NNC's ``_gated_delta_reference``, loop for loop."""
    b_, t_, hk, _ = q.shape
    hv, dv = v.shape[2], v.shape[3]
    y = np.zeros(v.shape, np.float64)
    out = state.astype(np.float64).copy()
    for b in range(b_):
        for h in range(hv):
            g = h // (hv // hk)
            for d in range(dv):
                row = out[b, h, d]
                for t in range(t_):
                    row *= np.exp(log_decay[b, t, h])
                    memory = row @ k[b, t, g]
                    row += (v[b, t, h, d] - memory) * beta[b, t, h] * k[b, t, g]
                    y[b, t, h, d] = row @ q[b, t, g]
    return y, out


def _inputs(b, t, hk, dk, hv, dv, seeds):
    (qm, qn, qs), (km, kn, ks), (vm, vn, vs), (sm, sn, ss), decay_step, beta_mod = seeds
    q = _value(b * t * hk * dk, qm, qn, qs).reshape(b, t, hk, dk)
    k = _value(b * t * hk * dk, km, kn, ks).reshape(b, t, hk, dk)
    v = _value(b * t * hv * dv, vm, vn, vs).reshape(b, t, hv, dv)
    i = np.arange(b * t * hv)
    log_decay = (-decay_step * ((i % (7 if beta_mod == 5 else 5)) + 1)).astype(np.float32)
    beta = (0.15 + 0.07 * (i % 5) if beta_mod == 5 else 0.2 + 0.05 * (i % 4)).astype(np.float32)
    state = _value(b * hv * dv * dk, sm, sn, ss).reshape(b, hv, dv, dk)
    return q, k, v, log_decay.reshape(b, t, hv), beta.reshape(b, t, hv), state


def test_gated_delta_forward_with_grouped_heads():
    seeds = ((13, 31, 0.03), (17, 29, 0.025), (19, 37, 0.02), (23, 41, 0.01), 0.01, 5)
    q, k, v, log_decay, beta, state = _inputs(2, 4, 2, 5, 4, 3, seeds)
    want_y, want_state = _reference(q, k, v, log_decay, beta, state)
    y, s = ops.gated_delta()(q, k, v, log_decay, beta, state)
    np.testing.assert_allclose(y, want_y, atol=1e-6)
    np.testing.assert_allclose(s, want_state, atol=1e-6)
    y2, s2 = ops.gated_delta(log_decay_input=False)(q, k, v, np.exp(log_decay), beta, state)
    np.testing.assert_allclose(y2, want_y, atol=1e-6)
    np.testing.assert_allclose(s2, want_state, atol=1e-6)


def _decode(q, k, v, log_decay, beta, state):
    ys, states = [], []
    step = ops.gated_delta()
    for t in range(q.shape[1]):
        y, state = step(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1],
                        log_decay[:, t : t + 1], beta[:, t : t + 1], state)  # fmt: skip
        ys.append(np.asarray(y))
        states.append(np.asarray(state))
    return np.concatenate(ys, axis=1), states


def test_gated_delta_prefill_matches_repeated_decode():
    seeds = ((7, 23, 0.035), (11, 19, 0.03), (13, 29, 0.02), (17, 31, 0.01), 0.02, 4)
    inputs = _inputs(1, 5, 1, 4, 3, 2, seeds)
    y, s = ops.gated_delta()(*inputs)
    decode_y, states = _decode(*inputs)
    np.testing.assert_allclose(y, decode_y, atol=1e-6)
    np.testing.assert_allclose(s, states[-1], atol=1e-6)


def test_gated_delta_emits_reverse_state_checkpoints():
    seeds = ((7, 23, 0.035), (11, 19, 0.03), (13, 29, 0.02), (17, 31, 0.01), 0.02, 4)
    inputs = _inputs(1, 3, 1, 4, 2, 3, seeds)
    cmd = ops.gated_delta(state_checkpoint_count=2)
    (ys, hs) = cmd.shape(*(np.asarray(x) for x in inputs))
    assert ys.shape == (1, 3, 2, 3) and hs.shape == (1, 2 * 3, 3, 4)
    y, history = cmd(*inputs)
    decode_y, states = _decode(*inputs)
    np.testing.assert_allclose(y, decode_y, atol=1e-6)
    want = np.concatenate(states[::-1], axis=1)  # final first, heads of one state together
    np.testing.assert_allclose(history, want, atol=1e-6)
