"""cnnp layers of modern language models: a SwiGLU MLP, rotary position embeddings and a
top-k mixture of experts whose experts run as one grouped GEMM.

Weights use NNC's dense layout ``[out, in]`` (``y = x Wᵀ``); expert banks stack one
such matrix per expert, ``[E, out, in]``, and run through ``segmented_gemm`` with
``transpose_b``. Parameter ids follow NNC's scheme (``t-<layer>-<seq>-<index>``):

>>> import numpy as np
>>> from fnnc.models import Input, Model, MoE
>>> x = Input()
>>> model = Model(x, MoE(4, 8, k=2, name="moe")(x))
>>> model.compile(np.zeros((6, 5), np.float32))
>>> sorted(model.parameters())
['t-moe-0-0', 't-moe-0-1', 't-moe-0-2', 't-moe-0-3', 't-moe-0-4']
>>> model.evaluate(np.ones((6, 5), np.float32)).shape
(6, 5)

The layers use commands that exist in every fnnc build: the SwiGLU product is
``swish`` then ``mul``, and RoPE's half rotation is two slices and a concat. (NNC's
``swiglu``, ``rotate_half`` and ``scatter_add`` commands, where registered, fuse the
same arithmetic.)
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from fnnc import ops
from fnnc.core.dtypes import at_least_float32, is_floating
from fnnc.core.ir import Symbol
from fnnc.models.layer import (
    BuildContext,
    Layer,
    ModelError,
    flag,
    glorot_uniform,
    is_int,
    positive_int,
    real_in,
    zeros,
)


def _dense(ctx: BuildContext, x: Symbol, w: Symbol, name: str) -> Symbol:
    return ctx.b.exec(ops.gemm(transpose_b=True), x, w, name=name)


def _swiglu(ctx: BuildContext, gate: Symbol, up: Symbol, name: str) -> Symbol:
    return ctx.b.exec(ops.mul(), ctx.b.exec(ops.swish(), gate), up, name=name)


class SwiGLU(Layer):
    """``W_down (swish(W_gate x) * W_up x)``, the LLaMA MLP; no biases.

    Parameters: 0 ``W_gate [hidden, in]``, 1 ``W_up [hidden, in]``,
    2 ``W_down [out, hidden]`` (``out`` defaults to ``in``).

    ``down=False`` is NNC's ``ccv_cnnp_swiglu(hidden, clamp)``: the gate and up
    projections alone (two parameters), output width ``hidden``, one ``swiglu``
    command. ``clamp > 0`` clamps the gate above and the up projection to
    ``[-clamp, clamp]`` before they multiply (:func:`fnnc.ops.swiglu`).
    """

    owns_parameters = True

    def __init__(
        self, hidden: int, out: int | None = None, *, clamp: float = 0.0, down: bool = True,
        **kw: Any,
    ):  # fmt: skip
        super().__init__(**kw)
        hidden = positive_int(self, "hidden", hidden)
        out = None if out is None else positive_int(self, "out", out)
        down = flag(self, "down", down)
        if not down and out is not None:
            raise ModelError(
                f"layer {self.describe()}: out={out} sizes the down projection, which "
                "down=False leaves out (the output is hidden wide)"
            )
        ok = isinstance(clamp, numbers.Real) and not isinstance(clamp, (bool, np.bool_))
        if not ok or not np.isfinite(clamp):
            raise ModelError(
                f"layer {self.describe()}: clamp is {clamp!r:.40}; expected a finite number "
                "(> 0 clamps the gate and up projections, 0 does not)"
            )
        self.hidden, self.out, self.clamp, self.down = hidden, out, float(clamp), down

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        d, h = x.shape[-1], self.hidden
        name = ctx.layer_id(self)
        init = glorot_uniform([1], [0])
        w_gate = ctx.param(self, 0, (h, d), init, x.dtype)
        w_up = ctx.param(self, 1, (h, d), init, x.dtype)
        if self.clamp or not self.down:
            hidden = ctx.b.exec(ops.swiglu(clamp=self.clamp), x, w_gate, w_up, name=name)
        else:  # separate projections: the sharding rules find each dense's role
            gate, up = _dense(ctx, x, w_gate, f"{name}/gate"), _dense(ctx, x, w_up, "")
            hidden = _swiglu(ctx, gate, up, "")
        if not self.down:
            return hidden
        w_down = ctx.param(self, 2, (self.out or d, h), init, x.dtype)
        return _dense(ctx, hidden, w_down, name)


class RotaryEmbedding(Layer):
    """Rotary position embedding of ``[B, T, H, D]`` (NeoX / LLaMA half rotation):
    ``x cos(t θ) + rotate_half(x) sin(t θ)`` with ``θ_i = base^(-2i / D)`` and
    ``rotate_half(x) = concat(-x[D/2:], x[:D/2])``; positions start at ``offset``.
    A float16 or bfloat16 ``x`` is rotated in float32 and rounded once. No parameters."""

    def __init__(self, *, base: float = 10000.0, offset: int = 0, **kw: Any):
        super().__init__(**kw)
        if not is_int(offset) or offset < 0:  # a float one made arange's count drift
            raise ModelError(
                f"layer {self.describe()}: offset is {offset!r:.40}; expected an int >= 0, "
                "the position of the first step (e.g. the KV cache's length)"
            )
        ok = isinstance(base, numbers.Real) and not isinstance(base, (bool, np.bool_))
        if not ok or not np.isfinite(base) or base <= 0:  # 0 or < 0: NaN angles
            raise ModelError(
                f"layer {self.describe()}: base is {base!r:.40}; expected a finite number "
                "> 0 (θ_i = base^(-2i / D), e.g. 10000.0)"
            )
        self.base, self.offset = float(base), int(offset)

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        if len(x.shape) != 4 or x.shape[-1] % 2:
            raise ModelError(
                f"layer {self.describe()}: expected [B, T, H, D] with an even D, got "
                f"{list(x.shape)}; reshape the heads apart first"
            )
        if not is_floating(x.dtype):  # its cos/sin tables would round to 0 and 1
            raise ModelError(
                f"layer {self.describe()}: expected a floating-point input, got "
                f"{np.dtype(x.dtype).name}{list(x.shape)}; rotate q and k after their "
                "projections (or convert it first: "
                "CommandLayer(ops.datatype_conversion(dtype=...)))"
            )
        b, t, h, d = x.shape
        half = d // 2
        theta = self.base ** (-np.arange(half, dtype=np.float64) * 2 / d)
        angle = np.arange(self.offset, self.offset + t)[:, None] * theta[None]
        angle = np.concatenate([angle, angle], axis=1)[None, :, None, :]  # [1, T, 1, D]
        dtype, name = np.dtype(x.dtype), ctx.layer_id(self)
        # a 16-bit x rotates in float32 and rounds once (as cmul does): rounded tables and
        # products left up to 100 half-ulps where x cos and x sin cancel
        wide = at_least_float32(dtype)
        if wide != dtype:
            x = ctx.b.exec(ops.datatype_conversion(dtype=wide), x)
        cos = ctx.b.constant(np.cos(angle).astype(wide))
        sin = ctx.b.constant(np.sin(angle).astype(wide))
        lo = ctx.b.exec(ops.slice(start=(0, 0, 0, 0), limit=(b, t, h, half)), x)
        hi = ctx.b.exec(ops.slice(start=(0, 0, 0, half), limit=(b, t, h, d)), x)
        neg = ctx.b.exec(ops.scalar_mul(a=-1.0), hi)
        rotated = ctx.b.exec(ops.concat(axis=3), neg, lo)
        y = ctx.b.exec(
            ops.add(),
            ctx.b.exec(ops.mul(), x, cos),
            ctx.b.exec(ops.mul(), rotated, sin),
            name="" if wide != dtype else name,
        )
        if wide != dtype:
            y = ctx.b.exec(ops.datatype_conversion(dtype=dtype), y, name=name)
        return y


class MoE(Layer):
    """A top-``k`` mixture of SwiGLU experts over the last axis of ``[..., D]``.

    The router ``W_r [E, D]`` (parameter 0) scores the experts; ``moe_routing`` (with
    the per-expert bias ``route [E]``, parameter 1, zeros: NNC's load-balancing bias,
    which chooses but gets no gradient) picks ``k`` per token and sorts the token rows
    by expert; the experts' ``W_gate``, ``W_up [E, hidden, D]`` and
    ``W_down [E, D, hidden]`` (parameters 2-4) run as three ``segmented_gemm``; the
    rows, scaled by their routing weights, add back into their tokens (a
    ``scatter_add`` by token index: memory and work linear in the tokens).

    Each row's routing weight is its expert's probability ``p = sqrt(softplus(logit))``
    divided by the sum over the token's ``k`` choices, times ``weight_scale`` (NNC's
    formula, ``normalize=True``). With ``k=1`` that weight is always ``weight_scale``,
    so **the router gets no gradient and never trains**; pass ``normalize=False`` to
    weight each row by ``p`` itself (Switch Transformer's top-1 gate), which trains it.

    With ``return_load=True`` the layer has a second output: the rows each expert
    received, ``[E]`` float32 (its load).
    """

    owns_parameters = True

    def __init__(
        self,
        experts: int,
        hidden: int,
        *,
        k: int = 2,
        weight_scale: float = 1.0,
        return_load: bool = False,
        normalize: bool = True,
        **kw: Any,
    ):
        super().__init__(**kw)
        experts = positive_int(self, "experts", experts)
        hidden, k = positive_int(self, "hidden", hidden), positive_int(self, "k", k)
        if not 1 <= k <= experts:
            raise ModelError(
                f"layer {self.describe()}: k={k} must be in 1..{experts} (the number of experts)"
            )
        inf = float("inf")  # nan made every output NaN silently
        weight_scale = real_in(
            self, "weight_scale", weight_scale, -inf, inf, open_low=True, open_high=True,
            hint="a finite number; it multiplies each expert row's routing weight, e.g. 1.0",
        )  # fmt: skip
        self.experts, self.hidden, self.k = experts, hidden, k
        self.weight_scale = weight_scale
        self.return_load = flag(self, "return_load", return_load)
        self.normalize = flag(self, "normalize", normalize)  # bool("no") was True

    def num_outputs(self, num_inputs: int) -> int:
        return 2 if self.return_load else 1

    def build(self, ctx: BuildContext, x: Symbol) -> Any:
        b, name = ctx.b, ctx.layer_id(self)
        e, h, d = self.experts, self.hidden, x.shape[-1]
        lead = tuple(x.shape[:-1])
        tokens = int(np.prod(lead, dtype=np.int64))
        init = glorot_uniform([2], [1])
        router = ctx.param(self, 0, (e, d), glorot_uniform([1], [0]), x.dtype)
        route = ctx.param(self, 1, (e,), zeros, x.dtype)
        w_gate = ctx.param(self, 2, (e, h, d), init, x.dtype)
        w_up = ctx.param(self, 3, (e, h, d), init, x.dtype)
        w_down = ctx.param(self, 4, (e, d, h), init, x.dtype)
        flat = b.exec(ops.reshape(shape=(tokens, d)), x)
        logits = _dense(ctx, flat, router, f"{name}/router")
        routing = ops.moe_routing(
            kth=self.k, weight_scale=self.weight_scale, normalize=self.normalize
        )
        rows, weights, owner, which, counts = b.exec(routing, logits, route, flat, name=name)
        grouped = ops.segmented_gemm(transpose_b=True)
        gate = b.exec(grouped, rows, which, counts, w_gate, name=f"{name}/gate")
        up = b.exec(grouped, rows, which, counts, w_up, name=f"{name}/up")
        y = b.exec(grouped, _swiglu(ctx, gate, up, ""), which, counts, w_down, name=f"{name}/down")
        pairs = tokens * self.k
        weights = b.exec(ops.reshape(shape=(pairs, 1)), weights)
        y = b.exec(ops.mul(), y, b.exec(ops.datatype_conversion(dtype=x.dtype), weights))
        # Every row adds into its token: a scatter-add by token index, O(pairs * D) (a
        # one-hot [tokens, pairs] GEMM was quadratic in tokens: 2 GB of temporaries at 16k).
        out = b.exec(ops.scatter_add(bincount=tokens), y, owner, name=f"{name}/combine")
        out = b.exec(ops.reshape(shape=(*lead, d)), out)
        if not self.return_load:
            return out
        experts = b.constant(np.arange(e, dtype=np.int32).reshape(1, e))
        which = b.exec(ops.reshape(shape=(-1, 1)), which)
        hits = b.exec(
            ops.datatype_conversion(dtype=np.float32), b.exec(ops.compare(op="eq"), which, experts)
        )
        counts = b.exec(
            ops.datatype_conversion(dtype=np.float32), b.exec(ops.reshape(shape=(1, -1)), counts)
        )
        load = b.exec(ops.gemm(), counts, hits)
        return out, b.exec(ops.reshape(shape=(e,)), load, name=f"{name}/load")
