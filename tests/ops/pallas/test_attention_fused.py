"""The fused flash-attention backward (``pallas_fused``) against the reference, in
interpret mode: forward, ``jax.vjp`` (given the forward's softmax statistics) and the
graph's backward (the forward kernel's call again gives them), on ragged, causal, grouped and
masked shapes. Interpreted, programs run one after another and dQ's atomic adds are a
masked read-modify-write; the compiled atomics are checked in ``test_gpu.py``."""

import re

import jax
import jax.numpy as jnp
import pytest

from fnnc import config, ops
from fnnc.errors import BackendError
from fnnc.ops.pallas import FUSED_ATTENTION
from fnnc.ops.pallas import scaled_dot_product_attention as kernel
from tests.helpers import rand
from tests.ops.pallas.checks import check_kernel
from tests.ops.pallas.test_scaled_dot_product_attention import (
    _kernel_primitives,
    _qkv,
    _variant,
    candidate_only,
    case,
)

FUSED = _variant(kernel.FUSED)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(kernel, "BLOCK_Q", 16)
    monkeypatch.setattr(kernel, "BLOCK_K", 16)


@pytest.mark.parametrize(
    "name",
    [
        "ragged_gqa",  # the last query block's adds are masked
        "causal_gqa_longer_keys",
        "causal_shorter_keys",  # queries that see no key: their dQ stays 0
        "causal_bool_mask",
        "ragged_float_mask_gqa",  # the mask's gradient: the split kernels run
        "ragged_key_padding_mask",
    ],
)
def test_matches_reference(name):
    cmd, args, diff = case(name)
    check_kernel(FUSED, cmd, args, diff=diff)


def test_rows_masked_with_float32_lowest():
    """The fused backward reads the forward's two statistics: a row masked wholly with
    ``finfo(float32).min`` gets the uniform softmax's gradients (see the split kernels'
    test); the mask is not differentiated, so the fused kernel runs."""
    cmd, args, _ = case("lowest_float_mask_rows")
    check_kernel(FUSED, cmd, args, diff=[0, 1, 2])


def test_in_bfloat16_at_its_own_blocks(monkeypatch):
    """``FUSED`` itself (64 x 64 blocks) in bfloat16 at S = 150: ragged blocks, grouped
    heads, causal."""
    monkeypatch.setattr(kernel, "BLOCK_Q", 64)
    monkeypatch.setattr(kernel, "BLOCK_K", 64)
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(1, 150, 150, 2, 1, 16, 16))
    cmd = ops.scaled_dot_product_attention(is_causal=True)
    check_kernel(FUSED, cmd, [q, k, v], diff=[0, 1, 2], rtol=2e-2, atol=2e-2)


def _launched(fn, *args):
    text = str(jax.make_jaxpr(fn)(*args))
    return sorted(set(re.findall(r"name=(fnnc_flash_attention\w*)", text)))


def test_one_backward_kernel_given_the_statistics_and_the_forward_kernels_call_in_a_graph():
    """``jax.grad`` has the forward's statistics: one backward kernel. A graph's gradient node
    has ``O``: it calls the forward kernel again, as the forward node did (XLA merges the
    two calls in one program). A float mask whose gradient is wanted runs the split
    kernels. Every kernel exponentiates in base 2."""
    q, k, v = _qkv(1, 40, 40, 2, 2, 16, 16)
    attend = lambda *xs: FUSED.scaled_dot_product_attention(*xs, is_causal=True)
    grad = jax.grad(lambda *xs: jnp.sum(attend(*xs)), argnums=(0, 1, 2))
    assert _launched(grad, q, k, v) == [
        "fnnc_flash_attention",
        "fnnc_flash_attention_fused_backward",
    ]
    o = attend(q, k, v)

    def graph_backward(*xs):
        return FUSED.backward((o,), xs, (o,), tuple(range(len(xs))), scale=None, is_causal=True)

    assert _launched(graph_backward, q, k, v) == [
        "fnnc_flash_attention",
        "fnnc_flash_attention_fused_backward",
    ]
    found = _kernel_primitives(jax.make_jaxpr(graph_backward)(q, k, v).jaxpr)
    assert "exp2" in found and "exp" not in found, sorted(found)
    mask = rand((1, 2, 40, 40), seed=8)
    assert _launched(graph_backward, q, k, v, mask) == [
        "fnnc_flash_attention_dkv",
        "fnnc_flash_attention_dq",
        "fnnc_flash_attention_stats",
    ]


def test_it_is_a_candidate_only():
    """Never a default by priority (its dQ is not bit-for-bit repeatable on a GPU)."""
    candidate_only(FUSED_ATTENTION)


# The H200 sweep of 2026-11-28, (B, S, T, H, Hk, D = Dv, causal), each in bfloat16,
# float16 and float32: "pallas_fused" ran every one but float32 at D = 128, whose
# backward XLA refused: "Shared memory size limit exceeded: requested 246784,
# available: 232448".
H200_SWEEP = [
    (2, 1, 77, 4, 1, 64, True),
    (1, 77, 45, 4, 2, 64, True),
    (1, 46, 78, 2, 2, 128, True),
    (2, 64, 64, 8, 2, 64, True),
    (1, 130, 130, 2, 1, 32, False),
    (1, 200, 96, 2, 2, 64, False),
    (1, 96, 96, 4, 4, 64, True),
    (1, 300, 300, 2, 1, 64, True),
]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("dims", H200_SWEEP, ids=lambda d: "x".join(map(str, d[:6])))
def test_forced_on_a_gpu_it_declines_exactly_the_tiles_that_overflow_shared_memory(
    monkeypatch, dims, dtype
):
    """At its own 64 x 64 blocks: the float32 D = 128 case is a BackendError naming the
    fused kernel's shared memory (XLA's 246784 bytes, 241 KiB, over the 227 KiB a Hopper
    SM has), not XLA's compile error; every case that ran on the H200 is accepted."""
    monkeypatch.setattr(kernel, "BLOCK_Q", 64)
    monkeypatch.setattr(kernel, "BLOCK_K", 64)
    b, s, t, h, hk, d, causal = dims
    cmd = ops.scaled_dot_product_attention(is_causal=causal)
    specs = [
        jax.ShapeDtypeStruct((b, s, h, d), dtype),
        jax.ShapeDtypeStruct((b, t, hk, d), dtype),
        jax.ShapeDtypeStruct((b, t, hk, d), dtype),
        jax.ShapeDtypeStruct((1, 1, s, t), jnp.bool_),
    ]
    forced = {"scaled_dot_product_attention": FUSED_ATTENTION}
    with config.override(backend_per_command=forced):
        if dtype == jnp.float32 and d == 128:
            with pytest.raises(BackendError) as caught:
                ops.select_backend(cmd, specs, "gpu")
            why = str(caught.value)
            assert "fused backward kernel's 64 x 64 blocks in 2 stages" in why, why
            assert f"need {246784 // 1024} KiB of shared memory" in why, why
            assert f"{232448 // 1024} KiB are allowed" in why, why
        else:
            assert ops.select_backend(cmd, specs, "gpu") == FUSED_ATTENTION


def test_the_shared_memory_estimate_is_xlas_request_on_the_h200():
    """The fused kernel's tiles at 64 x 64 blocks, 2 stages, float32, D = Dv = 128 sum to
    the bytes XLA asked for, and its limit is XLA's "available". XLA asked 246784 when
    the statistics were one float32 row (a logsumexp); they are two rows now (the max and
    log2 of the sum), one more row of 64 floats in each of the 2 stages: extrapolated,
    not yet re-measured on a GPU."""
    from fnnc.ops.pallas._attention_fused import SHARED_BYTES, shared_bytes

    assert shared_bytes(64, 64, 2, 128, 128, 4) == 246784 + 2 * 64 * 4
    assert SHARED_BYTES == 232448
