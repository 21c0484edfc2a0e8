"""Convolution family: convolution and convolution_transpose (NNC's CONVOLUTION and
CONVOLUTION_TRANSPOSE).

Layouts follow NNC: ``x`` is channels-last ``[batch, spatial..., channels]`` (NHWC for
2-D), the weight is ``[out, k..., in/groups]`` (``[out, kh, kw, in/groups]``) and the
number of spatial axes (1, 2 or 3) is the weight's rank minus 2. As in NNC, ``x`` one
rank below the weight is one sample without the batch axis (HWC for 2-D), and so is
the result. Spatial
hyper-parameters take one int for every axis or one entry per axis; ``padding`` also
takes ``"SAME"`` / ``"VALID"``.

``convolution_transpose`` uses the *same* weight as the convolution it transposes: for
``w`` of shape ``[O, k..., C/groups]``, ``convolution`` maps ``[..., C] -> [..., O]`` and
``convolution_transpose`` maps ``[..., O] -> [..., C]``. It is the adjoint of that
convolution (the gradient of its input), as in NNC's
``lib/nnc/cmd/convolution/ccv_nnc_conv_transpose_cpu_ref.c`` (weight ``dim[0]`` = input
channels, ``dim[-1] * groups`` = output channels). Each backward is built from the
other command: the input gradient of a convolution is a transposed convolution and
vice versa.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from fnnc.core.command import Spec, Uses, defcommand
from fnnc.ops import _spatial
from fnnc.ops._rules import (
    fail,
    leading_sum,
    require_float,
    require_same_dtype,
    show,
    to_shape,
)

_DIMS = {
    1: ("NWC", "OWI", "NWC"),
    2: ("NHWC", "OHWI", "NHWC"),
    3: ("NDHWC", "ODHWI", "NDHWC"),
}


def _check(name: str, x: Any, w: Any, bias: Any, groups: int, channels_in: str) -> tuple[int, int]:
    """Rank, dtype, group and channel checks; returns (out channels, in channels)."""
    specs = [s for s in (x, w, bias) if s is not None]
    require_float(name, *specs)
    require_same_dtype(name, *specs)
    if w.ndim - 2 not in _DIMS:
        fail(f"{name}: weight {show(w)} must be [out, k..., in/groups] with 1 to 3 spatial axes")
    if any(k < 1 for k in w.shape[1:-1]):
        fail(
            f"{name}: weight {show(w)} has a kernel of {list(w.shape[1:-1])}; every kernel "
            "size must be at least 1 (a 0-size window sees nothing); make the kernel 1 or more"
        )
    if x.ndim != w.ndim:
        fail(
            f"{name}: x {show(x)} must be [batch, spatial..., channels] with {w.ndim - 2} "
            f"spatial axes to match weight {show(w)}, or [spatial..., channels] for one "
            "sample"
        )
    if not isinstance(groups, int) or groups < 1 or w.shape[0] % groups:
        fail(f"{name}: groups={groups!r} must be a positive int dividing weight {show(w)} dim 0")
    o, c = w.shape[0], w.shape[-1] * groups
    want = c if channels_in == "in" else o
    if x.shape[-1] != want:
        fail(
            f"{name}: weight {show(w)} expects {want} input channels (NHWC, weight "
            f"[out, k..., in/groups], groups={groups}), got x {show(x)}"
        )
    out_c = o if channels_in == "in" else c
    if bias is not None and tuple(bias.shape) != (out_c,):
        fail(f"{name}: bias {show(bias)} must be [{out_c}], one value per output channel")
    return o, c


def _conv_geometry(name: str, x: Any, w: Any, strides, padding, dilation):
    """(strides, explicit pads, dilation, output sizes) of a convolution of ``x``."""
    nd = w.ndim - 2
    s = _spatial.ints(name, "strides", strides, nd)
    d = _spatial.ints(name, "dilation", dilation, nd)
    k = _spatial.dilated(w.shape[1:-1], d)
    pads = _spatial.explicit(_spatial.padding_of(name, padding, nd), x.shape[1:-1], k, s)
    return s, pads, d, _spatial.out_sizes(name, show(x), x.shape[1:-1], pads, k, s)


def _transpose_geometry(name: str, x: Any, w: Any, strides, padding, dilation, output_padding):
    """(strides, explicit pads, dilation, output sizes, output_padding) of a transpose."""
    nd = w.ndim - 2
    s = _spatial.ints(name, "strides", strides, nd)
    d = _spatial.ints(name, "dilation", dilation, nd)
    r = _spatial.ints(name, "output_padding", output_padding, nd, low=0)
    if 0 in x.shape[1:-1]:
        # No convolution gives an empty spatial axis (its window never fits), so there
        # is none to transpose: the size formula would invent (k - s) cells from nothing.
        fail(
            f"{name}: x {show(x)} has an empty spatial axis; the convolution it transposes "
            "would have to output none, which no window does: give at least one cell per "
            "spatial axis"
        )
    if any(ri >= si for ri, si in zip(r, s)):
        fail(f"{name}: output_padding={output_padding!r} must be smaller than strides={strides!r}")
    k = _spatial.dilated(w.shape[1:-1], d)
    pad = _spatial.padding_of(name, padding, nd)
    if pad == "SAME":
        if any(r):
            fail(f"{name}: padding='SAME' gives size x * stride; output_padding must be 0")
        sizes = tuple(n * si for n, si in zip(x.shape[1:-1], s))
        # SAME pads nothing when the kernel is smaller than the stride, so the scatter
        # ends at (n - 1) * s + k; the cells up to n * s, which that convolution never
        # reads, are output padding (zero), as in _convolution_backward.
        lohi = _spatial.explicit(pad, sizes, k, s)
        r = _output_padding(sizes, x.shape[1:-1], s, k, lohi)
        return s, lohi, d, sizes, r
    else:
        lohi = _spatial.explicit(pad, (0,) * nd, k, s)
        sizes = tuple(
            (n - 1) * si + ki - lo - hi + ri
            for n, si, ki, (lo, hi), ri in zip(x.shape[1:-1], s, k, lohi, r)
        )
        if any(n < 1 for n in sizes):
            fail(
                f"{name}: padding={padding!r} leaves no output for x {show(x)} and weight {show(w)}"
            )
    return s, _spatial.explicit(pad, sizes, k, s), d, sizes, r


def _output_padding(sizes, in_sizes, s, k, pads) -> tuple[int, ...]:
    """The output_padding with which a transpose of ``in_sizes`` (strides ``s``, dilated
    kernel ``k``, explicit ``pads``) gives exactly ``sizes``."""
    return tuple(
        n - ((m - 1) * si + ki - lo - hi)
        for n, m, si, ki, (lo, hi) in zip(sizes, in_sizes, s, k, pads)
    )


def _conv(x, w, strides, pads, dilation, groups):
    return lax.conv_general_dilated(
        x, w, strides, pads, rhs_dilation=dilation,
        dimension_numbers=_DIMS[w.ndim - 2], feature_group_count=groups,
    )  # fmt: skip


def _conv_t(y, w, strides, pads, dilation, groups, output_padding):
    """The adjoint of ``_conv(., w, ...)``: dilate ``y``, convolve with the flipped weight."""
    o, *k, cg = w.shape
    nd = len(k)
    wt = jnp.reshape(w, (groups, o // groups, *k, cg))
    wt = jnp.moveaxis(jnp.moveaxis(wt, 1, -1), -2, 1)  # [groups, in/groups, k..., out/groups]
    wt = jnp.flip(jnp.reshape(wt, (groups * cg, *k, o // groups)), tuple(range(1, nd + 1)))
    keff = _spatial.dilated(k, dilation)
    pads = [(ke - 1 - lo, ke - 1 - hi + r) for ke, (lo, hi), r in zip(keff, pads, output_padding)]
    return lax.conv_general_dilated(
        y, wt, (1,) * nd, pads, lhs_dilation=strides, rhs_dilation=dilation,
        dimension_numbers=_DIMS[nd], feature_group_count=groups,
    )  # fmt: skip


def _grads(g, x, w, *, transpose, strides, pads, dilation, groups, output_padding, bias):
    """(gx, gw, gbias...) of ``_conv`` (or ``_conv_t`` when ``transpose``) at ``x, w``."""
    geometry = dict(strides=strides, pads=pads, dilation=dilation, groups=groups)
    if transpose:
        gx = _conv(g, w, **geometry)
        f = functools.partial(_conv_t, x, **geometry, output_padding=output_padding)
    else:
        gx = _conv_t(g, w, **geometry, output_padding=output_padding)
        f = functools.partial(_conv, x, **geometry)
    # The weight gradient is the transpose of a map linear in the weight.
    (gw,) = jax.linear_transpose(f, Spec(w.shape, w.dtype))(g)
    return (gx, gw) + ((leading_sum(g, range(g.ndim - 1)),) if bias else ())


def _conv_shape(x, w, bias=None, *, strides, padding, dilation, groups):
    one = _spatial.one_sample(x, w.ndim)
    x = _spatial.add_batch(x) if one else x
    o, _ = _check("convolution", x, w, bias, groups, "in")
    *_, sizes = _conv_geometry("convolution", x, w, strides, padding, dilation)
    out = Spec((x.shape[0], *sizes, o), x.dtype)
    return _spatial.drop_batch(out) if one else out


@defcommand(family="convolution", shape=_conv_shape, uses=Uses(inputs=(0, 1)))
def convolution(x, w, bias=None, *, strides=1, padding=0, dilation=1, groups=1):
    """Channels-last convolution with weight ``[out, k..., in/groups]`` plus optional bias.

    ``x`` is ``[batch, spatial..., in]`` with 1, 2 or 3 spatial axes (the weight's rank
    minus 2); the result is ``[batch, spatial'..., out]``. ``groups`` splits the
    channels into independent groups (``groups == in`` is a depthwise convolution).

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.convolution(padding="SAME")(jnp.ones((1, 5, 5, 3)), jnp.ones((8, 3, 3, 3))).shape
    (1, 5, 5, 8)
    """
    one = _spatial.one_sample(x, w.ndim)
    x = x[None] if one else x
    s, pads, d, _ = _conv_geometry("convolution", x, w, strides, padding, dilation)
    y = _conv(x, w, s, pads, d, groups)
    y = y if bias is None else y + to_shape(bias, y.shape)
    return y[0] if one else y


@convolution.backward
def _convolution_backward(grads, inputs, outputs, *, strides, padding, dilation, groups):
    (g,), (x, w, *bias) = grads, inputs
    g = g.astype(x.dtype)  # as the CPU backends' backward and max_pool's take it
    one = _spatial.one_sample(x, w.ndim)
    x, g = (x[None], g[None]) if one else (x, g)
    s, pads, d, sizes = _conv_geometry("convolution", x, w, strides, padding, dilation)
    keff = _spatial.dilated(w.shape[1:-1], d)
    r = _output_padding(x.shape[1:-1], sizes, s, keff, pads)  # gives back x's sizes
    geometry = dict(strides=s, pads=pads, dilation=d, groups=groups, output_padding=r)
    out = _grads(g, x, w, transpose=False, bias=bool(bias), **geometry)
    return (out[0][0], *out[1:]) if one else out


def _conv_t_shape(x, w, bias=None, *, strides, padding, dilation, groups, output_padding):
    one = _spatial.one_sample(x, w.ndim)
    x = _spatial.add_batch(x) if one else x
    _, c = _check("convolution_transpose", x, w, bias, groups, "out")
    geometry = _transpose_geometry(
        "convolution_transpose", x, w, strides, padding, dilation, output_padding
    )
    out = Spec((x.shape[0], *geometry[3], c), x.dtype)
    return _spatial.drop_batch(out) if one else out


@defcommand(family="convolution", shape=_conv_t_shape, uses=Uses(inputs=(0, 1)))
def convolution_transpose(
    x, w, bias=None, *, strides=1, padding=0, dilation=1, groups=1, output_padding=0
):
    """Transposed convolution: the adjoint of ``convolution`` with the same weight.

    For ``w`` of shape ``[O, k..., C/groups]``, maps ``x [batch, spatial..., O]`` to
    ``[batch, spatial'..., C]`` with ``spatial' = (spatial - 1) * strides + dilated k
    - pad_low - pad_high + output_padding`` (``spatial * strides`` for ``"SAME"``, also
    when the dilated kernel is smaller than the stride: the cells no window of the
    convolution reads are zero);
    ``output_padding`` (< strides) picks among the input sizes a strided convolution
    maps to the same output size. ``padding`` is that of the convolution being
    transposed (it crops the result).

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.convolution_transpose(strides=2, padding="SAME")(
    ...     jnp.ones((1, 4, 4, 8)), jnp.ones((8, 3, 3, 3))).shape
    (1, 8, 8, 3)
    """
    one = _spatial.one_sample(x, w.ndim)
    x = x[None] if one else x
    s, pads, d, _, r = _transpose_geometry(
        "convolution_transpose", x, w, strides, padding, dilation, output_padding
    )
    y = _conv_t(x, w, s, pads, d, groups, r)
    y = y if bias is None else y + to_shape(bias, y.shape)
    return y[0] if one else y


@convolution_transpose.backward
def _convolution_transpose_backward(
    grads, inputs, outputs, *, strides, padding, dilation, groups, output_padding
):
    (g,), (x, w, *bias) = grads, inputs
    g = g.astype(x.dtype)  # as the CPU backends' backward and max_pool's take it
    one = _spatial.one_sample(x, w.ndim)
    x, g = (x[None], g[None]) if one else (x, g)
    s, pads, d, _, r = _transpose_geometry(
        "convolution_transpose", x, w, strides, padding, dilation, output_padding
    )
    geometry = dict(strides=s, pads=pads, dilation=d, groups=groups, output_padding=r)
    out = _grads(g, x, w, transpose=True, bias=bool(bias), **geometry)
    return (out[0][0], *out[1:]) if one else out
