"""Attention layers: :class:`MultiHeadAttention` (q/k/v/out projections around one
attention) and :class:`ScaledDotProductAttention`, NNC's
``ccv_cnnp_scaled_dot_product_attention``: attention of given ``q, k, v`` (no input
projections), with NNC's optional fused output projection.

>>> import numpy as np
>>> from fnnc.models import Input, Model, ScaledDotProductAttention
>>> q, k, v = Input(), Input(), Input()
>>> sdpa = ScaledDotProductAttention(fused_unify_head_weights=True, name="sdpa")
>>> model = Model([q, k, v], sdpa(q, k, v))
>>> x = np.ones((2, 3, 4, 8), np.float32)
>>> model.compile([x, x, x])
>>> {p: model.parameters()[p].shape for p in sorted(model.parameters())}
{'t-sdpa-0-0': (32, 32), 't-sdpa-0-1': (32,)}
>>> model.evaluate([x, x, x]).shape
(2, 3, 32)
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from fnnc import ops
from fnnc.core.ir import Symbol
from fnnc.models.layer import (
    BuildContext,
    Layer,
    ModelError,
    flag,
    glorot_uniform,
    is_int,
    positive_int,
    uniform_draw,
    zeros,
)
from fnnc.ops.attention import finite_real


def _nnc_uniform(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """NNC's init of the unify-head weights: uniform in ``±sqrt(3) sqrt(2 / c)``,
    ``c`` the joined head width (``shape[1]``)."""
    bound = float(np.sqrt(3.0) * np.sqrt(2.0 / max(1, shape[1])))
    return uniform_draw(key, shape, dtype, bound)


_nnc_uniform.draws = True  # type: ignore[attr-defined]


class ScaledDotProductAttention(Layer):
    """``softmax(scale q kᵀ + mask) v`` of ``q [B, S, H, D]``, ``k [B, T, Hk, D]``,
    ``v [B, T, Hk, Dv]`` (NNC's layout): one ``scaled_dot_product_attention`` command.

    The options are NNC's, in the order of ``ccv_cnnp_scaled_dot_product_attention``:
    ``scale`` on ``q kᵀ`` (``None``: ``1 / sqrt(D)``), ``is_causal`` (aligned
    bottom-right: query ``i`` sees keys ``j <= i + T - S``), ``has_attn_mask`` (a fourth
    input, bool keeps or float adds, broadcast to ``[B, H, S, T]``), ``flags`` (NNC's
    GEMM precision flags: taken and ignored, a 16-bit attention accumulates in float32
    anyway), ``fused_unify_head_weights`` and ``no_bias``. Without ``fused_unify_head_weights``
    the output is ``[B, S, H, Dv]`` and the layer has no parameters; with it the heads
    are joined and projected, ``y [B, S, H * Dv] = joined @ W^T + bias``, with
    parameter 0 ``W [H * Dv, H * Dv]`` (NNC's init, uniform in ``±sqrt(6 / (H Dv))``)
    and parameter 1 ``bias [H * Dv]`` (zeros; none with ``no_bias``): NNC's ids and
    layout, so NNC-written weights load.
    """

    owns_parameters = True

    def __init__(
        self,
        scale: float | None = None,
        is_causal: bool = False,
        has_attn_mask: bool = False,
        flags: int = 0,
        fused_unify_head_weights: bool = False,
        no_bias: bool = False,
        **kw: Any,
    ):
        super().__init__(**kw)
        self.scale = _scale(self, scale)
        if not is_int(flags) or flags < 0:
            raise ModelError(
                f"layer {self.describe()}: flags is {flags!r:.40}; expected NNC's int flags "
                "(e.g. 0), which fnnc takes and ignores"
            )
        self.is_causal = flag(self, "is_causal", is_causal)
        self.has_attn_mask = flag(self, "has_attn_mask", has_attn_mask)
        self.fused = flag(self, "fused_unify_head_weights", fused_unify_head_weights)
        self.no_bias = flag(self, "no_bias", no_bias)

    def build(self, ctx: BuildContext, *xs: Symbol) -> Symbol:
        want = 4 if self.has_attn_mask else 3
        if len(xs) != want:
            raise ModelError(
                f"layer {self.describe()}: takes (q, k, v{', mask' if want == 4 else ''}), "
                f"got {len(xs)} input(s)"
                + ("" if want == 4 else "; for a mask make it with has_attn_mask=True")
            )
        q, _, v = xs[:3]
        for what, t in zip(("q", "k", "v"), xs[:3]):
            if len(t.shape) != 4:
                raise ModelError(
                    f"layer {self.describe()}: {what} is {list(t.shape)}; expected [B, S, H, D] "
                    "(rank 4): reshape the heads apart first (Reshape((S, H, D)))"
                )
        b, name = ctx.b, ctx.layer_id(self)
        cmd = ops.scaled_dot_product_attention(scale=self.scale, is_causal=self.is_causal)
        if not self.fused:
            return b.exec(cmd, *xs, name=name)
        joined = q.shape[2] * v.shape[3]
        w = ctx.param(self, 0, (joined, joined), _nnc_uniform, q.dtype)
        extra = [] if self.no_bias else [ctx.param(self, 1, (joined,), zeros, q.dtype)]
        # a graph node has no empty input slot: a zero float mask stands in for none
        mask = xs[3] if self.has_attn_mask else b.constant(np.zeros((), q.dtype))
        y, _ = b.exec(cmd, *xs[:3], mask, w, *extra, name=name)
        return y


class MultiHeadAttention(Layer):
    """Self- or cross-attention over ``[N, S, D]``: q/k/v/out projections (parameters 0-3
    weights, 4-7 biases) around one ``scaled_dot_product_attention``. ``is_causal``
    aligns the mask bottom-right, as the command and NNC do: with ``T`` keys, query ``i``
    sees keys ``j <= i + T - S`` (PyTorch's ``is_causal`` is top-left).

    ``has_attn_mask=True`` (NNC's ``ccv_cnnp_scaled_dot_product_attention`` option of
    that name) takes an attention mask as the last input: ``layer(x, mask)`` or
    ``layer(q, kv, mask)``. It broadcasts to ``[N, heads, S, T]`` (``[N, 1, 1, T]``
    masks padded keys per sample); a bool mask keeps the True keys, a float one (of
    the input's type) is added to the logits. With ``is_causal`` both apply. ``scale``
    multiplies ``q kᵀ`` (NNC's ``scale``; ``None``, the default, is ``1 / sqrt(D /
    heads)``). A missing mask input, or a non-bool ``has_attn_mask``, is a
    :class:`ModelError` naming the layer.
    """

    owns_parameters = True

    def __init__(
        self,
        num_heads: int,
        *,
        is_causal: bool = False,
        has_attn_mask: bool = False,
        scale: float | None = None,
        **kw: Any,
    ):
        super().__init__(**kw)
        self.num_heads = positive_int(self, "num_heads", num_heads)
        self.is_causal = flag(self, "is_causal", is_causal)
        self.has_attn_mask = flag(self, "has_attn_mask", has_attn_mask)
        self.scale = _scale(self, scale)

    def build(self, ctx: BuildContext, q: Symbol, *rest: Symbol) -> Symbol:
        mask = None
        if self.has_attn_mask:
            if not rest or len(rest) > 2:
                raise ModelError(
                    f"layer {self.describe()}: has_attn_mask=True takes (x, mask) or "
                    f"(q, kv, mask), got {1 + len(rest)} input(s); pass the mask last"
                )
            *rest, mask = rest
        elif len(rest) > 1:
            raise ModelError(
                f"layer {self.describe()}: takes (x) or (q, kv), got {1 + len(rest)} inputs; "
                "for an attention mask make it with has_attn_mask=True and pass it last"
            )
        kv = rest[0] if rest else q
        for what, t in (("query", q), ("key/value", kv)):
            if len(t.shape) != 3:
                raise ModelError(
                    f"layer {self.describe()}: its {what} input is {list(t.shape)}; expected "
                    "[batch, sequence, features] (rank 3): reshape the positions into one "
                    "sequence axis first (Reshape((-1, features)))"
                )
        if kv.shape[0] != q.shape[0]:
            raise ModelError(
                f"layer {self.describe()}: query {list(q.shape)} and key/value "
                f"{list(kv.shape)} have other batch sizes; each sample attends to its own "
                "keys, so both need the same batch"
            )
        d, h = q.shape[-1], self.num_heads
        if d % h:
            raise ModelError(
                f"layer {self.describe()}: model width {d} is not divisible by {h} heads"
            )
        b, name = ctx.b, ctx.layer_id(self)

        def project(x: Symbol, i: int) -> Symbol:
            w = ctx.param(self, i, (d, x.shape[-1]), glorot_uniform([1], [0]), x.dtype)
            bias = ctx.param(self, 4 + i, (d,), zeros, x.dtype)
            y = b.exec(ops.gemm(transpose_b=True), x, w, bias, name=f"{name}/proj{i}")
            return b.exec(ops.reshape(shape=(*x.shape[:-1], h, d // h)), y)

        sdpa = ops.scaled_dot_product_attention(scale=self.scale, is_causal=self.is_causal)
        qkv = (project(q, 0), project(kv, 1), project(kv, 2))
        attn = b.exec(sdpa, *qkv, *([] if mask is None else [mask]), name=name)
        merged = b.exec(ops.reshape(shape=(*q.shape[:-1], d)), attn)
        w = ctx.param(self, 3, (d, d), glorot_uniform([1], [0]), q.dtype)
        return b.exec(
            ops.gemm(transpose_b=True),
            merged,
            w,
            ctx.param(self, 7, (d,), zeros, q.dtype),
            name=f"{name}/out",
        )


def _scale(layer: Layer, scale: Any) -> float | None:
    """An attention layer's ``scale``: ``None`` (``1 / sqrt(head size)``) or a finite
    number, else a :class:`ModelError` naming ``layer``."""
    if scale is not None and not finite_real(scale):
        raise ModelError(
            f"layer {layer.describe()}: scale is {scale!r:.40}; expected a finite number "
            "(the factor on q kᵀ) or None for 1 / sqrt(head size)"
        )
    return None if scale is None else float(scale)
