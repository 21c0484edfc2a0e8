"""Spatial hyper-parameters shared by convolution and pooling.

``strides``, ``dilation``, ``window`` and ``output_padding`` take one int for every
spatial axis or a tuple with one int per axis; ``padding`` takes ``"SAME"``,
``"VALID"``, one int, or a tuple with one int or ``(low, high)`` pair per axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from fnnc.core.command import Spec
from fnnc.ops._rules import fail

Pads = tuple[tuple[int, int], ...]


def one_sample(x: Any, batched_rank: int) -> bool:
    """NNC's tensors without a batch axis: ``x`` one rank below ``batched_rank`` (a
    convolution's weight rank, a pool's spatial axes + 2) is one sample."""
    return x is not None and len(x.shape) == batched_rank - 1


def add_batch(x: Any) -> Any:
    """``x`` (an array or a spec) with a leading batch axis of 1."""
    if isinstance(x, (Spec, jax.ShapeDtypeStruct)):
        return Spec((1, *x.shape), x.dtype)
    return x[None]


def drop_batch(x: Any) -> Any:
    """``x`` (an array or a spec) without its leading batch axis of 1."""
    if isinstance(x, (Spec, jax.ShapeDtypeStruct)):
        return Spec(tuple(x.shape[1:]), x.dtype)
    return x[0]


_LAYOUTS = {"NHWC": "NHWC", "NCHW": "NCHW", 0: "NHWC", 1: "NCHW", 2: "NHWC"}

LAYOUT_CHOICES = (
    "'NHWC' (the default, channels last) or 'NCHW' (channels first), "
    "or NNC's ints 1 (NCHW) / 2 (NHWC)"
)


def layout(format: Any) -> str | None:
    """A spatial ``format``: ``"NHWC"`` or ``"NCHW"`` (any case), or NNC's
    ``CCV_TENSOR_FORMAT_*`` ints (1 NCHW, 2 NHWC; 0, NNC's "as the input", is NHWC), as
    ``"NHWC"`` / ``"NCHW"``; ``None`` for anything else (bools, NNC's CHWN 4), which
    the caller reports naming its layer or command (:data:`LAYOUT_CHOICES`)."""
    key = format.upper() if isinstance(format, str) else format
    if isinstance(format, (bool, np.bool_)) or not isinstance(key, (str, int, np.integer)):
        return None
    return _LAYOUTS.get(key)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def ints(name: str, what: str, value: Any, nd: int, *, low: int = 1) -> tuple[int, ...]:
    """``value`` as ``nd`` ints, each at least ``low``."""
    out = (value,) * nd if _is_int(value) else tuple(value) if isinstance(value, tuple) else None
    if out is None or len(out) != nd or not all(_is_int(v) for v in out):
        rank = (
            f" (inputs are [batch, spatial..., channels]: a rank-{nd + 2} input has {nd}; "
            "give one image without a batch axis a batch axis of 1, x[None])"
            if isinstance(value, tuple) and len(value) == nd + 1
            else ""
        )
        fail(
            f"{name}: {what}={value!r} does not fit {nd} spatial axes; "
            f"pass one int or a tuple of {nd} ints{rank}"
        )
    if any(v < low for v in out):
        fail(f"{name}: {what}={value!r} must be >= {low} on every axis")
    return out


def padding_of(name: str, padding: Any, nd: int) -> str | Pads:
    """``"SAME"``, ``"VALID"`` or explicit ``(low, high)`` pairs, one per axis."""
    if isinstance(padding, str):
        if padding.upper() not in ("SAME", "VALID"):
            fail(f"{name}: padding={padding!r}; use 'SAME', 'VALID', an int or (low, high) pairs")
        return padding.upper()
    if _is_int(padding):
        padding = (padding,) * nd
    if not isinstance(padding, tuple) or len(padding) != nd:
        fail(
            f"{name}: padding={padding!r} does not fit {nd} spatial axes; "
            f"pass {nd} (low, high) pairs"
        )
    pairs = []
    for p in padding:
        pair = (p, p) if _is_int(p) else p
        if not (
            isinstance(pair, tuple) and len(pair) == 2 and all(_is_int(v) and v >= 0 for v in pair)
        ):
            fail(f"{name}: padding entry {p!r} must be an int or a (low, high) pair of ints >= 0")
        pairs.append(pair)
    return tuple(pairs)


def explicit(
    padding: str | Pads, sizes: Sequence[int], windows: Sequence[int], strides: Sequence[int]
) -> Pads:
    """Explicit pads for input ``sizes``; ``"SAME"`` splits like TensorFlow (extra at the end)."""
    if padding == "VALID":
        return ((0, 0),) * len(sizes)
    if padding == "SAME":
        pads = []
        for n, k, s in zip(sizes, windows, strides):
            total = max((-(-n // s) - 1) * s + k - n, 0)
            pads.append((total // 2, total - total // 2))
        return tuple(pads)
    return padding  # type: ignore[return-value]


def out_sizes(
    name: str,
    x: Any,
    sizes: Sequence[int],
    pads: Pads,
    windows: Sequence[int],
    strides: Sequence[int],
) -> tuple[int, ...]:
    """Output sizes of a strided window; fails when a window does not fit."""
    out = []
    for n, (lo, hi), k, s in zip(sizes, pads, windows, strides):
        if n + lo + hi < k:
            fail(
                f"{name}: a window of {k} (dilated) does not fit spatial size {n} with padding "
                f"({lo}, {hi}) in x {x}; pad more or use a smaller window"
            )
        out.append((n + lo + hi - k) // s + 1)
    return tuple(out)


def dilated(windows: Sequence[int], dilation: Sequence[int]) -> tuple[int, ...]:
    return tuple((k - 1) * d + 1 for k, d in zip(windows, dilation))
