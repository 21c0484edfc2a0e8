"""Pallas flash attention against the reference, in interpret mode.

Blocks are shrunk to 16 so that the small shapes here still walk several query and
key blocks (online softmax rescaling, causal early exits, fully masked rows).
"""

import jax
import numpy as np
import pytest

from fnnc import ops
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
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(name):
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
    elif mask_kind == "keys":
        args.append(rng.uniform(size=(t,)) > 0.5)
    cmd = ops.scaled_dot_product_attention(scale=scale, is_causal=causal)
    diff = [0, 1, 2] + ([3] if mask_kind == "float" else [])
    check_kernel(kernel, cmd, args, diff=diff)


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
