"""The normalisation layers: BatchNorm, LayerNorm, GroupNorm and RMSNorm (re-exported by
:mod:`fnnc.models.layers` and :mod:`fnnc.models`). Scales start at 1, biases at 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fnnc import ops
from fnnc.core.dtypes import at_least_float32, is_floating
from fnnc.core.ir import Symbol
from fnnc.models.layer import (
    BuildContext,
    Layer,
    ModelError,
    is_int,
    ones,
    positive_int,
    real_in,
    zeros,
)


def _tuple(axes: Any) -> tuple[Any, ...]:
    """``axes`` as a tuple, one int standing for itself (``axes=-1`` is ``axes=(-1,)``)."""
    return (axes,) if isinstance(axes, (int, np.integer)) else tuple(axes)


def _axes(layer: Layer, axes: Any, x: Symbol) -> tuple[int, ...]:
    """``axes`` of ``layer`` checked against the rank of its input ``x``: distinct ints in
    ``[-rank, rank)``; else a :class:`ModelError` naming the layer and the input's shape."""
    rank = len(x.shape)
    ok = all(is_int(a) for a in axes)
    if (
        not ok
        or not all(-rank <= a < rank for a in axes)
        or len({a % rank for a in axes}) < len(axes)
    ):
        raise ModelError(
            f"layer {layer.describe()}: axes={axes} do not fit its input of shape "
            f"{list(x.shape)}; expected distinct axes in [{-rank}, {rank}), e.g. axes=(-1,)"
        )
    return tuple(int(a) for a in axes)


class BatchNorm(Layer):
    """Batch normalisation over all axes but the last (NHWC); running stats are internals.

    In training the running statistics move as ``new = momentum * old + (1 - momentum)
    * batch`` (NNC's reading: ``momentum`` weights the old value, so PyTorch's 0.1 is
    0.9 here). Called twice in one model, the second call updates the statistics the
    first one updated (NNC's in-place update, a shared Flax NNX ``BatchNorm``): after
    one step, ``0.9 * (0.9 * m + 0.1 * mu1) + 0.1 * mu2``.

    Beside a float16 or bfloat16 input, the scale, bias and running statistics are
    float32, as NNC's ``ccv_cnnp_batch_norm`` makes them ("bump it to 32-bit"; cuDNN's
    mixed layout): a 16-bit running statistic stops moving once ``(1 - momentum) *
    (batch - old)`` is under half its spacing (a mean at 2.2 with momentum 0.99 never
    reached a batch mean of 3).
    """

    owns_parameters = True

    def __init__(self, *, momentum: float = 0.9, epsilon: float = 1e-5, **kw: Any):
        super().__init__(**kw)
        self.momentum = real_in(
            self, "momentum", momentum, 0.0, 1.0,
            hint="it weights the old running statistic (PyTorch's momentum=0.1 is 0.9 here)",
        )  # fmt: skip
        self.epsilon = real_in(self, "epsilon", epsilon, 0.0, float("inf"))

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        c = (x.shape[-1],)
        dtype = at_least_float32(x.dtype) if is_floating(x.dtype) else x.dtype
        scale = ctx.param(self, 0, c, ones, dtype)
        bias = ctx.param(self, 1, c, zeros, dtype)
        mean = ctx.param(self, 0, c, zeros, dtype, internal=True)
        var = ctx.param(self, 1, c, ones, dtype, internal=True)
        cmd = ops.batch_norm(
            axes=tuple(range(len(x.shape) - 1)),
            epsilon=self.epsilon,
            momentum=self.momentum,
            is_test=not ctx.training,
        )
        y, new_mean, new_var, _, _ = ctx.b.exec(
            cmd, x, scale, bias, mean, var, name=ctx.layer_id(self)
        )
        if ctx.training:
            ctx.update(self, 0, new_mean)
            ctx.update(self, 1, new_var)
        return y


class LayerNorm(Layer):
    """Layer normalisation over ``axes`` with scale and bias."""

    owns_parameters = True

    def __init__(
        self,
        *,
        axes: Sequence[int] = (-1,),
        epsilon: float = 1e-5,
        elementwise_affine: bool = True,
        **kw: Any,
    ):
        super().__init__(**kw)
        self.axes, self.epsilon, self.affine = _tuple(axes), epsilon, elementwise_affine

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        shape = tuple(x.shape[a] for a in _axes(self, self.axes, x))
        args = [x]
        if self.affine:
            args += [
                ctx.param(self, 0, shape, ones, x.dtype),
                ctx.param(self, 1, shape, zeros, x.dtype),
            ]
        cmd = ops.layer_norm(axes=self.axes, epsilon=self.epsilon)
        return ctx.b.exec(cmd, *args, name=ctx.layer_id(self))[0]


class GroupNorm(Layer):
    """Group normalisation, channels last."""

    owns_parameters = True

    def __init__(self, groups: int, *, epsilon: float = 1e-5, **kw: Any):
        super().__init__(**kw)
        self.groups, self.epsilon = positive_int(self, "groups", groups), epsilon

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        c = (x.shape[-1],)
        args = [x, ctx.param(self, 0, c, ones, x.dtype), ctx.param(self, 1, c, zeros, x.dtype)]
        cmd = ops.group_norm(groups=self.groups, epsilon=self.epsilon, reduce_axes=None)
        return ctx.b.exec(cmd, *args, name=ctx.layer_id(self))[0]


class RMSNorm(Layer):
    """RMS normalisation over ``axes`` with a scale."""

    owns_parameters = True

    def __init__(self, *, axes: Sequence[int] = (-1,), epsilon: float = 1e-6, **kw: Any):
        super().__init__(**kw)
        self.axes, self.epsilon = _tuple(axes), epsilon

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        shape = tuple(x.shape[a] for a in _axes(self, self.axes, x))
        scale = ctx.param(self, 0, shape, ones, x.dtype)
        cmd = ops.rms_norm(axes=self.axes, epsilon=self.epsilon)
        return ctx.b.exec(cmd, x, scale, name=ctx.layer_id(self))[0]
