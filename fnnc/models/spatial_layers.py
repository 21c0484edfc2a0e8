"""The cnnp layers over spatial axes: :class:`Conv`, :class:`ConvTranspose`,
:class:`MaxPool`, :class:`AvgPool`, :class:`Upsample`.

Data is channels-last, ``[batch, spatial..., channels]`` (NHWC for images), unless a
layer is made with ``format="NCHW"`` (NNC's ``format``: ``[batch, channels,
spatial...]``, a convolution's weights in NNC's NCHW layout; :class:`BatchNorm` takes it
too); a size given as one int stands for every spatial axis of the input the layer is
called on (``Conv(16, 3)`` is 3x3 on NHWC, width 3 on ``[N, W, C]``), known at build.
Convolution weights are ``[filters, k..., in/groups]`` (NNC's ``[out, kh, kw,
in/groups]``), those of a transposed convolution ``[in, k..., filters/groups]`` (NNC's),
weight parameter 0, bias parameter 1.

>>> import numpy as np
>>> from fnnc.models import Conv, MaxPool, Sequential
>>> model = Sequential([Conv(4, 3, name="conv"), MaxPool(2)])
>>> model.compile([np.zeros((1, 8, 8, 3), np.float32)])
>>> model.parameters()["t-conv-0-0"].shape
(4, 3, 3, 3)
>>> model.evaluate([np.ones((1, 8, 8, 3), np.float32)]).shape
(1, 4, 4, 4)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fnnc import ops
from fnnc.core.ir import Symbol
from fnnc.errors import CommandError
from fnnc.models.layer import (
    BuildContext,
    Layer,
    ModelError,
    flag,
    glorot_uniform,
    is_int,
    positive_int,
    zeros,
)
from fnnc.ops import _spatial
from fnnc.ops.upsample import UPSAMPLE_MODES


def _sizes(layer: Layer, arg: str, value: Any) -> int | tuple[int, ...]:
    """``value`` of a constructor as one positive int (that size on every spatial axis of
    the input, matched at build by :func:`_per_axis`) or one positive int per spatial
    axis; else a :class:`ModelError` naming the layer (as :func:`positive_int`)."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(positive_int(layer, f"{arg}[{i}]", k) for i, k in enumerate(value))
    if not is_int(value):
        raise ModelError(
            f"layer {layer.describe()}: {arg} is {value!r:.40} ({type(value).__name__}); "
            "expected a positive int (the same size on every spatial axis) or one per "
            f"spatial axis, e.g. {arg}=(2, 2)"
        )
    return positive_int(layer, arg, value)


def _per_axis(layer: Layer, arg: str, value: Any, x: Symbol) -> tuple[int, ...]:
    """``value`` (an int, or one int per spatial axis) for the spatial axes of ``x``.

    Inside a model every input has a batch axis: a rank-``r`` input is ``[batch,
    spatial..., channels]`` with ``r - 2`` spatial axes, and an int stands for each of
    them (``Conv(16, 3)`` on NHWC is 3x3, on ``[N, W, C]`` a width-3 kernel). A tuple of
    another length, or an input without a spatial axis, is a :class:`ModelError` naming
    the layer and the input's shape (the ops' "one sample without a batch axis" reading
    would mix the samples of a batch)."""
    shape, nd = list(x.shape), len(x.shape) - 2
    if nd < 1:
        raise ModelError(
            f"layer {layer.describe()}: its input of shape {shape} has no spatial axis; "
            "expected [batch, spatial..., channels] (rank 3 or more), e.g. [N, W, C] or "
            "[N, H, W, C]: reshape the input first (Reshape((W, 1)) adds a channel axis)"
        )
    sizes = (value,) * nd if is_int(value) else tuple(value)
    if len(sizes) != nd:
        raise ModelError(
            f"layer {layer.describe()}: {arg}={value!r} does not fit its input of shape "
            f"{shape}: inside a model inputs are [batch, spatial..., channels] ([batch, "
            f"channels, spatial...] with format='NCHW'), so this one has {nd} spatial "
            f"axes; pass one int or {nd} ints, e.g. {arg}={(sizes[0],) * nd}"
        )
    return tuple(int(k) for k in sizes)


class Conv(Layer):
    """Channels-last convolution, weight ``[filters, k..., in/groups]`` (NHWC: ``[filters,
    kh, kw, in/groups]``).

    ``kernel_size`` is one int for every spatial axis of the input the layer is called
    on (inputs are ``[batch, spatial..., channels]``: ``Conv(16, 3)`` is 3x3 on NHWC, a
    width-3 kernel on ``[N, W, C]``) or one int per spatial axis.

    ``format="NCHW"`` (NNC's ``format``, also its ints 1 / 2 for NCHW / NHWC) makes the
    input and output channels-first ``[batch, channels, spatial...]`` and the weight NNC's
    NCHW one, ``[filters, in/groups, k...]``, so NCHW models and their weights port as
    they are; the layer transposes to channels-last around the convolution.

    >>> import numpy as np
    >>> from fnnc.models import Conv, Sequential
    >>> model = Sequential([Conv(4, 3, format="NCHW", name="c")])
    >>> model.compile([np.zeros((1, 3, 8, 8), np.float32)])
    >>> model.parameters()["t-c-0-0"].shape
    (4, 3, 3, 3)
    >>> model.evaluate([np.ones((1, 3, 8, 8), np.float32)]).shape
    (1, 4, 8, 8)
    """

    owns_parameters = True

    def __init__(
        self,
        filters: int,
        kernel_size: int | Sequence[int],
        *,
        strides: Any = 1,
        padding: Any = "SAME",
        dilation: Any = 1,
        groups: int = 1,
        no_bias: bool = False,
        format: Any = "NHWC",  # noqa: A002 (NNC's name)
        **kw: Any,
    ):
        super().__init__(**kw)
        self.filters = positive_int(self, "filters", filters)
        self.kernel_size = _sizes(self, "kernel_size", kernel_size)
        self.strides, self.padding, self.dilation = strides, padding, dilation
        self.groups = positive_int(self, "groups", groups)
        self.no_bias = flag(self, "no_bias", no_bias)
        self.format = layout_of(self, format)

    def _weight_ends(self, cin: int) -> tuple[int, int]:
        """The weight's first and channel dims: ``(filters, in/groups)``."""
        return self.filters, cin // self.groups

    def _command(self) -> Any:
        return ops.convolution(
            strides=self.strides, padding=self.padding, dilation=self.dilation, groups=self.groups
        )

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        kernel = _per_axis(self, "kernel_size", self.kernel_size, x)  # first: checks the rank
        first = self.format == "NCHW"
        cin = x.shape[1] if first else x.shape[-1]
        if cin % self.groups:
            raise ModelError(
                f"layer {self.describe()}: {cin} input channels ({self.format} input of "
                f"shape {list(x.shape)}) do not split into {self.groups} groups"
            )
        self._check(x)
        nk, (out, inner) = len(kernel), self._weight_ends(cin)
        shape = (out, inner, *kernel) if first else (out, *kernel, inner)
        w = ctx.param(self, 0, shape, glorot_uniform(range(1, nk + 2), [0]), x.dtype)
        bias = [] if self.no_bias else [ctx.param(self, 1, (self.filters,), zeros, x.dtype)]
        name = ctx.layer_id(self)
        if not first:
            return ctx.b.exec(self._command(), x, w, *bias, name=name)
        last = ops.transpose(perm=(0, *range(2, nk + 2), 1))  # NCHW -> NHWC, OIHW -> OHWI
        x = ctx.b.exec(last, x, name=f"{name}/nhwc")
        w = ctx.b.exec(last, w, name=f"{name}/weight_nhwc")
        y = ctx.b.exec(self._command(), x, w, *bias, name=name)
        back = ops.transpose(perm=(0, nk + 1, *range(1, nk + 1)))
        return ctx.b.exec(back, y, name=f"{name}/nchw")

    def _check(self, x: Symbol) -> None:
        """Checks of the input beyond the kernel's and the groups' (none for Conv)."""


class ConvTranspose(Conv):
    """Channels-last transposed convolution, NNC's ``ccv_cnnp_convolution_transpose``:
    weight ``[in, k..., filters/groups]`` (NHWC: ``[in, kh, kw, filters/groups]``, the
    layout NNC gives it, so NNC-written weights load as they are), parameter 0; bias
    ``[filters]``, parameter 1.

    It is the adjoint of a :class:`Conv` with the same weight, strides, padding and
    dilation (``ops.convolution_transpose``): ``[N, spatial..., in]`` goes to ``[N,
    (spatial - 1) * strides + dilated k - pads + output_padding, filters]``, ``spatial *
    strides`` with ``padding="SAME"`` (the default, as Conv's). ``padding`` is that of the
    convolution being transposed (NNC's hint border); ``output_padding`` (one int or one
    per spatial axis, each below its stride, NNC's ``output_padding``) picks among the
    sizes a strided convolution maps to the same size.

    >>> import numpy as np
    >>> from fnnc.models import ConvTranspose, Sequential
    >>> model = Sequential([ConvTranspose(4, 3, strides=2, padding=1, output_padding=1,
    ...                                   name="up")])
    >>> model.compile([np.zeros((1, 5, 5, 3), np.float32)])
    >>> model.parameters()["t-up-0-0"].shape
    (3, 3, 3, 4)
    >>> model.evaluate([np.ones((1, 5, 5, 3), np.float32)]).shape
    (1, 10, 10, 4)
    """

    def __init__(
        self,
        filters: int,
        kernel_size: int | Sequence[int],
        *,
        output_padding: Any = 0,
        **kw: Any,
    ):
        super().__init__(filters, kernel_size, **kw)
        many = isinstance(output_padding, Sequence) and not isinstance(output_padding, str)
        values = list(output_padding) if many else [output_padding]
        if not all(is_int(r) and r >= 0 for r in values):
            raise ModelError(
                f"layer {self.describe()}: output_padding is {output_padding!r:.40}; expected "
                "an int >= 0 (below the stride) or one per spatial axis, e.g. output_padding=1"
            )
        self.output_padding = tuple(int(r) for r in values) if many else int(values[0])
        if self.filters % self.groups:
            raise ModelError(
                f"layer {self.describe()}: filters={self.filters} do not split into "
                f"groups={self.groups}; filters must be a multiple of groups"
            )

    def _weight_ends(self, cin: int) -> tuple[int, int]:
        """The weight's first and channel dims: ``(in, filters/groups)``, NNC's."""
        return cin, self.filters // self.groups

    def _command(self) -> Any:
        return ops.convolution_transpose(
            strides=self.strides,
            padding=self.padding,
            dilation=self.dilation,
            groups=self.groups,
            output_padding=self.output_padding,
        )

    def _check(self, x: Symbol) -> None:
        if not is_int(self.output_padding):
            _per_axis(self, "output_padding", self.output_padding, x)


def layout_of(layer: Layer, format: Any) -> str:  # noqa: A002 (NNC's name)
    """A spatial layer's ``format`` (Conv's, the pools', BatchNorm's, Upsample's):
    ``"NHWC"`` or ``"NCHW"`` (any case), or NNC's ``CCV_TENSOR_FORMAT_*`` ints (1 NCHW, 2
    NHWC; 0, NNC's "as the input", is NHWC); else a :class:`ModelError` naming the
    layer."""
    found = _spatial.layout(format)
    if found is None:
        raise ModelError(
            f"layer {layer.describe()}: format is {format!r:.40}; expected "
            f"{_spatial.LAYOUT_CHOICES}"
        )
    return found


def channels_last(ctx: BuildContext, layer: Layer, x: Symbol) -> Symbol:
    """``x``, a channels-first ``[batch, channels, spatial...]`` input of ``layer``, as
    channels-last ``[batch, spatial..., channels]``."""
    perm = (0, *range(2, len(x.shape)), 1)
    return ctx.b.exec(ops.transpose(perm=perm), x, name=f"{ctx.layer_id(layer)}/nhwc")


def channels_first(ctx: BuildContext, layer: Layer, y: Symbol) -> Symbol:
    """``y``, a channels-last result of ``layer``, back as channels-first."""
    perm = (0, len(y.shape) - 1, *range(1, len(y.shape) - 1))
    return ctx.b.exec(ops.transpose(perm=perm), y, name=f"{ctx.layer_id(layer)}/nchw")


class _Pool(Layer):
    """A pool over the spatial axes of ``[batch, spatial..., channels]``: ``window`` is
    one int for every spatial axis of the input (``MaxPool(2)`` is 2x2 on NHWC, width 2
    on ``[N, W, C]``, as ``Conv(16, 3)`` is 3x3) or one int per spatial axis.
    ``window=0`` (or all zeros) is a global pool over the whole spatial extent of the
    input, ``[N, 1, 1, C]`` for NHWC, as NNC's ``kdim`` of zeros
    (``ccv_cnnp_average_pool(DIM_ALLOC(0, 0), ...)``, its ResNet's last pool).

    ``format="NCHW"`` (as :class:`Conv`'s: also NNC's ints 1 / 2 for NCHW / NHWC) pools
    a channels-first ``[batch, channels, spatial...]`` input into a channels-first
    output, as NNC's pool commands do on an NCHW tensor; the layer transposes to
    channels-last around the pool."""

    command: Any = None

    def __init__(
        self,
        window: int | Sequence[int] = 2,
        *,
        strides: Any = None,
        padding: Any = 0,
        format: Any = "NHWC",  # noqa: A002 (NNC's name)
        **kw: Any,
    ):
        super().__init__(**kw)
        many = isinstance(window, Sequence) and not isinstance(window, str)
        values = list(window) if many else [window]
        # all zeros: global (None), NNC's kdim {0, 0}; a zero beside sizes stays an error
        whole = bool(values) and all(is_int(k) and k == 0 for k in values)
        self.window = None if whole else _sizes(self, "window", window)
        self.strides, self.padding = strides, padding
        self.format = layout_of(self, format)

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        _per_axis(self, "window", 1 if self.window is None else self.window, x)  # the rank
        first = self.format == "NCHW"
        if first:
            x = channels_last(ctx, self, x)
        if self.window is None:  # NNC's kdim of zeros: the input's spatial extent
            window = tuple(int(n) for n in x.shape[1:-1])
        else:
            window = _per_axis(self, "window", self.window, x)
        cmd = type(self).command(window=window, strides=self.strides, padding=self.padding)
        y = ctx.b.exec(cmd, x, name=ctx.layer_id(self))
        return channels_first(ctx, self, y) if first else y


class MaxPool(_Pool):
    """Max pooling over the spatial axes of ``[batch, spatial..., channels]`` (``[batch,
    channels, spatial...]`` with ``format="NCHW"``); an int ``window`` is that size on
    every spatial axis (``MaxPool(2)`` is 2x2 on NHWC and on NCHW)."""

    command = ops.max_pool


class AvgPool(_Pool):
    """Average pooling over the spatial axes of ``[batch, spatial..., channels]``
    (``[batch, channels, spatial...]`` with ``format="NCHW"``; padded cells not counted,
    as NNC); an int ``window`` is that size on every spatial axis."""

    command = ops.avg_pool


class Upsample(Layer):
    """NNC's ``ccv_cnnp_upsample``: enlarges H and W of ``[batch, H, W, channels]`` (or
    ``[batch, channels, H, W]`` with ``format="NCHW"``, as :class:`Conv`'s: also NNC's
    ints 1 / 2) by ``scale``, one number for both or ``(sh, sw)`` (NNC's arguments are
    ``width_scale, height_scale``: mind the order); the output size is ``int(n * s +
    0.5)``. ``mode`` is ``"nearest"`` or ``"bilinear"``, ``align_corners`` NNC's flag;
    the values are :func:`fnnc.ops.upsample`'s. A wrong scale or input is a
    :class:`ModelError` naming the layer at build.

    >>> import numpy as np
    >>> from fnnc.models import Sequential, Upsample
    >>> model = Sequential([Upsample(2, format="NCHW")])
    >>> model.compile([np.zeros((1, 3, 4, 5), np.float32)])
    >>> model.evaluate([np.ones((1, 3, 4, 5), np.float32)]).shape
    (1, 3, 8, 10)
    """

    def __init__(
        self,
        scale: Any = 2,
        *,
        mode: str = "nearest",
        align_corners: bool = False,
        format: Any = "NHWC",  # noqa: A002 (NNC's name)
        **kw: Any,
    ):
        super().__init__(**kw)
        if mode not in UPSAMPLE_MODES:
            raise ModelError(
                f"layer {self.describe()}: mode is {mode!r:.40}; expected one of "
                f"{', '.join(map(repr, UPSAMPLE_MODES))}"
            )
        self.format = layout_of(self, format)
        align = flag(self, "align_corners", align_corners)
        try:
            self.command = ops.upsample(
                scale=scale, mode=mode, align_corners=align, format=self.format
            )
        except CommandError as e:  # a scale of the wrong kind
            raise ModelError(f"layer {self.describe()}: {e}") from None

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        return ctx.b.exec(self.command, x, name=ctx.layer_id(self))
