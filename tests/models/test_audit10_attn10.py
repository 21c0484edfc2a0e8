"""Audit round 10, attention: NNC's ``ccv_cnnp_scaled_dot_product_attention`` layer
(q, k, v given; optional mask and fused unify-head projection) against a float64 NumPy
attention in NNC's ``[B, S, H, D]`` layout."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc.models import (
    Input,
    Model,
    ModelError,
    MoE,
    RotaryEmbedding,
    ScaledDotProductAttention,
    SwiGLU,
)

B, S, T, H, D, DV = 2, 3, 5, 2, 4, 3


def _attention(q, k, v, mask=None, scale=None, causal=False):
    """float64 ``softmax(scale q kᵀ + mask) v`` per head; causal bottom-right (NNC)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    logits = np.einsum("bshd,bthd->bhst", q, k) * (scale or 1 / np.sqrt(q.shape[-1]))
    if mask is not None:
        logits = logits + np.asarray(mask, np.float64)
    if causal:
        s, t = logits.shape[-2:]
        logits = np.where(np.arange(t)[None] <= np.arange(s)[:, None] + t - s, logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bhst,bthd->bshd", p / p.sum(-1, keepdims=True), v)


@pytest.fixture(scope="module")
def qkv():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((B, S, H, D)).astype(np.float32)
    k = rng.standard_normal((B, T, H, D)).astype(np.float32)
    v = rng.standard_normal((B, T, H, DV)).astype(np.float32)
    return q, k, v


def test_fused_unify_head_uses_nnc_ids_and_layout(qkv) -> None:
    """NNC's "run scaled dot product attention + unify head output with cnnp model":
    parameter 0 the ``[H * Dv, H * Dv]`` weights, 1 the bias, set as NNC sets them; the
    output is ``joined @ W^T + bias``. With a float mask and causal together."""
    rng = np.random.default_rng(4)
    mask = np.where(rng.random((1, 1, S, T)) < 0.3, -1e9, 0.0).astype(np.float32)
    xs = [Input() for _ in range(4)]
    layer = ScaledDotProductAttention(
        0.3, is_causal=True, has_attn_mask=True, fused_unify_head_weights=True, name="sdpa"
    )
    model = Model(xs, layer(*xs))
    model.compile([*qkv, mask])
    params = model.parameters()
    assert {p: tuple(params[p].shape) for p in params} == {
        "t-sdpa-0-0": (H * DV, H * DV),
        "t-sdpa-0-1": (H * DV,),
    }
    bound = np.sqrt(6 / (H * DV))  # NNC's init: uniform in ±sqrt(3) sqrt(2 / c)
    assert np.all(np.abs(np.asarray(params["t-sdpa-0-0"])) <= bound)
    assert not np.any(np.asarray(params["t-sdpa-0-1"]))
    w = rng.random((H * DV, H * DV)).astype(np.float32)
    bias = rng.random(H * DV).astype(np.float32)
    model.set_parameters({"t-sdpa-0-0": w, "t-sdpa-0-1": bias})
    o = _attention(*qkv, mask, scale=0.3, causal=True)
    want = o.reshape(B, S, H * DV) @ w.T.astype(np.float64) + bias
    np.testing.assert_allclose(model.evaluate([*qkv, mask]), want, rtol=1e-5, atol=1e-5)


def test_plain_and_no_bias(qkv) -> None:
    """Without the projection the layer has no parameters and returns the heads; with
    ``no_bias`` only the weights."""
    xs = [Input() for _ in range(3)]
    model = Model(xs, ScaledDotProductAttention(is_causal=True)(*xs))
    model.compile(list(qkv))
    assert not model.parameters()
    np.testing.assert_allclose(
        model.evaluate(list(qkv)), _attention(*qkv, causal=True), rtol=1e-5, atol=1e-6
    )
    layer = ScaledDotProductAttention(fused_unify_head_weights=1, no_bias=1, name="a")
    model = Model(xs, layer(*xs))
    model.compile(list(qkv))
    assert list(model.parameters()) == ["t-a-0-0"]


def test_wrong_inputs_and_options_are_model_errors(qkv) -> None:
    xs = [Input() for _ in range(3)]
    with pytest.raises(ModelError, match=r"layer .*sdpa.*takes \(q, k, v, mask\), got 3"):
        Model(xs, ScaledDotProductAttention(has_attn_mask=True, name="sdpa")(*xs)).compile(
            list(qkv)
        )
    with pytest.raises(ModelError, match=r"q is \[2, 3, 8\].*rank 4"):
        Model(xs, ScaledDotProductAttention()(*xs)).compile([qkv[0].reshape(B, S, H * D), *qkv[1:]])
    with pytest.raises(ModelError, match=r"is_causal is 'no'"):
        ScaledDotProductAttention(is_causal="no")
    with pytest.raises(ModelError, match=r"scale is 'x'"):
        ScaledDotProductAttention("x")


def test_positional_options_follow_nnc(qkv) -> None:
    """``ccv_cnnp_scaled_dot_product_attention(scale, is_causal, has_attn_mask, flags,
    fused_unify_head_weights, no_bias)``: NNC's positional call ports unchanged."""
    layer = ScaledDotProductAttention(1 / 8, 0, 0, 0, 1, 1)
    assert (layer.scale, layer.is_causal, layer.has_attn_mask) == (1 / 8, False, False)
    assert (layer.fused, layer.no_bias) == (True, True)
    with pytest.raises(ModelError, match=r"flags is 0.5"):
        ScaledDotProductAttention(None, False, False, 0.5)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"offset": 2.5}, r"offset is 2.5; expected an int >= 0"),  # arange's count drifted
        ({"offset": -1}, r"offset is -1; expected an int >= 0"),
        ({"offset": None}, r"offset is None"),  # was "unsupported operand type(s)"
        ({"base": 0.0}, r"base is 0.0; expected a finite number > 0"),  # NaN output
        ({"base": -2.0}, r"base is -2.0"),  # NaN output
        ({"base": "1e4"}, r"base is '1e4'"),  # was "ufunc 'power' not supported"
    ],
)
def test_rotary_embedding_refuses_bad_offset_and_base(kw, match) -> None:
    with pytest.raises(ModelError, match=rf"RotaryEmbedding.*{match}"):
        RotaryEmbedding(**kw)


def test_swiglu_and_moe_check_their_options() -> None:
    """``SwiGLU(clamp="x")`` raised a bare ValueError (``None`` a TypeError);
    ``MoE(normalize="no")`` read as True (``bool("no")``), the opposite of what was
    asked, and ``return_load="no"`` added a second output."""
    with pytest.raises(ModelError, match=r"SwiGLU.*clamp is 'x'; expected a finite number"):
        SwiGLU(8, clamp="x")
    with pytest.raises(ModelError, match=r"SwiGLU.*clamp is None"):
        SwiGLU(8, clamp=None)
    with pytest.raises(ModelError, match=r"MoE.*normalize is 'no'"):
        MoE(2, 8, normalize="no")
    with pytest.raises(ModelError, match=r"MoE.*return_load is 'no'"):
        MoE(2, 8, return_load="no")
    assert MoE(2, 8, normalize=0).normalize is False  # NNC's 1 / 0 still read
    assert SwiGLU(8, clamp=np.float32(2.5)).clamp == 2.5
