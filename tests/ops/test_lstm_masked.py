"""ops.lstm(masked=True), NNC's variable sequence lengths: against an LSTM run per sample
on its unpadded sequence (a float64 jnp loop), forward and ``jax.vjp`` gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import ShapeError
from tests.helpers import assert_close, rand
from tests.ops.test_nnc_op_cases_8 import _jnp_lstm

B, T, I, H = 3, 5, 3, 4  # noqa: E741 (NNC's names: batch, time, input, hidden)
LENGTHS = np.array([5, 2, 0], np.int32)


def _unpadded(x, h0, c0, w, *, layers, dirs, proj):
    """One sample: x [1, t, I] with no padding (the jnp LSTM of the NNC cases); with no
    step the states stay the initial ones."""
    if x.shape[1] == 0:
        return jnp.zeros((1, 0, dirs * (proj or H))), h0, c0
    return _jnp_lstm(x, h0, c0, w, layers=layers, dirs=dirs, proj=proj)


def _oracle(x, h0, c0, *w, layers, dirs, proj):
    """Each sample run alone on its first lengths[b] steps; y zero-padded to T."""
    ys, hs, cs = [], [], []
    for b, n in enumerate(LENGTHS):
        y, h, c = _unpadded(x[b : b + 1, :n], h0[:, b : b + 1], c0[:, b : b + 1], w,
                            layers=layers, dirs=dirs, proj=proj)  # fmt: skip
        ys.append(jnp.pad(y, ((0, 0), (0, T - n), (0, 0))))
        hs.append(h)
        cs.append(c)
    return jnp.concatenate(ys), jnp.concatenate(hs, 1), jnp.concatenate(cs, 1)


def _case(layers, dirs, proj, seed=0):
    p = proj or H
    shapes = []
    for layer in range(layers):
        n_in = I if layer == 0 else dirs * p
        shapes += ([(4 * H, n_in), (4 * H, p), (4 * H,)] + [(p, H)] * bool(proj)) * dirs
    w = [rand(s, seed=seed + 10 + k, lo=-0.5, hi=0.5) for k, s in enumerate(shapes)]
    x = rand([B, T, I], seed=seed)
    h0 = rand([layers * dirs, B, p], seed=seed + 1)
    c0 = rand([layers * dirs, B, H], seed=seed + 2)
    return x, h0, c0, w


@pytest.mark.parametrize(("layers", "bidirectional", "proj"), [(2, True, 0), (1, True, 2)])
def test_masked_lstm_matches_each_sample_run_unpadded(layers, bidirectional, proj):
    dirs = 2 if bidirectional else 1
    x, h0, c0, w = _case(layers, dirs, proj)
    x[1, 2:] = 7.0  # padding: must not reach anything
    kw = dict(layers=layers, dirs=dirs, proj=proj)
    cmd = ops.lstm(num_layers=layers, bidirectional=bidirectional, proj_size=proj, masked=True)
    got = cmd(x, h0, c0, *w, LENGTHS)
    cts = [rand(np.shape(g), seed=40 + k) for k, g in enumerate(got)]
    opdef = cmd.definition
    grads = opdef.backward(tuple(cts), (x, h0, c0, *w, LENGTHS), got, **dict(cmd.params))
    with jax.enable_x64(True):
        f64 = [jnp.asarray(a, jnp.float64) for a in (x, h0, c0, *w)]
        want, pullback = jax.vjp(lambda *a: _oracle(*a, **kw), *f64)
        want_grads = pullback(tuple(jnp.asarray(c, jnp.float64) for c in cts))
        want, want_grads = [np.asarray(a) for a in want], [np.asarray(a) for a in want_grads]
    assert_close(got, want, atol=1e-5, what="y, h_T, c_T")
    assert grads[-1] is None  # lengths: not differentiated
    assert_close(grads[:-1], want_grads, rtol=1e-4, atol=1e-5, what="gradients")
    assert np.all(np.asarray(grads[0])[1, 2:] == 0) and np.all(np.asarray(grads[0])[2] == 0)


def test_masked_lstm_keeps_the_dropout_key_last_and_checks_lengths():
    x, h0, c0, w = _case(2, 1, 0)
    key = np.asarray(jax.random.key_data(jax.random.key(0)))
    train = ops.lstm(num_layers=2, dropout=0.5, masked=True)
    y, h, c = train(x, h0, c0, *w, LENGTHS, key)
    assert np.all(np.asarray(y)[1, 2:] == 0) and np.all(np.asarray(y)[2] == 0)
    assert_close((h[:, 2], c[:, 2]), (h0[:, 2], c0[:, 2]), rtol=0, atol=0)  # length 0
    with pytest.raises(ShapeError, match=r"lengths float32\[3\] should be int32\[3\]"):
        ops.lstm(num_layers=2, masked=True)(x, h0, c0, *w, LENGTHS.astype(np.float32))
    with pytest.raises(ShapeError, match=r"lengths int32\[2\] should be int32\[3\]"):
        ops.lstm(num_layers=2, masked=True)(x, h0, c0, *w, LENGTHS[:2])
