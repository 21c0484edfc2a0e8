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
    flag,
    is_int,
    ones,
    positive_int,
    real_in,
    zeros,
)
from fnnc.models.spatial_layers import channels_first, channels_last, layout_of


def _tuple(layer: Layer, arg: str, axes: Any) -> tuple[Any, ...]:
    """``axes`` as a tuple, one int standing for itself (``axes=-1`` is ``axes=(-1,)``);
    a value that is neither (None, 3.5) is a :class:`ModelError` naming ``layer`` and
    ``arg`` (``tuple(None)`` was a bare TypeError). The entries are checked at build."""
    if isinstance(axes, (int, np.integer)):
        return (axes,)
    if not isinstance(axes, str):
        try:  # a list, a tuple, a 1-D NumPy array
            return tuple(axes)
        except TypeError:
            pass
    raise ModelError(
        f"layer {layer.describe()}: {arg} is {axes!r:.40} ({type(axes).__name__}); expected "
        f"one int axis or a sequence of them, e.g. {arg}=(-1,)"
    )


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


def _param_shape(layer: Layer, axes: Any, x: Symbol) -> tuple[int, ...]:
    """The sizes of ``x`` at ``axes`` in x's axis order, as the norm commands (and NNC's
    ``[1, .., C]`` scale with 1 off the axes) lay the scale out: ``axes=(-1, 1)`` of
    ``[N, T, C]`` is ``[T, C]``, not ``[C, T]``."""
    rank = len(x.shape)
    return tuple(x.shape[a] for a in sorted(a % rank for a in _axes(layer, axes, x)))


def _epsilon(layer: Layer, epsilon: Any) -> float:
    """A norm's ``epsilon``, a number >= 0: a negative one made constant inputs (variance
    0) NaN or inf silently."""
    return real_in(
        layer, "epsilon", epsilon, 0.0, float("inf"), open_high=True,
        hint="added to the variance (inf made every output the bias)",
    )  # fmt: skip


class BatchNorm(Layer):
    """Batch normalisation over all axes but the channel axis; running stats are internals.

    The channel axis is the last one (NHWC, the default) or, with ``format="NCHW"`` (as
    :class:`Conv`'s: also NNC's ints 1 / 2 for NCHW / NHWC), axis 1 of ``[batch,
    channels, spatial...]``, as NNC's ``ccv_cnnp_batch_norm`` reads the format of its
    input; the scale, bias and running statistics are ``[C]`` either way. The layer
    transposes an NCHW input to channels-last around the command, so its outputs,
    statistics and gradients equal its NHWC twin's on the transposed input.

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

    def __init__(
        self,
        *,
        momentum: float = 0.9,
        epsilon: float = 1e-5,
        format: Any = "NHWC",  # noqa: A002 (NNC's name)
        **kw: Any,
    ):
        super().__init__(**kw)
        self.momentum = real_in(
            self, "momentum", momentum, 0.0, 1.0,
            hint="it weights the old running statistic (PyTorch's momentum=0.1 is 0.9 here)",
        )  # fmt: skip
        self.epsilon = _epsilon(self, epsilon)
        self.format = layout_of(self, format)

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        first = self.format == "NCHW"
        if first and len(x.shape) < 2:
            raise ModelError(
                f"layer {self.describe()}: its input of shape {list(x.shape)} has no channel "
                "axis 1; format='NCHW' takes [batch, channels, spatial...] (rank 2 or more)"
            )
        if first:  # as NHWC, so the NCHW layer's numbers are its NHWC twin's to the bit
            x = channels_last(ctx, self, x)
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
        return channels_first(ctx, self, y) if first else y


class LayerNorm(Layer):
    """Layer normalisation over ``axes`` with scale and bias (parameters 0 and 1), shaped
    like the input at ``axes`` taken in the input's axis order, whatever order ``axes``
    lists them in."""

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
        self.axes, self.epsilon = _tuple(self, "axes", axes), _epsilon(self, epsilon)
        self.affine = flag(self, "elementwise_affine", elementwise_affine)

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        shape = _param_shape(self, self.axes, x)
        args = [x]
        if self.affine:
            args += [
                ctx.param(self, 0, shape, ones, x.dtype),
                ctx.param(self, 1, shape, zeros, x.dtype),
            ]
        cmd = ops.layer_norm(axes=self.axes, epsilon=self.epsilon)
        return ctx.b.exec(cmd, *args, name=ctx.layer_id(self))[0]


class GroupNorm(Layer):
    """Group normalisation (NNC's ``ccv_cnnp_group_norm``): the channels on ``group_axis``
    fall into ``groups`` equal groups, each normalised over its own channels and the
    ``reduce_axes``; then scaled and shifted per channel (parameters 0 and 1, ``[C]``).

    Args:
        groups: the number of groups; it must divide the channels.
        epsilon: added to the variance.
        group_axis: the channel axis (default -1, channels last; 1 for NCHW).
        reduce_axes: the other axes each group is normalised over. ``None`` (the
            default) is every axis but the batch axis 0 and ``group_axis``: the usual
            group norm of a CNN, per sample and group. ``()`` normalises each position
            over the group's channels alone. NNC's ``reduce_axis``/``axis_count`` list
            them explicitly, e.g. ``(1, 2)`` for NHWC, ``(2, 3)`` for NCHW.
        elementwise_affine: ``False`` makes no scale or bias (NNC's
            ``elementwise_affine=0``): the plain normalised groups.

    An axis out of range for the input, or ``reduce_axes`` that repeat or include
    ``group_axis``, is a :class:`ModelError` naming the layer at build.
    """

    owns_parameters = True

    def __init__(
        self,
        groups: int,
        *,
        epsilon: float = 1e-5,
        group_axis: int = -1,
        reduce_axes: Sequence[int] | None = None,
        elementwise_affine: bool = True,
        **kw: Any,
    ):
        super().__init__(**kw)
        self.groups = positive_int(self, "groups", groups)
        self.epsilon = _epsilon(self, epsilon)
        if not is_int(group_axis):
            raise ModelError(
                f"layer {self.describe()}: group_axis is {group_axis!r:.40} "
                f"({type(group_axis).__name__}); expected one int axis, e.g. -1 (NHWC) or 1 "
                "(NCHW)"
            )
        self.group_axis = int(group_axis)
        self.reduce_axes = None if reduce_axes is None else _tuple(self, "reduce_axes", reduce_axes)
        self.affine = flag(self, "elementwise_affine", elementwise_affine)

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        (ax,) = _axes(self, (self.group_axis,), x)
        reduce_axes = self.reduce_axes
        if reduce_axes is not None:
            rank = len(x.shape)
            reduce_axes = _axes(self, reduce_axes, x)
            if ax % rank in {a % rank for a in reduce_axes}:
                raise ModelError(
                    f"layer {self.describe()}: reduce_axes={reduce_axes} include its group_axis "
                    f"{ax} of the input {list(x.shape)}; the groups' own channels are always "
                    "reduced, list only the other axes"
                )
        args = [x]
        if self.affine:
            c = (x.shape[ax],)
            args += [ctx.param(self, 0, c, ones, x.dtype), ctx.param(self, 1, c, zeros, x.dtype)]
        cmd = ops.group_norm(
            groups=self.groups, axis=ax, epsilon=self.epsilon, reduce_axes=reduce_axes
        )
        return ctx.b.exec(cmd, *args, name=ctx.layer_id(self))[0]


class RMSNorm(Layer):
    """RMS normalisation over ``axes`` with a scale (parameter 0), shaped like the input
    at ``axes`` taken in the input's axis order, as :class:`LayerNorm`'s."""

    owns_parameters = True

    def __init__(self, *, axes: Sequence[int] = (-1,), epsilon: float = 1e-6, **kw: Any):
        super().__init__(**kw)
        self.axes, self.epsilon = _tuple(self, "axes", axes), _epsilon(self, epsilon)

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        shape = _param_shape(self, self.axes, x)
        scale = ctx.param(self, 0, shape, ones, x.dtype)
        cmd = ops.rms_norm(axes=self.axes, epsilon=self.epsilon)
        return ctx.b.exec(cmd, x, scale, name=ctx.layer_id(self))[0]
