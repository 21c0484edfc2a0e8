"""NNC's tests (liuliu/ccv), the cases earlier ports left out: ``test/unit/nnc/
attention.tests.c`` (the unify-head fine-grained graph), ``sol_attention.tests.c`` (the
dense selection input, and routing with a real approximation window against NNC's CPU
oracle ``lib/nnc/cmd/sol_attention/ccv_nnc_sol_attention_cpu_ref.c`` ported to NumPy),
``gated_delta.tests.c`` (the in-place run and the cnnp model) and ``test/int/nnc/
lstm.tests.c`` (its GPU-only cases, whose CPU meaning is checked here against a NumPy
loop and ``jax.vjp`` of a jnp loop written below).

NNC's LSTM input is time-major (``batch_first = 0``: ``x [T, B, I]``) and its weights one
packed tensor; fnnc's ``ops.lstm`` is batch-first with one weight per matrix (its module
docstring), so the C tests' shapes appear here as ``x [B, T, I]`` and per-layer weights.
Each test names the C case it ports. Values are uniform in (0, 1] as NNC's
``dsfmt_genrand_open_close`` (from NumPy's generator), scaled where the C test's
(0, 1] weights would saturate every gate.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, compile
from fnnc.models import CommandLayer, Input, Model
from tests.helpers import assert_close, exact_on_cpu
from tests.ops.test_nnc_gated_delta import _reference, _value

f32 = np.float32


def _open_close(shape, seed: int) -> np.ndarray:
    return (1 - np.random.default_rng(seed).random(shape)).astype(f32)


# -- attention.tests.c -------------------------------------------------------------------------

B, S, H, D, DV = 2, 8, 2, 4, 3


def _unify_head_fine_grained():
    """NNC's graph: heads forward, q / 8, q kᵀ, softmax over a [B H S, S] view, times v,
    heads back, the [B, S, H, Dv] result viewed as [B, S, H Dv], then gemm with wᵀ + bias."""
    b = GraphBuilder()
    q, k = b.input((B, S, H, D), name="q"), b.input((B, S, H, D), name="k")
    v = b.input((B, S, H, DV), name="v")
    w, bias = b.input((H * DV, H * DV), name="w"), b.input((H * DV,), name="bias")
    heads = ops.transpose(perm=(0, 2, 1, 3))
    tq, tk, tv = (b.exec(heads, t) for t in (q, k, v))
    qk = b.exec(ops.gemm(transpose_b=True), b.exec(ops.scalar_mul(a=1 / 8), tq), tk, name="q @ k")
    s = b.tensor((B * H * S, S), name="s")
    b.exec(ops.softmax(), b.alias(qk, (B * H * S, S)), outputs=[s], name="softmax")
    c = b.exec(ops.gemm(), b.alias(s, (B, H, S, S)), tv, name="c")
    ct = b.exec(heads, c, name="ct")
    r = b.exec(ops.gemm(transpose_b=True), b.alias(ct, (B, S, H * DV)), w, bias, name="final")
    return b.build([r])


def _unify_head_command():
    b = GraphBuilder()
    q, k = b.input((B, S, H, D), name="q"), b.input((B, S, H, D), name="k")
    v = b.input((B, S, H, DV), name="v")
    w, bias = b.input((H * DV, H * DV), name="w"), b.input((H * DV,), name="bias")
    # NNC's NO_TENSOR_SYMBOL mask has no graph form in fnnc (a documented stance, see
    # test_nnc_op_cases_4.py): the neutral additive mask takes its place.
    mask = b.constant(np.zeros((1, 1, 1, 1), f32))
    r, _ = b.exec(ops.scaled_dot_product_attention(scale=1 / 8), q, k, v, mask, w, bias)
    return b.build([r])


def test_scaled_dot_product_attention_unify_head_vs_fine_grained_graph() -> None:
    """NNC: implement scaled dot product attention + unify head output with fine-grained
    symbolic graph. The command with w and bias (its fifth and sixth inputs, a zero mask)
    equals NNC's fine-grained graph and a NumPy oracle; q, k, v, w, bias from (0, 1]."""
    q, k = _open_close((B, S, H, D), 1), _open_close((B, S, H, D), 2)
    v = _open_close((B, S, H, DV), 3)
    w, bias = _open_close((H * DV, H * DV), 4), _open_close((H * DV,), 5)
    fine = compile(_unify_head_fine_grained())(q, k, v, w, bias)
    got = compile(_unify_head_command())(q, k, v, w, bias)
    assert np.shape(got) == (B, S, H * DV)
    assert_close(got, fine, rtol=1e-5, atol=1e-5)
    logits = np.einsum("bshd,bthd->bhst", q.astype(np.float64), k) / 8
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    joined = np.einsum("bhst,bthd->bshd", p, v).reshape(B, S, H * DV)
    assert_close(got, joined @ w.T.astype(np.float64) + bias, rtol=1e-5, atol=1e-5)
    eager, _ = ops.scaled_dot_product_attention(scale=1 / 8)(q, k, v, None, w, bias)
    assert_close(eager, fine, rtol=1e-5, atol=1e-5)


# -- sol_attention.tests.c ---------------------------------------------------------------------


def _nnc_sol(q, k, v, *, scale, tau, block, start, end, query_block=0, radius=1):
    """``_ccv_nnc_sol_attention_forw`` (CPU reference), loop for loop, in float64."""
    n_, t_, h_, _ = q.shape
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    qb_ = query_block or block
    j_count, qj_count = -(-t_ // block), -(-t_ // qb_)
    out = np.zeros(q.shape)
    g = scale * 1.4426950408889634
    for n in range(n_):
        for h in range(h_):
            qm = np.stack([q[n, j * qb_ : (j + 1) * qb_, h].mean(0) for j in range(qj_count)])
            km = np.stack([k[n, j * block : (j + 1) * block, h].mean(0) for j in range(j_count)])
            vm = np.stack([v[n, j * block : (j + 1) * block, h].mean(0) for j in range(j_count)])
            mean = km.mean(0)
            variance = np.maximum((km * km).mean(0) - mean * mean, 0)
            for r in range(t_):
                qb = r // qb_
                mu, var = qm[qb] @ mean, (qm[qb] * qm[qb]) @ variance
                threshold = g * mu + tau * np.sqrt(g * g * var + 1e-6)
                scores, values = [], []
                for j in range(j_count):
                    count = min(block, t_ - j * block)
                    routed = (
                        qb * qb_ < start
                        or min((qb + 1) * qb_, t_) > end
                        or j * block < start
                        or min((j + 1) * block, t_) > end
                        or abs(qb * qb_ // block - j) <= radius
                        or (qm[qb] @ km[j]) * g > threshold
                    )
                    if routed:
                        rows = slice(j * block, j * block + count)
                        scores += list(k[n, rows, h] @ q[n, r, h] * scale)
                        values += list(v[n, rows, h])
                    else:
                        scores.append(q[n, r, h] @ km[j] * scale + np.log(count))
                        values.append(vm[j])
                scores = np.asarray(scores)
                p = np.exp(scores - scores.max())
                out[n, r, h] = p @ np.asarray(values) / p.sum()
    return out


def test_cpu_sol_routing_with_an_approximation_window_matches_nnc_oracle() -> None:
    """NNC: CPU Sol summaries preserve uniform attention with protected boundaries and a
    partial block (and the CPU reference kernel it runs): with a non-zero scale, blocks
    inside [approximation_start, approximation_end) that are neither local nor above the
    threshold count as one pooled key (mean k and v, log(block length) added to its
    logit); the result equals NNC's CPU oracle and is not dense attention."""
    n, t, h, d = 1, 70, 2, 5
    rng = np.random.default_rng(51)
    q, k = (rng.uniform(-1, 1, size=(n, t, h, d)).astype(f32) for _ in range(2))
    v = (rng.uniform(-1, 1, size=(n, t, h, d)) * 10).astype(f32)
    params = dict(scale=0.7, tau=0.5, block=8, start=9, end=t - 3, query_block=4, radius=1)
    want = _nnc_sol(q, k, v, **params)
    cmd = ops.sol_attention(
        scale=0.7, tau=0.5, block_size=8, approximation_start=9, approximation_end=t - 3,
        query_block_size=4, local_block_radius=1,
    )  # fmt: skip
    got = np.asarray(cmd(q, k, v))
    dense = np.asarray(ops.scaled_dot_product_attention(scale=0.7)(q, k, v))
    assert np.abs(want - dense).max() > 1e-3  # some blocks really were pooled
    assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_cpu_sol_dense_selection_input_equals_dense_attention() -> None:
    """NNC: CPU Sol all-exact matches dense attention and infers output shape, its bypass
    half: with a fourth input ``is_dense_attention`` (int32 [1]) set to 1 and
    approximation_end = T, the command runs dense scaled dot-product attention with its
    scale (byte for byte in NNC, within 1e-6 here); set to 0 it routes as usual."""
    n, t, h, d = 2, 37, 2, 8
    rng = np.random.default_rng(42)
    q, k, v = (rng.uniform(-1, 1, size=(n, t, h, d)).astype(f32) for _ in range(3))
    cmd = ops.sol_attention(scale=0.25, tau=0.5, block_size=8, approximation_end=t)
    dense = np.asarray(ops.scaled_dot_product_attention(scale=0.25)(q, k, v))
    got = np.asarray(cmd(q, k, v, np.array([1], np.int32)))
    assert_close(got, dense, rtol=0, atol=1e-6)  # NNC: memcmp; XLA may fuse differently
    rtol, atol = exact_on_cpu(0, 1e-6)  # two programs: with the flag and without
    assert_close(cmd(q, k, v, np.array([0], np.int32)), cmd(q, k, v), rtol=rtol, atol=atol)


# -- gated_delta.tests.c -----------------------------------------------------------------------


def _grouped_heads_inputs():
    """ "gated delta forward with grouped heads": B 2, T 4, Hk 2, Dk 5, Hv 4, Dv 3."""
    bb, t, hk, dk, hv, dv = 2, 4, 2, 5, 4, 3
    q = _value(bb * t * hk * dk, 13, 31, 0.03).reshape(bb, t, hk, dk)
    k = _value(bb * t * hk * dk, 17, 29, 0.025).reshape(bb, t, hk, dk)
    v = _value(bb * t * hv * dv, 19, 37, 0.02).reshape(bb, t, hv, dv)
    i = np.arange(bb * t * hv)
    log_decay = (-0.01 * ((i % 7) + 1)).astype(f32).reshape(bb, t, hv)
    beta = (0.15 + 0.07 * (i % 5)).astype(f32).reshape(bb, t, hv)
    state = _value(bb * hv * dv * dk, 23, 41, 0.01).reshape(bb, hv, dv, dk)
    return q, k, v, log_decay, beta, state


def test_gated_delta_forward_in_place_state() -> None:
    """NNC: gated delta forward with grouped heads, its in-place run (the state tensor is
    both the sixth input and the second output): a compiled graph that donates the state
    input to the new state gives the scalar reference's output and state within 1e-6."""
    inputs = _grouped_heads_inputs()
    b = GraphBuilder()
    syms = [b.input(x.shape, name=n) for x, n in zip(inputs, ("q", "k", "v", "g", "beta", "s"))]
    y, s = b.exec(ops.gated_delta(), *syms, name="gated_delta")
    program = compile(b.build([y, s]), donate=["s"])
    want_y, want_s = _reference(*inputs)
    state = jnp.asarray(inputs[5])
    got_y, got_s = program(*inputs[:5], state)
    assert_close((got_y, got_s), (want_y, want_s), rtol=0, atol=1e-6)


def test_cnnp_gated_delta_forward() -> None:
    """NNC: ccv_cnnp gated delta forward. A model of the gated delta command (log decay,
    and a second one with precomputed decay) over six inputs, B 1, T 3, Hk 1, Dk 4, Hv 2,
    Dv 3, evaluated without gradients: output and state equal the scalar reference."""
    bb, t, hk, dk, hv, dv = 1, 3, 1, 4, 2, 3
    q = _value(bb * t * hk * dk, 5, 17, 0.04).reshape(bb, t, hk, dk)
    k = _value(bb * t * hk * dk, 7, 19, 0.03).reshape(bb, t, hk, dk)
    v = _value(bb * t * hv * dv, 11, 23, 0.025).reshape(bb, t, hv, dv)
    i = np.arange(bb * t * hv)
    log_decay = (-0.03 * ((i % 4) + 1)).astype(f32).reshape(bb, t, hv)
    beta = (0.12 + 0.06 * (i % 3)).astype(f32).reshape(bb, t, hv)
    state = _value(bb * hv * dv * dk, 13, 29, 0.01).reshape(bb, hv, dv, dk)
    want = _reference(q, k, v, log_decay, beta, state)
    for cmd, gate in (
        (ops.gated_delta(), log_decay),
        (ops.gated_delta(log_decay_input=False), np.exp(log_decay).astype(f32)),
    ):
        xs = [Input() for _ in range(6)]
        model = Model(xs, list(CommandLayer(cmd, outputs=2, name="gated_delta")(*xs)))
        inputs = [q, k, v, gate, beta, state]
        model.compile(inputs)
        got = model.evaluate(inputs, requires_grad=False)
        assert_close(tuple(got), want, rtol=0, atol=1e-6)


# -- test/int/nnc/lstm.tests.c -----------------------------------------------------------------

T, I_, HID = 5, 24, 24  # x [5, 1, 24] time-major in NNC: batch 1, 5 steps, 24 features


def _lstm_weights(layers, dirs, n_in, hidden, proj, seed=0):
    """Per layer and direction [w_ih [4H, In], w_hh [4H, P], bias [4H], (w_hr [P, H])],
    from (0, 1] mapped to (-0.2, 0.2] so the gates do not all saturate."""
    p = proj or hidden
    out = []
    for layer in range(layers):
        for _ in range(dirs):
            m = n_in if layer == 0 else dirs * p
            shapes = [(4 * hidden, m), (4 * hidden, p), (4 * hidden,)]
            shapes += [(p, hidden)] if proj else []
            for s in shapes:
                seed += 1
                out.append((_open_close(s, seed) - 0.5) * 0.4)
    return out


def _jnp_lstm(x, h0, c0, w, *, layers, dirs, proj, xp=jnp):
    """The LSTM written out (gates i, f, g, o; LSTMP projection), batch-first; with
    ``xp=np`` the float64 oracle for values, with jnp the one for gradients (``jax.vjp``)."""

    def sigmoid(a):
        return 1 / (1 + xp.exp(-a))

    per = 4 if proj else 3
    inp, hs, cs = x, [], []
    for layer in range(layers):
        outs = []
        for r in range(dirs):
            u = layer * dirs + r
            w_ih, w_hh, bias = w[u * per : u * per + 3]
            w_hr = w[u * per + 3] if proj else None
            h, c = h0[u], c0[u]
            ys = [None] * x.shape[1]
            for t in range(x.shape[1]) if r == 0 else range(x.shape[1] - 1, -1, -1):
                gates = inp[:, t] @ w_ih.T + h @ w_hh.T + bias[None]
                gi, gf, gg, go = xp.split(gates, 4, axis=-1)
                c = sigmoid(gf) * c + sigmoid(gi) * xp.tanh(gg)
                h = sigmoid(go) * xp.tanh(c)
                if w_hr is not None:
                    h = h @ w_hr.T
                ys[t] = h
            outs.append(xp.stack(ys, 1))
            hs.append(h)
            cs.append(c)
        inp = xp.concatenate(outs, axis=-1)
    return inp, xp.stack(hs), xp.stack(cs)


def _lstm_case(layers=6, bidirectional=False, proj=0):
    dirs = 2 if bidirectional else 1
    p = proj or HID
    x = _open_close((1, T, I_), 0)
    h0 = _open_close((layers * dirs, 1, p), 1)
    c0 = _open_close((layers * dirs, 1, HID), 2)
    return x, h0, c0, _lstm_weights(layers, dirs, I_, HID, proj)


def _lstm_oracle(x, h0, c0, w, **kw):
    args = [np.asarray(a, np.float64) for a in (x, h0, c0, *w)]
    return _jnp_lstm(*args[:3], args[3:], xp=np, **kw)


def test_lstm_forward_six_layers() -> None:
    """NNC: LSTM forward. CMD_LSTM_FORWARD(24, 0, 6, 1, ...): hidden 24, 6 layers, bias,
    one direction, no dropout; x [1, 5, 24] (batch-first), hx and cx [6, 1, 24]. y
    [1, 5, 24], hy and cy [6, 1, 24] equal the loop computed in float64."""
    x, h0, c0, w = _lstm_case()
    y, hy, cy = ops.lstm(num_layers=6)(x, h0, c0, *w)
    assert (np.shape(y), np.shape(hy), np.shape(cy)) == ((1, T, HID), (6, 1, HID), (6, 1, HID))
    want = _lstm_oracle(x, h0, c0, w, layers=6, dirs=1, proj=0)
    assert_close((y, hy, cy), want, rtol=1e-5, atol=1e-6)


def test_lstm_forward_with_dropout() -> None:
    """NNC: LSTM forward with dropout. CMD_LSTM_FORWARD(24, 0, 6, 1, 0, 0, 0.5, 0): dropout
    0.5 in training falls between layers (cuDNN's semantics), so layer 0's hy and cy are
    the dropout-free ones while the output differs; is_test turns dropout off."""
    x, h0, c0, w = _lstm_case()
    key = np.asarray(jax.random.key_data(jax.random.key(0)))
    y, hy, cy = ops.lstm(num_layers=6, dropout=0.5)(x, h0, c0, *w, key)
    want = _lstm_oracle(x, h0, c0, w, layers=6, dirs=1, proj=0)
    assert np.shape(y) == (1, T, HID)
    assert_close((hy[0], cy[0]), (want[1][0], want[2][0]), rtol=1e-5, atol=1e-6)
    assert np.abs(np.asarray(y) - want[0]).max() > 1e-4
    test_mode = ops.lstm(num_layers=6, dropout=0.5, is_test=True)(x, h0, c0, *w)
    assert_close(test_mode, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["one-way", "bidirectional"])
def test_lstm_forward_with_projection(bidirectional) -> None:
    """NNC: LSTM forward with projection, and LSTM forward with projection, bidirectional.
    CMD_LSTM_FORWARD(24, 12, 6, 1, 0, bidirectional, 0.5, 0): hidden 24 projected to 12;
    y [1, 5, 12] ([1, 5, 24] with both directions), hy [6 D, 1, 12], cy [6 D, 1, 24].
    Shapes in training (dropout 0.5); values with is_test against the float64 loop."""
    dirs = 2 if bidirectional else 1
    x, h0, c0, w = _lstm_case(bidirectional=bidirectional, proj=12)
    kw = dict(num_layers=6, bidirectional=bidirectional, proj_size=12, dropout=0.5)
    key = np.asarray(jax.random.key_data(jax.random.key(0)))
    shapes = ops.lstm(**kw).shape(x, h0, c0, *w, key)
    assert [tuple(s.shape) for s in shapes] == [(1, T, 12 * dirs), (6 * dirs, 1, 12),
                                                (6 * dirs, 1, HID)]  # fmt: skip
    got = ops.lstm(**kw, is_test=True)(x, h0, c0, *w)
    want = _lstm_oracle(x, h0, c0, w, layers=6, dirs=dirs, proj=12)
    assert_close(got, want, rtol=1e-5, atol=1e-6)


def _lstm_backward_graph(seeds: str):
    """y, hy, cy = lstm(x, hx, cx, w...) for NNC's 6-layer case, then the backward for
    the seeds named in ``seeds`` ("y", "yhc"), with respect to x, hx, cx and the weights."""
    x, h0, c0, w = _lstm_case()
    b = GraphBuilder()
    xs = [b.input(a.shape, name=n) for a, n in ((x, "x"), (h0, "hx"), (c0, "cx"))]
    ws = [b.input(a.shape, name=f"w{i}") for i, a in enumerate(w)]
    y, hy, cy = b.exec(ops.lstm(num_layers=6), *xs, *ws, name="lstm")
    fs = [y, hy, cy][: len(seeds)]
    dfs = [b.input(s.shape, name=f"d{n}") for s, n in zip(fs, ("y", "hy", "cy"))]
    graph, _ = backward(b.build([y, hy, cy]), fs, [*xs, *ws], df=dfs)
    return graph, (x, h0, c0, w)


def _lstm_vjp(x, h0, c0, w, cotangents):
    def f(x, h0, c0, *w):
        return _jnp_lstm(x, h0, c0, list(w), layers=6, dirs=1, proj=0)

    _, pullback = jax.vjp(f, x, h0, c0, *w)
    return pullback(cotangents)


def test_lstm_backward() -> None:
    """NNC: LSTM backward. With seeds dy [1, 5, 24], dhy and dcy [6, 1, 24] from (0, 1],
    the backward of the 6-layer LSTM gives dx, dhx, dcx and dw equal to ``jax.vjp`` of the
    loop."""
    graph, (x, h0, c0, w) = _lstm_backward_graph("yhc")
    dy, dhy, dcy = _open_close(x.shape, 10), _open_close(h0.shape, 11), _open_close(c0.shape, 12)
    got = compile(graph)(x, h0, c0, *w, dy, dhy, dcy)[3:]
    want = _lstm_vjp(x, h0, c0, w, (dy, dhy, dcy))
    assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_lstm_backward_without_dhy_dcy_dhx_dcx() -> None:
    """NNC: LSTM backward without dhy, dcy, dhx, dcx. Only dy seeds the backward: dx and
    dw equal ``jax.vjp`` of the loop with zero cotangents for hy and cy (dhx and dcx are
    computed too and checked the same way)."""
    graph, (x, h0, c0, w) = _lstm_backward_graph("y")
    dy = _open_close(x.shape, 10)
    got = compile(graph)(x, h0, c0, *w, dy)[3:]
    want = _lstm_vjp(x, h0, c0, w, (dy, np.zeros_like(h0), np.zeros_like(c0)))
    assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_lstm_forward_and_backward_without_hx_cx() -> None:
    """NNC: LSTM forward without hx, cx, hy, cy, and LSTM backward without hx, cx, hy, cy,
    dhy, dcy, dhx, dcx. Without initial states the LSTM starts from zeros: the forward
    equals the one given zero hx and cx, and so do dx and dw for a seed dy (through
    ``jax.vjp`` of the eager command: a graph node cannot leave out a middle input)."""
    x, h0, c0, w = _lstm_case()
    zeros_h, zeros_c = np.zeros_like(h0), np.zeros_like(c0)
    cmd = ops.lstm(num_layers=6)
    y = cmd(x, None, None, *w)[0]
    want = _lstm_oracle(x, zeros_h, zeros_c, w, layers=6, dirs=1, proj=0)
    assert_close(y, want[0], rtol=1e-5, atol=1e-6)
    seed = _open_close(x.shape, 10)
    _, pullback = jax.vjp(lambda x, *w: cmd(x, None, None, *w)[0], x, *w)
    got = pullback(seed)
    full = _lstm_vjp(x, zeros_h, zeros_c, w, (seed, zeros_h, zeros_c))
    assert_close(got, (full[0], *full[3:]), rtol=1e-4, atol=1e-5)
