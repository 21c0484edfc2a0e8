"""NNC's GPU integration tests (liuliu/ccv ``test/int/nnc/cudnn.tests.c``,
``cublas.tests.c`` and ``mpsblas.tests.c``): the cases no other fnnc port covers.

The rest of these files is ported in ``test_nnc_int_cudnn*.py``, ``test_nnc_int_blas*.py``,
``test_nnc_op_cases*.py`` (the float32 gemms, NNC's ``cblas.tests.c`` twins) and
``test_nnc_fidelity.py`` (attention with a unify head). What is left:

* ``mpsblas.tests.c``'s forward gemms with a *batched* right operand (the cblas twins
  share it between the batches) and its backward gemms of batched operands *without a
  bias* (``CMD_GEMM_BACKWARD`` with two inputs and two outputs), including both operands
  transposed, which the cblas cases only run with a shared ``b``;
* ``mpsblas.tests.c``'s attention, whose GPU side spells ``is_causal`` as an explicit
  additive ``[1, 1, R, C]`` mask of ``-FLT_MAX`` (bottom-right aligned), on its trials
  (odd head size 191, 13 heads, grouped heads 32:8, R > C causal), and its attention
  backward called from the output gradient and q, k, v alone (no forward output);
* ``cudnn.tests.c``'s "only gradient" norms *without scale / bias*: a symbolic graph of
  one norm with x as its only input, differentiated with respect to x.

Oracles: NNC's hand-written products (transcribed), NumPy in float64 and NNC's CPU
reference written out (``ccv_nnc_scaled_dot_product_attention_cpu_ref.c``), ``jax.vjp``
of a float64 ``jnp`` formula for the norms.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, compile
from tests.helpers import assert_close

f32, f64 = np.float32, np.float64


def _t(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2).copy()


# -- mpsblas.tests.c: batched gemms with a batched right operand ----------------------------

A2 = np.array([[[1, 2], [3, 4], [5, 6], [7, 8]], [[2, 3], [4, 5], [6, 7], [8, 9]]], f32)
B_BATCHED = np.array([[7, 8, 9], [10, 11, 12], [8, 9, 10], [11, 12, 13]], f32).reshape(2, 2, 3)
B_WIDE = np.array([[7, 8, 9], [10, 11, 12], [80, 90, 10], [110, 120, 13]], f32).reshape(2, 2, 3)

GEMM_FORWARD = {
    # name: (a as stored, b as stored, transpose_a, transpose_b, untransposed b, C's spots)
    # "gemm no transpose batch 2": b [2, 2, 3], both batches their own.
    "no transpose batch 2": (
        A2,
        B_BATCHED,
        False,
        False,
        B_BATCHED,
        {(0, 3, 2): 7 * 9 + 8 * 12, (1, 0, 0): 2 * 8 + 3 * 11, (1, 3, 2): 8 * 10 + 9 * 13},
    ),
    # "gemm transpose a batch 2, with bias": a stored [2, 2, 4]; no bias despite the name.
    "transpose a batch 2": (
        _t(A2),
        B_BATCHED,
        True,
        False,
        B_BATCHED,
        {(0, 1, 0): 3 * 7 + 4 * 10, (1, 2, 1): 6 * 9 + 7 * 12, (1, 3, 2): 8 * 10 + 9 * 13},
    ),
    # "gemm transpose b batch 2": b stored [2, 3, 2], no bias.
    "transpose b batch 2": (
        A2,
        _t(B_WIDE),
        False,
        True,
        B_WIDE,
        {(0, 0, 0): 1 * 7 + 2 * 10, (1, 0, 0): 2 * 80 + 3 * 110, (1, 3, 2): 8 * 10 + 9 * 13},
    ),
}


@pytest.mark.parametrize("case", sorted(GEMM_FORWARD), ids=lambda c: c.replace(" ", "-"))
def test_batched_gemm_with_batched_right_operand(case) -> None:
    """NNC: "gemm no transpose batch 2", "gemm transpose a batch 2, with bias" and "gemm
    transpose b batch 2" (mpsblas.tests.c): a [2, 4, 2] (stored [2, 2, 4] when transposed)
    times a per-batch b [2, 2, 3] (stored [2, 3, 2] when transposed), no bias; the batches
    do not share b. Exact, against NNC's hand-written products."""
    a, b, ta, tb, b_plain, spots = GEMM_FORWARD[case]
    got = np.asarray(ops.gemm(transpose_a=ta, transpose_b=tb)(a, b))
    assert got.shape == (2, 4, 3)
    np.testing.assert_array_equal(got, np.matmul(A2.astype(f64), b_plain.astype(f64)))
    for index, value in spots.items():
        assert got[index] == value, index


# -- mpsblas.tests.c: batched backward gemms without a bias ----------------------------------

G = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]], f32)
G = np.stack([G, 10 * G])  # NNC's second batch is the first times 10
GA = np.array(
    [[13, 14], [15, 16], [17, 18], [19, 20], [131, 141], [151, 161], [171, 181], [191, 201]], f32
).reshape(2, 4, 2)
GB = np.array([[21, 22, 23], [24, 25, 26], [212, 222, 232], [242, 252, 262]], f32).reshape(2, 2, 3)


@pytest.mark.parametrize(
    "ta, tb",
    [(False, False), (False, True), (True, True)],
    ids=["no-transpose", "transpose-b", "transpose-a-and-b"],
)
def test_batched_backward_gemm_without_bias(ta, tb) -> None:
    """NNC: "backward gemm with no transpose batch 2, batched b, no bias", "backward gemm with
    transpose b batch 2, batched b, no bias" and "backward gemm with transpose a and b batch 2,
    batch b, no bias" (mpsblas.tests.c): GEMM_BACKWARD of (g, a, b) with no bias input gives
    exactly (h, db), h = g bᵀ and db = aᵀ g per batch, each stored transposed where its
    operand is."""
    a, b = (_t(GA) if ta else GA), (_t(GB) if tb else GB)
    cmd = ops.gemm(transpose_a=ta, transpose_b=tb)
    grads = cmd.definition.backward((G,), (a, b), (None,), **cmd.kwargs)
    assert len(grads) == 2
    h, db = (np.asarray(t) for t in grads)
    g64, a64, b64 = G.astype(f64), GA.astype(f64), GB.astype(f64)
    want_h, want_db = g64 @ _t(b64), _t(a64) @ g64
    np.testing.assert_array_equal(h, _t(want_h) if ta else want_h)
    np.testing.assert_array_equal(db, _t(want_db) if tb else want_db)
    h_plain, db_plain = (_t(h) if ta else h), (_t(db) if tb else db)
    # NNC's hand-written htp / dbtp entries.
    assert h_plain[0, 0, 0] == 1 * 21 + 2 * 22 + 3 * 23
    assert h_plain[1, 3, 1] == 100 * 242 + 110 * 252 + 120 * 262
    assert db_plain[0, 1, 2] == 3 * 14 + 6 * 16 + 9 * 18 + 12 * 20
    assert db_plain[1, 0, 0] == 10 * 131 + 40 * 151 + 70 * 171 + 100 * 191


# -- mpsblas.tests.c: attention, causal as an explicit -FLT_MAX mask -------------------------

ATTENTION_MPS = [
    # NNC's (B, R, C, Hq, Hk, D, is_causal) trials; the first three shrunk in B, R and C
    # (NNC: 32x128x128 with 8 heads of 64; 32x128x128, 32:8 heads of 128, causal;
    # 3x61x49, 13 heads of 191), the last two NNC's own.
    (2, 16, 16, 2, 2, 64, False),
    (1, 12, 12, 8, 2, 128, True),
    (1, 9, 7, 13, 13, 191, False),
    (2, 6, 2, 3, 3, 4, True),
    (1, 2, 1, 1, 1, 8, False),
]


def _ramp(*shape) -> np.ndarray:
    """NNC's fill: element i of n is i / n."""
    n = int(np.prod(shape))
    return (np.arange(n, dtype=f32) / f32(n)).reshape(shape)


def _causal_mask(r: int, c: int) -> np.ndarray:
    """The C test's GPU mask: 0, and -FLT_MAX at key j > i - R + C of query i."""
    mask = np.zeros((1, 1, r, c), f32)
    for i in range(r - 1):
        mask[0, 0, i, max(i - r + c + 1, 0) :] = -np.finfo(f32).max
    return mask


def _attention_cpu_ref(q, k, v, scale, mask=None, is_causal=False):
    """``_ccv_nnc_scaled_dot_product_attention_forw`` in float64: the mask is added to
    ``scale * q.k``; with ``is_causal`` query i keeps keys j < i - R + C + 1, and a query
    that keeps none gets zeros."""
    q, k, v = (np.asarray(t, f64) for t in (q, k, v))
    r, h, c = q.shape[1], q.shape[2], k.shape[1]
    k, v = np.repeat(k, h // k.shape[2], axis=2), np.repeat(v, h // v.shape[2], axis=2)
    logits = np.einsum("bshd,bthd->bhst", q, k) * scale
    if mask is not None:
        logits = logits + mask.astype(f64)
    keep = np.ones((r, c), bool)
    if is_causal:
        keep = np.arange(c)[None, :] < np.arange(r)[:, None] - r + c + 1
    logits = np.where(keep, logits, -np.inf)
    top = logits.max(-1, keepdims=True)
    e = np.exp(logits - np.where(np.isfinite(top), top, 0))
    total = e.sum(-1, keepdims=True)
    return np.einsum("bhst,bthd->bshd", e / np.where(total == 0, 1, total), v)


@pytest.mark.parametrize("trial", ATTENTION_MPS, ids=lambda t: "-".join(map(str, t)))
def test_attention_with_explicit_causal_mask(trial) -> None:
    """NNC: "scaled dot product attention with mps": q, k, v ramps i / n, scale 1 / sqrt(D);
    the CPU side runs SCALED_DOT_PRODUCT_ATTENTION(scale, is_causal), the GPU side
    (scale, 0) with, for causal trials, the additive [1, 1, R, C] mask of -FLT_MAX. Both
    spellings agree on every query that sees a key (1e-5), eagerly and compiled. A query
    that sees none (R > C: the first R - C) gets zeros from ``is_causal``, but from the
    -FLT_MAX mask NNC's CPU reference gets the plain mean of v (the mask swallows the
    logits, the softmax is uniform); fnnc's float mask follows that arithmetic."""
    batch, r, c, hq, hk, d, causal = trial
    q, k, v = _ramp(batch, r, hq, d), _ramp(batch, c, hk, d), _ramp(batch, c, hk, d)
    scale = float(f32(1.0) / np.sqrt(f32(d)))
    cpu = ops.scaled_dot_product_attention(scale=scale, is_causal=causal)(q, k, v)
    assert_close(cpu, _attention_cpu_ref(q, k, v, scale, is_causal=causal), rtol=1e-5, atol=1e-6)
    gpu_cmd = ops.scaled_dot_product_attention(scale=scale, is_causal=False)
    gpu = np.asarray(gpu_cmd(q, k, v, _causal_mask(r, c)) if causal else gpu_cmd(q, k, v))
    seen = max(r - c, 0) if causal else 0  # queries before this one see no key
    assert_close(gpu[:, seen:], np.asarray(cpu)[:, seen:], rtol=1e-5, atol=1e-5)
    if seen:
        np.testing.assert_array_equal(np.asarray(cpu)[:, :seen], 0)
        mean_v = np.repeat(v.astype(f64), hq // hk, axis=2).mean(1, keepdims=True)
        want = np.broadcast_to(mean_v, (batch, seen, hq, d))
        assert_close(gpu[:, :seen], want, rtol=1e-5, atol=1e-6)
        assert_close(
            gpu, _attention_cpu_ref(q, k, v, scale, mask=_causal_mask(r, c)), rtol=1e-5, atol=1e-6
        )
    if causal:  # the mask as a graph input, compiled (NNC's GPU side runs it so)
        b = GraphBuilder()
        syms = [b.input(t.shape, name=n) for n, t in zip("qkvm", (q, k, v, _causal_mask(r, c)))]
        graph = b.build([b.exec(gpu_cmd, *syms)])
        assert_close(compile(graph)(q, k, v, _causal_mask(r, c)), gpu, rtol=1e-6, atol=1e-6)


# -- cudnn.tests.c: only gradient of layer / group norm without scale / bias ----------------


def _uniform(shape, seed: int, lo: float = 0.0, hi: float = 1.0) -> np.ndarray:
    """NNC's ``dsfmt_genrand_open_close() * (hi - lo) + lo`` draws."""
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(f32)


def _layer_norm64(x):
    mu = jnp.mean(x, axis=(1, 2, 3), keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=(1, 2, 3), keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-4)


def _group_norm64(x):
    xs = jnp.reshape(x, (2, 4, 4, 2, 10))  # [batch, group, member, h, w]
    mu = jnp.mean(xs, axis=2, keepdims=True)
    var = jnp.mean(jnp.square(xs - mu), axis=2, keepdims=True)
    return jnp.reshape((xs - mu) / jnp.sqrt(var + 1e-5), x.shape)


NORMS = {
    # LAYER_NORM(1e-4, elementwise_affine 0, axes 1, 2, 3) on [2, 2, 2, 10];
    # GROUP_NORM(group_axis 1, 4 groups, 1e-5, elementwise_affine 0) on [2, 16, 2, 10].
    "layer_norm": (
        ops.layer_norm(axes=(1, 2, 3), epsilon=1e-4),
        (2, 2, 2, 10),
        (2, 1, 1, 1),
        _layer_norm64,
    ),
    "group_norm": (
        ops.group_norm(groups=4, axis=1, epsilon=1e-5, reduce_axes=()),
        (2, 16, 2, 10),
        (2, 4, 2, 10),
        _group_norm64,
    ),
}


@pytest.mark.parametrize("name", sorted(NORMS))
def test_norm_only_gradient_without_scale_and_bias(name) -> None:
    """NNC: "compare layer norm only gradient with cudnn without scale / bias" and "compare
    group norm only gradient with cudnn without scale / bias": a symbolic graph of the norm
    with x (in [0, 100)) as its only input, differentiated with respect to x by the backward
    pass, dy in [-1, 1); y, the saved statistics' shapes and dx against ``jax.vjp``."""
    cmd, shape, stat_shape, oracle = NORMS[name]
    b = GraphBuilder()
    x = b.input(shape, name="x")
    y, mean, inv_std = b.exec(cmd, x)
    dy = b.input(shape, name="dy")
    graph, _ = backward(b.build([y, mean, inv_std]), y, [x], df=dy)
    xv, g = _uniform(shape, 1, 0, 100), _uniform(shape, 2, -1, 1)
    got_y, got_mean, got_inv, got_dx = compile(graph)(xv, g)
    assert np.shape(got_mean) == np.shape(got_inv) == stat_shape
    with jax.enable_x64(True):
        want_y, pull = jax.vjp(oracle, jnp.asarray(xv, f64))
        (want_dx,) = pull(jnp.asarray(g, f64))
    assert_close(got_y, want_y, rtol=1e-5, atol=1e-5)
    assert_close(got_dx, want_dx, rtol=1e-4, atol=1e-5 * float(np.abs(want_dx).max()))


# -- mpsblas.tests.c: attention backward from g, q, k, v alone -------------------------------

ATTENTION_GRAD_MPS = [
    # NNC's (B, R, C, H, D) trials, not causal; the first shrunk (NNC: 3x61x49, 13 heads of
    # 191; its 32x128x128 trial is left out), the last two NNC's own.
    (1, 9, 7, 13, 191),
    (2, 6, 2, 3, 4),
    (1, 2, 1, 1, 8),
]


def _attention64(q, k, v):
    logits = jnp.einsum("bshd,bthd->bhst", q, k) / jnp.sqrt(q.shape[-1])
    return jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(logits, axis=-1), v)


def _attention_grads(trial):
    """(command, q, k, v, g, the float64 (dq, dk, dv) of ``jax.vjp``)."""
    batch, r, c, h, d = trial
    qs, ks = (batch, r, h, d), (batch, c, h, d)
    q, k, v, g = (_uniform(shape, seed) for seed, shape in enumerate([qs, ks, ks, qs], 10))
    with jax.enable_x64(True):
        _, pull = jax.vjp(_attention64, *(jnp.asarray(t, f64) for t in (q, k, v)))
        want = tuple(np.asarray(t) for t in pull(jnp.asarray(g, f64)))
    cmd = ops.scaled_dot_product_attention(scale=float(f32(1.0) / np.sqrt(f32(d))))
    return cmd, q, k, v, g, want


@pytest.mark.parametrize("trial", ATTENTION_GRAD_MPS, ids=lambda t: "-".join(map(str, t)))
def test_attention_backward_with_forward_output(trial) -> None:
    """NNC: "scaled dot product attention gradient with mps", with the forward output o
    passed to the backward (NNC's bitmask lists y among its inputs): dq, dk, dv against
    ``jax.vjp`` in float64 (NNC's tolerance, 1e-6 absolute on values of order 1e-2)."""
    cmd, q, k, v, g, want = _attention_grads(trial)
    got = cmd.definition.backward((g,), (q, k, v), (cmd(q, k, v),), **cmd.kwargs)
    assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("trial", ATTENTION_GRAD_MPS[1:], ids=lambda t: "-".join(map(str, t)))
def test_attention_backward_without_forward_output(trial) -> None:
    """NNC: "scaled dot product attention gradient with mps" as the C test calls it: the
    backward gets the output gradient and q, k, v only (``TENSOR_LIST(g, 0, 0, q, k, v)``;
    NNC's CPU reference recomputes the softmax and never reads y), so fnnc's backward
    with the forward output left out (``None``) should give the same dq, dk, dv."""
    cmd, q, k, v, g, want = _attention_grads(trial)
    got = cmd.definition.backward((g,), (q, k, v), (None,), **cmd.kwargs)
    assert_close(got, want, rtol=1e-5, atol=1e-6)
