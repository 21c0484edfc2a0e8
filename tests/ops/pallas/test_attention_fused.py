"""The fused flash-attention backward (``pallas_fused``) against the reference, in
interpret mode: forward, ``jax.vjp`` (given the forward's ``lse``) and the graph's
backward (the forward kernel's call again gives ``lse``), on ragged, causal, grouped and
masked shapes. Interpreted, programs run one after another and dQ's atomic adds are a
masked read-modify-write; the compiled atomics are checked in ``test_gpu.py``."""

import re

import jax
import jax.numpy as jnp
import pytest

from fnnc import ops
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


def test_one_backward_kernel_given_lse_and_the_forward_kernels_call_in_a_graph():
    """``jax.grad`` has the forward's ``lse``: one backward kernel. A graph's gradient node
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
