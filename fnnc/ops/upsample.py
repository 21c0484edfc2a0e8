"""Upsample: enlarge the spatial axes of an NHWC (or NCHW) tensor, NNC's UPSAMPLE.

Follows ``lib/nnc/cmd/upsample`` in liuliu/ccv: the output size is
``int(n * scale + 0.5)``; nearest reads ``min(int((i + 0.5) * n / m), n - 1)``;
bilinear samples at half-pixel centres (edge-clamped), or NNC's ``align_corners``
formulas. The backward transposes the (linear) forward with
:func:`jax.linear_transpose`, so it keeps no activation alive.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.core.command import NOTHING, Spec, defcommand
from fnnc.core.dtypes import at_least_float32, is_inexact
from fnnc.errors import CommandError, DTypeError
from fnnc.ops import _spatial
from fnnc.ops._rules import fail, require_choice, show, to_shape

UPSAMPLE_MODES = ("nearest", "bilinear")


def _upsample_sizes(x: Spec, scale, mode: str, format) -> tuple[int, int, int]:
    """The output's H and W, and the input's H axis (W follows it)."""
    require_choice("upsample", "mode", mode, UPSAMPLE_MODES)
    sh, sw = _scales(scale)
    layout = _spatial.layout(format)
    if layout is None:
        raise CommandError(
            f"upsample: format is {format!r:.40}; expected {_spatial.LAYOUT_CHOICES}"
        )
    if x.ndim not in (3, 4):
        fail(
            f"upsample: expected a rank-4 {layout} input (or rank-3 "
            f"{layout[1:]}, one image), got {show(x)}; format='NCHW' takes channels-first "
            "tensors, format='NHWC' (the default) channels-last ones"
        )
    ax = x.ndim - (2 if layout == "NCHW" else 3)
    if mode == "bilinear" and not is_inexact(x.dtype):
        raise DTypeError(
            f"upsample: bilinear mode blends pixels and needs a floating-point input, got "
            f"{show(x)} (its weights would round to 0 or 1); convert it with "
            "fnnc.ops.datatype_conversion first, or use mode='nearest' (label maps)"
        )
    h, w = x.shape[ax], x.shape[ax + 1]
    ho, wo = _out_size(h, sh), _out_size(w, sw)
    if ho < h or wo < w:
        fail(f"upsample: scale {scale} would shrink {show(x)}; NNC's upsample only enlarges")
    if max(ho, wo) > _MAX_SIDE:
        fail(
            f"upsample: scale {scale} makes {show(x)} {ho} x {wo}, beyond the {_MAX_SIDE} "
            "entries an axis holds (NNC's dimensions are 32-bit ints); give a smaller scale"
        )
    return ho, wo, ax


_MAX_SIDE = 2**31 - 1


def _out_size(n: int, scale: float) -> int:
    """NNC's ``(int)(n * scale + 0.5)``: its scale is a C float, so the product is a
    float32 one (15 * 2.1 is 31.499998, giving 31 rows where a double product gives 32)
    before the double 0.5 is added and C truncates."""
    with np.errstate(over="ignore"):
        product = float(np.float32(n) * np.float32(scale))
    return int(product + 0.5) if math.isfinite(product) else _MAX_SIDE + 1


def _scales(scale: Any) -> tuple[float, float]:
    """``scale`` as ``(sh, sw)``, each a finite number > 0 (one number for both): a
    wrong count or NaN had failed inside the rule on unpacking or ``int(nan)``, and
    ``1e10`` ran out of memory building the sampling taps."""
    pair = (scale, scale) if not isinstance(scale, (tuple, list)) else tuple(scale)
    ok = len(pair) == 2 and all(
        isinstance(v, (int, float, np.integer, np.floating))
        and not isinstance(v, (bool, np.bool_))
        and math.isfinite(v)
        and v > 0
        for v in pair
    )
    if not ok:
        raise CommandError(
            f"upsample: scale must be (sh, sw), two finite numbers > 0 (or one for both), "
            f"got {scale!r}"
        )
    return float(pair[0]), float(pair[1])


def _taps(n_in: int, n_out: int, bilinear: bool, align: bool):
    """NNC's source indices and weights along one axis (float32 arithmetic, as in C)."""
    i = np.arange(n_out, dtype=np.float64)
    # An empty axis (n_out = 0, no taps) would divide 0 by 0 (NumPy's RuntimeWarning).
    num, den = (n_in - 1, max(1, n_out - 1)) if align else (n_in, max(1, n_out))
    r = np.float64(np.float32(num) / np.float32(den))
    if not bilinear:
        # C's xd * rwidth + 0.5 multiplies in float (an int times a float) and adds the
        # double 0.5 to that rounded product; (xd + 0.5) * rwidth is all double.
        scaled = (i.astype(np.float32) * np.float32(r)).astype(np.float64)
        src = (scaled + 0.5) if align else (i + 0.5) * r
        i0 = np.minimum(src.astype(np.int32), n_in - 1)
        return i0, None, None, None
    xs = (i * r if align else (i + 0.5) * r - 0.5).astype(np.float32)
    i0 = np.trunc(xs).astype(np.int32)  # C's (int) truncates: -0.25 -> 0, both taps at 0
    i1 = np.minimum(np.trunc(xs + 1).astype(np.int32), n_in - 1)
    w1 = xs - i0
    return i0, i1, 1 - w1, w1


def _resample(x: Any, axis: int, n_out: int, bilinear: bool, align: bool) -> Any:
    i0, i1, w0, w1 = _taps(x.shape[axis], n_out, bilinear, align)
    a = jnp.take(x, i0, axis=axis)
    if not bilinear:
        return a
    keep = tuple(n_out if d == axis else 1 for d in range(x.ndim))

    def weight(w):
        return to_shape(jnp.asarray(w.reshape(keep), x.dtype), a.shape)

    return a * weight(w0) + jnp.take(x, i1, axis=axis) * weight(w1)


def _upsample_shape(x: Spec, *, scale, mode, align_corners, format) -> Spec:
    ho, wo, ax = _upsample_sizes(x, scale, mode, format)
    return Spec((*x.shape[:ax], ho, wo, *x.shape[ax + 2 :]), x.dtype)


@defcommand(family="data", shape=_upsample_shape, uses=NOTHING)
def upsample(x, *, scale=(2, 2), mode="nearest", align_corners=False, format="NHWC"):
    """Enlarges the H and W axes of an NHWC tensor (or an HWC one) by ``scale = (sh, sw)``;
    with ``format="NCHW"`` (also NNC's ints 1 / 2 for NCHW / NHWC, as the layers'
    ``format``) those of an NCHW tensor (or a CHW one), as NNC's CPU kernel does when
    its input tensor is NCHW; the channel axis is left as it is either way.

    Follows NNC's UPSAMPLE (lib/nnc/cmd/upsample/ccv_nnc_upsample_cpu_ref.c): output
    size ``int(n * s + 0.5)``; ``"nearest"`` reads ``min(int((i + 0.5) * n / m), n - 1)``;
    ``"bilinear"`` samples at half-pixel centres ``(i + 0.5) * n / m - 0.5`` clamped to
    the edge (PyTorch's ``align_corners=False``). ``align_corners=True`` maps the corner
    pixels onto each other instead, as NNC's flag does. The backward scatters each
    output gradient back with the same weights. A 16-bit bilinear forward and every
    16-bit backward compute in float32 and round once.
    """
    ho, wo, ax = _upsample_sizes(x, scale, mode, format)
    bilinear = mode == "bilinear"
    # Bilinear blends in float32 at least and rounds once: in bfloat16 the weights
    # (1/6, 5/6 at scale 3) and the first axis' blend were rounded before the second's.
    dtype = x.dtype
    t = x.astype(at_least_float32(dtype)) if bilinear else x
    y = _resample(t, ax, ho, bilinear, align_corners)
    return _resample(y, ax + 1, wo, bilinear, align_corners).astype(dtype)


@upsample.backward
def _upsample_backward(grads, inputs, outputs, **params):
    # Transposed in float32 at least, rounded once: an input pixel's gradient sums the
    # shares of every output it reached (scale 32: 1024 of them; bfloat16 gave 100,
    # want 102.5).
    (g,), (x,) = grads, inputs
    wide = at_least_float32(g.dtype)
    (gx,) = jax.linear_transpose(
        lambda t: upsample.definition.forward(t, **params), Spec(x.shape, wide)
    )(g.astype(wide))
    return (gx.astype(x.dtype),)


# --- set, masked_fill, broadcast_to -------------------------------------------------------
