"""Pallas flash attention against the reference, in interpret mode.

Blocks are shrunk to 16 so that the small shapes here still walk several query and
key blocks (online softmax rescaling, causal early exits, fully masked rows).
"""

import functools
import re
import types

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.ops.pallas import SPLIT_ATTENTION, WIDE_ATTENTION
from fnnc.ops.pallas import scaled_dot_product_attention as kernel
from tests.helpers import rand
from tests.ops.pallas.checks import check_forced_eager, check_kernel, check_unsupported


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(kernel, "BLOCK_Q", 16)
    monkeypatch.setattr(kernel, "BLOCK_K", 16)


def _qkv(b, s, t, h, hk, d, dv, seed=0):
    return (
        rand((b, s, h, d), seed=seed),
        rand((b, t, hk, d), seed=seed + 1),
        rand((b, t, hk, dv), seed=seed + 2),
    )


CASES = {
    "plain": ((1, 32, 32, 2, 2, 16, 16), False, None, None),
    "ragged_gqa": ((1, 67, 45, 2, 1, 16, 16), False, None, None),  # masked last blocks
    "causal_gqa_longer_keys": ((2, 32, 48, 4, 2, 16, 32), True, None, None),
    # T < S: bottom-right alignment leaves the first 32 queries with no key (zeros).
    "causal_shorter_keys": ((1, 48, 16, 2, 1, 16, 16), True, None, 0.5),
    "causal_bool_mask": ((2, 32, 32, 2, 2, 16, 16), True, "bool", None),
    "ragged_float_mask_gqa": ((1, 37, 21, 2, 1, 16, 16), True, "float", None),
    "ragged_key_padding_mask": ((1, 20, 45, 2, 2, 16, 16), False, "keys", None),
    # rows masked wholly or partly with float32's lowest number, and one with -inf
    "lowest_float_mask_rows": ((1, 20, 21, 2, 2, 16, 16), False, "lowest", None),
}


def case(name):
    """``(cmd, args, diff)`` of a :data:`CASES` entry, masks made."""
    dims, causal, mask_kind, scale = CASES[name]
    b, s, t, h = dims[:4]
    args = list(_qkv(*dims))
    rng = np.random.default_rng(7)
    if mask_kind == "bool":
        mask = rng.uniform(size=(b, 1, s, t)) > 0.3
        mask[0, 0, 3, :] = False  # a row that attends nothing
        args.append(mask)
    elif mask_kind == "float":
        args.append(rand((1, h, s, t), seed=8))
    elif mask_kind == "lowest":
        mask = np.array(rand((1, h, s, t), seed=8), np.float32)
        mask[0, 0, 3, :] = np.finfo(np.float32).min  # uniform softmax: the mean of v
        mask[0, 1, 5, :7] = np.finfo(np.float32).min
        mask[0, 1, 6, :] = -np.inf  # attends nothing: zeros
        args.append(mask)
    elif mask_kind == "keys":
        args.append(rng.uniform(size=(t,)) > 0.5)
    cmd = ops.scaled_dot_product_attention(scale=scale, is_causal=causal)
    return cmd, args, [0, 1, 2] + ([3] if mask_kind in ("float", "lowest") else [])


@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(name):
    cmd, args, diff = case(name)
    check_kernel(kernel, cmd, args, diff=diff)


def test_rows_masked_with_float32_lowest_without_the_mask_gradient():
    """A row masked wholly with ``finfo(float32).min`` has equal logits: its softmax is
    uniform, its output the mean of v and its gradients those of that softmax, as in the
    reference. The kernels once scaled the mask into base 2 and overflowed it to -inf
    (zeros out), and kept one logsumexp, ``m + log2(l)``, which loses ``log2(l)`` at such
    an ``m`` (probabilities of 1, not 1/T). Without the mask's gradient the graph's
    backward finds the statistics online (the other paths run in the test above)."""
    cmd, args, _ = case("lowest_float_mask_rows")
    check_kernel(kernel, cmd, args, diff=[0, 1, 2])


def test_forced_eager_call():
    check_forced_eager(
        ops.scaled_dot_product_attention(is_causal=True), _qkv(1, 16, 16, 2, 2, 16, 16)
    )


@pytest.mark.parametrize(
    ("dims", "reason"),
    [
        ((1, 16, 16, 2, 2, 8, 8), "head size D 8 is not a power of two"),
    ],
)
def test_unaligned_falls_back_or_explains(dims, reason):
    check_unsupported(ops.scaled_dot_product_attention(), list(_qkv(*dims)), reason)


def test_wrong_dtype_is_declined():
    spec = jax.ShapeDtypeStruct((1, 16, 2, 16), np.float64)
    assert "float64" in kernel.supports(ops.scaled_dot_product_attention(), [spec] * 3)


def _variant(blocks):
    """The kernel module's entry points with other Triton blocks, as check_kernel reads them."""
    return types.SimpleNamespace(
        scaled_dot_product_attention=functools.partial(
            kernel.scaled_dot_product_attention, blocks=blocks
        ),
        scaled_dot_product_attention_reference=kernel.scaled_dot_product_attention_reference,
        supports=functools.partial(kernel.supports, blocks=blocks),
        backward=functools.partial(kernel.backward, blocks=blocks),
    )


@pytest.mark.parametrize("name", ["ragged_gqa", "ragged_float_mask_gqa"])
def test_query_blocks_wider_than_key_blocks_match_reference(name):
    """The ``pallas_bq128`` layout (query blocks twice the key blocks, more pipelining
    stages) scaled down to 32 x 16, so these shapes walk several blocks of each."""
    dims, causal, mask_kind, scale = CASES[name]
    args = list(_qkv(*dims))
    if mask_kind == "float":
        args.append(rand((1, dims[3], dims[1], dims[2]), seed=8))
    cmd = ops.scaled_dot_product_attention(scale=scale, is_causal=causal)
    narrow = kernel.Blocks(q=32, k=16, warps=4, stages=3, shared_bytes=kernel.WIDE.shared_bytes)
    check_kernel(_variant(narrow), cmd, args, diff=[0, 1, 2] + ([3] if mask_kind else []))


@pytest.mark.parametrize(
    ("name", "bq", "bk"),
    [
        ("causal_gqa_longer_keys", 32, 16),
        ("causal_gqa_longer_keys", 16, 32),
        ("causal_shorter_keys", 16, 32),
        ("ragged_float_mask_gqa", 32, 16),
    ],
)
def test_causal_walks_split_at_the_diagonal_for_any_blocks(name, bq, bk):
    """Tiles under the diagonal skip the causal mask: with query blocks wider or narrower
    than key blocks, keys longer or shorter than queries, the split still lands on
    the diagonal (forward, dQ with and without the statistics, dK/dV)."""
    dims, causal, mask_kind, scale = CASES[name]
    args = list(_qkv(*dims))
    if mask_kind == "float":
        args.append(rand((1, dims[3], dims[1], dims[2]), seed=8))
    cmd = ops.scaled_dot_product_attention(scale=scale, is_causal=causal)
    blocks = kernel.Blocks(q=bq, k=bk)
    check_kernel(_variant(blocks), cmd, args, diff=[0, 1, 2] + ([3] if mask_kind else []))


SPLIT_SMALL = {
    # the pallas_split layout scaled down: dQ keeps 32 queries and streams 16 keys,
    # dK/dV keeps 32 keys and streams 16 queries, the forward runs 32 x 16
    "split": dict(q=32, k=16, stages=3, dq=(32, 16), dkv=(16, 32), backward_stages=4),
    # and the other way round: backward blocks narrower than the forward's
    "inverse": dict(q=16, k=32, stages=2, dq=(16, 32), dkv=(32, 16), backward_stages=3),
}


@pytest.mark.parametrize(
    ("name", "layout"),
    [
        ("ragged_gqa", "split"),
        ("causal_gqa_longer_keys", "split"),
        ("causal_shorter_keys", "split"),
        ("ragged_float_mask_gqa", "split"),
        ("causal_gqa_longer_keys", "inverse"),
    ],
)
def test_backward_kernels_with_blocks_of_their_own_match_reference(name, layout):
    """The dQ and dK/dV kernels blocked differently from the forward and from each other
    (the ``pallas_split`` layout): the statistics and ``delta`` pass between them whole,
    so the forward, both vjps and the graph backward (dQ finding the statistics online,
    or given them where the float mask's gradient is wanted) still match the reference."""
    dims, causal, mask_kind, scale = CASES[name]
    args = list(_qkv(*dims))
    if mask_kind == "float":
        args.append(rand((1, dims[3], dims[1], dims[2]), seed=8))
    cmd = ops.scaled_dot_product_attention(scale=scale, is_causal=causal)
    blocks = kernel.Blocks(**SPLIT_SMALL[layout])
    check_kernel(_variant(blocks), cmd, args, diff=[0, 1, 2] + ([3] if mask_kind else []))


def test_the_split_backend_in_bfloat16_at_its_own_blocks_matches_reference():
    """``SPLIT`` itself (forward 128 x 64, dQ 128 x 32, dK/dV 32 x 128) in bfloat16, at
    S = 150: ragged blocks in every kernel, grouped heads, causal."""
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(1, 150, 150, 2, 1, 16, 16))
    cmd = ops.scaled_dot_product_attention(is_causal=True)
    check_kernel(_variant(kernel.SPLIT), cmd, [q, k, v], diff=[0, 1, 2], rtol=2e-2, atol=2e-2)


def candidate_only(name):
    """Backend ``name`` runs the LM's bfloat16 attention but has no priority: selection
    (by priority) picks another, only measurement or the autotune table choose it."""
    cmd = ops.scaled_dot_product_attention(is_causal=True)
    backend = ops.backends_of(cmd.name)[name]
    assert backend.priority == 0
    lm = [jax.ShapeDtypeStruct((16, 1024, 16, 64), jnp.bfloat16)] * 3
    assert backend.supports(cmd, lm) is None
    assert ops.select_backend(cmd, lm, "gpu") in ("pallas", "cudnn")  # by priority
    return cmd, backend


def test_the_split_backend_is_a_candidate_only_and_declines_tiles_over_shared_memory():
    """``pallas_split`` runs the LM's bfloat16 shapes, has no priority, and names the
    kernel whose tiles would pass its shared-memory budget."""
    cmd, split = candidate_only(SPLIT_ATTENTION)
    wide = [jax.ShapeDtypeStruct((2, 2048, 16, 128), jnp.float32)] * 3
    why = split.supports(cmd, wide)
    assert "kernel's" in why and "KiB of shared memory" in why
    caps = kernel.SPLIT.kernels()
    assert caps == {"forward": (128, 64, 3), "dQ": (128, 32, 4), "dK/dV": (32, 128, 4)}


def test_the_split_points_are_where_tiles_become_wholly_visible():
    """Against brute force over small lengths and blocks: key blocks before
    ``full_key_blocks`` are wholly visible to their query block, the rest it walks
    are not; query blocks from ``first_full_query_block`` on see their key block whole."""
    from fnnc.ops.pallas._attention_tiles import (
        Config,
        first_full_query_block,
        full_key_blocks,
        key_blocks,
    )

    for s, t, bq, bk in [(48, 16, 16, 16), (32, 48, 16, 32), (37, 21, 32, 16), (64, 64, 16, 16)]:
        cfg = Config(1.0, True, t - s, "", (False,) * 4, 1, bq, bk, s, t, 4, 2)
        rows, cols = np.arange(s)[:, None], np.arange(t)[None, :]
        visible = cols <= rows + (t - s)
        whole = lambda i, j: visible[i * bq : (i + 1) * bq, j * bk : (j + 1) * bk].all()
        for i in range(-(-s // bq)):
            n, end = int(full_key_blocks(cfg, i, t)), int(key_blocks(cfg, i, t))
            assert all(whole(i, j) for j in range(n)), (s, t, bq, bk, i)
            assert not any(whole(i, j) for j in range(n, end)), (s, t, bq, bk, i)
        for j in range(-(-t // bk)):
            first = int(first_full_query_block(cfg, j, s))
            assert all(whole(i, j) for i in range(first, -(-s // bq))), (s, t, bq, bk, j)
            assert first == 0 or not whole(first - 1, j), (s, t, bq, bk, j)


def test_the_bq128_backend_in_bfloat16_matches_reference_and_is_never_a_default():
    """At its own 128 x 64 blocks (S = 150: two ragged query blocks, three key blocks), in
    bfloat16; it runs only where measurement (or the autotune table) chose it."""
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(1, 150, 150, 2, 1, 16, 16))
    cmd = ops.scaled_dot_product_attention(is_causal=True)
    check_kernel(_variant(kernel.WIDE), cmd, [q, k, v], diff=[0, 1, 2], rtol=2e-2, atol=2e-2)
    specs = [jax.ShapeDtypeStruct((2, 2048, 16, 64), jnp.bfloat16)] * 3
    assert ops.backends_of(cmd.name)[WIDE_ATTENTION].priority == 0
    assert ops.select_backend(cmd, specs, "gpu") in ("pallas", "cudnn")  # by priority
    wide = [jax.ShapeDtypeStruct((2, 2048, 16, 128), jnp.float32)] * 3
    why = ops.backends_of(cmd.name)[WIDE_ATTENTION].supports(cmd, wide)
    assert "KiB of shared memory" in why


def test_the_graph_backward_finds_the_statistics_in_its_dq_kernel():
    """A gradient node has O but not the statistics: the dQ kernel accumulates the statistics online
    (no statistics-only forward pass), except where the float mask's gradient, written
    tile by tile, is wanted; the values are checked against the reference above."""
    q, k, v = _qkv(1, 40, 40, 2, 2, 16, 16)
    o = kernel.scaled_dot_product_attention(q, k, v, is_causal=True)

    def launched(inputs, wants):
        run = lambda *xs: kernel.backward((o,), xs, (o,), wants, scale=None, is_causal=True)
        text = str(jax.make_jaxpr(run)(*inputs))
        return sorted(set(re.findall(r"name=(fnnc_flash_attention\w*)", text)))

    assert launched((q, k, v), (0, 1, 2)) == [
        "fnnc_flash_attention_dkv",
        "fnnc_flash_attention_dq_online",
    ]
    mask = rand((1, 2, 40, 40), seed=8)
    assert launched((q, k, v, mask), (0, 1, 2, 3)) == [
        "fnnc_flash_attention_dkv",
        "fnnc_flash_attention_dq",
        "fnnc_flash_attention_stats",
    ]


def _kernel_primitives(jaxpr, inside=False):
    """Names of the primitives inside every ``pallas_call`` kernel of ``jaxpr``."""
    found = set()
    for eqn in jaxpr.eqns:
        if inside:
            found.add(eqn.primitive.name)
        for sub in jex.core.jaxprs_in_params(eqn.params):
            found |= _kernel_primitives(sub, inside or eqn.primitive.name == "pallas_call")
    return found


@pytest.mark.parametrize("mask", [None, "float"])
def test_every_kernel_exponentiates_in_base_2(mask):
    """Each tile's softmax is ``exp2`` of base-2 logits (``__nv_exp2f``, the hardware's
    ``ex2``), never float32 ``exp`` (``__nv_expf``), in the forward and in all three
    backward kernels; the values are checked against the reference above."""
    q, k, v = _qkv(1, 40, 40, 2, 2, 16, 16)
    args = (q, k, v) if mask is None else (q, k, v, rand((1, 2, 40, 40), seed=8))
    loss = lambda *xs: jnp.sum(kernel.scaled_dot_product_attention(*xs, is_causal=True))
    o = kernel.scaled_dot_product_attention(*args, is_causal=True)
    backward = lambda *xs: kernel.backward(
        (o,), xs, (o,), tuple(range(len(xs))), scale=None, is_causal=True
    )
    for fn in (jax.grad(loss, argnums=tuple(range(len(args)))), backward):
        found = _kernel_primitives(jax.make_jaxpr(fn)(*args).jaxpr)
        assert "exp2" in found and "exp" not in found, sorted(found)
