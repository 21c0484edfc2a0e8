"""Data commands that write values of their own: pad, set, masked_fill.

``pad`` adds entries around each axis (a constant, a mirror or the edge entry), ``set``
makes a tensor of one value (NNC's SET) and ``masked_fill`` replaces the entries a mask
picks (NNC's MASKED_FILL). A value they write must be one the tensor's dtype holds
(whole, finite and in range for integer and bool types), else a ``DTypeError``. Their
backwards need shapes only, never an activation (``masked_fill`` keeps its mask).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import NOTHING, Spec, Uses, defcommand, is_float
from fnnc.ops._rules import (
    broadcast_shape,
    fail,
    jax_dtype,
    require_choice,
    require_ints,
    require_storable,
    show,
    to_shape,
)

PAD_MODES = ("constant", "reflect", "edge")


def _pad_shape(x: Spec, *, pads, mode, value) -> Spec:
    require_choice("pad", "mode", mode, PAD_MODES)
    pads = require_ints("pad", "pads", pads)
    if len(pads) != x.ndim or any(len(p) != 2 for p in pads):
        fail(f"pad: pads {list(pads)} needs one (lo, hi) pair per axis of {show(x)}")
    out = []
    for d, ((lo, hi), n) in enumerate(zip(pads, x.shape)):
        if lo < 0 or hi < 0:
            fail(f"pad: axis {d}: pads must be >= 0, got ({lo}, {hi}); use slice to crop")
        if mode == "reflect" and (lo or hi) and max(lo, hi) >= n:
            fail(f"pad: reflect padding of axis {d} of {show(x)} needs lo, hi < {n}, got {lo, hi}")
        if mode == "edge" and (lo or hi) and n == 0:
            fail(
                f"pad: edge padding of axis {d} of {show(x)} repeats its edge entry, but the "
                "axis is empty; use mode='constant' to pad an empty axis"
            )
        out.append(lo + n + hi)
    if mode == "constant":
        require_storable("pad", "value", value, x.dtype)
    return Spec(tuple(out), x.dtype)


@defcommand(family="data", shape=_pad_shape, uses=NOTHING)
def pad(x, *, pads, mode="constant", value=0.0):
    """Pads each axis by ``pads[axis] = (lo, hi)`` entries.

    Modes (NumPy's names): ``"constant"`` writes ``value``; ``"reflect"`` mirrors
    without repeating the edge (``[1, 2, 3] -> [3, 2, 1, 2, 3, 2, 1]``); ``"edge"``
    repeats the edge entry (NNC's PAD_REPLICATE).
    """
    pads = require_ints("pad", "pads", pads)
    if mode == "constant":
        return jnp.pad(x, pads, mode="constant", constant_values=jnp.asarray(value, x.dtype))
    return jnp.pad(x, pads, mode=mode)


@pad.backward
def _pad_backward(grads, inputs, outputs, *, pads, mode, value):
    (g,), (x,) = grads, inputs
    pads = require_ints("pad", "pads", pads)
    if not is_float(x):
        return (None,)
    if mode == "constant":
        lows = [lo for lo, _ in pads]
        return (lax.slice(g, lows, [lo + n for lo, n in zip(lows, x.shape)]),)
    # reflect / edge padding is linear in x: its transpose folds the mirrored entries back.
    return jax.linear_transpose(lambda t: jnp.pad(t, pads, mode=mode), Spec(x.shape, g.dtype))(g)


def _set_shape(*, shape, dtype, value) -> Spec:
    shape = require_ints("set", "shape", shape)
    if any(n < 0 for n in shape):
        fail(f"set: shape {list(shape)} has a negative size")
    require_storable("set", "value", value, jax_dtype(dtype))
    return Spec(shape, jax_dtype(dtype))


@defcommand(family="data", shape=_set_shape, uses=NOTHING, differentiable=False)
def set(*, shape, dtype="float32", value=0.0):
    """A tensor of ``shape`` filled with ``value`` (no inputs), NNC's SET. For an
    integer or bool ``dtype`` the value must be one it holds (whole, finite, in range;
    so must ``pad``'s ``value`` and ``masked_fill``'s ``fill``): else a DTypeError."""
    return jnp.full(require_ints("set", "shape", shape), value, jax_dtype(dtype))


def _eq_value(eq: Any, dtype: Any) -> Any:
    """``eq`` rounded half up for an integer mask: NNC's ``(int)(eq + 0.5)`` for every
    ``eq >= -0.5``; below that C's cast truncates toward zero (``eq = -1`` compares with
    0), an artifact fnnc does not copy (``-1`` compares with -1)."""
    return math.floor(eq + 0.5) if jnp.issubdtype(dtype, jnp.integer) else eq


def _masked_fill_shape(x: Spec, mask: Spec, *, eq, fill) -> Spec:
    if broadcast_shape("masked_fill", x.shape, mask.shape) != tuple(x.shape):
        fail(f"masked_fill: mask {show(mask)} must broadcast to x {show(x)} without enlarging it")
    require_storable("masked_fill", "fill", fill, x.dtype)
    return Spec(tuple(x.shape), x.dtype)


@defcommand(family="data", shape=_masked_fill_shape, uses=Uses(inputs=(1,)))
def masked_fill(x, mask, *, eq=0, fill=0.0):
    """``fill`` where ``mask == eq``, else ``x`` (NNC's MASKED_FILL); mask broadcasts."""
    hit = to_shape(mask, x.shape) == _eq_value(eq, mask.dtype)
    if is_float(x):  # as C converts: -1e8 is -inf in float16, with no overflow warning
        with np.errstate(over="ignore"):
            value = jnp.asarray(np.asarray(fill, np.float64).astype(x.dtype))
    else:
        value = jnp.asarray(fill, x.dtype)
    return jnp.where(hit, value, x)


@masked_fill.backward
def _masked_fill_backward(grads, inputs, outputs, *, eq, fill):
    (g,), (x, mask) = grads, inputs
    if not is_float(x):
        return None, None
    hit = to_shape(mask, g.shape) == _eq_value(eq, mask.dtype)
    return jnp.where(hit, jnp.zeros((), g.dtype), g), None
