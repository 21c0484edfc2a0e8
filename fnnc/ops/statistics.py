"""Statistics and sampling: histogram, gumbel_argmax (NNC's HISTOGRAM and GUMBEL_ARGMAX).

``histogram`` counts every entry of a tensor into bins and returns ``(counts, stats)``:
``int32`` counts and ``[min, max, sum, sum of squares]`` in the input's dtype (min and
max skip NaNs, the sums do not); a 16-bit input is binned and summed in float32, as
NNC's float kernels bin it, and only the statistics are rounded back. The three NNC
layouts (``ccv_nnc_histogram_type_e``):

* ``"even"``: ``bins`` equal bins over ``[min, max)``; counts are ``[below min,
  bin 1 .. bin bins, at or above max, NaN]`` (``bins + 3`` entries);
* ``"bins"``: a second input of ``n`` ascending boundaries; counts are ``n + 2``
  entries: entry ``i`` counts values with exactly ``i`` boundaries ``<=`` them, the
  last counts NaNs;
* ``"logarithmic"``: boundaries ``+-min * rate^i`` below ``max`` on both sides of 0
  (``2 * ceil(log(max / min) / log(rate)) + 2`` counts, taken in float32 from the
  float32 min, max and rate as NNC's parameters are), ``"bins"`` with those boundaries.

A histogram returns at most :data:`MAX_COUNTS` counts: a layout that would need more
(``bins=10**9``, or a logarithmic ``rate`` a hair above 1) is refused before anything
is allocated.

``gumbel_argmax`` samples an index along ``axis`` from the softmax of ``x`` (the
Gumbel-max trick: argmax of ``x`` plus Gumbel noise), ``int32``, the axis kept as
size 1 like ``argmax``; its randomness comes from a key input like the ``random``
family's. Both are forward-only, as in NNC.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.core.command import NOTHING, Spec, defcommand
from fnnc.core.dtypes import at_least_float32
from fnnc.errors import CommandError
from fnnc.ops._rules import fail, norm_axes, require_choice, require_float, show
from fnnc.ops.random import _check_key, _key

TYPES = ("even", "logarithmic", "bins")
MAX_COUNTS = 2**24
"""The most counts an ``"even"`` or ``"logarithmic"`` histogram returns (``int32``
each: 64 MiB, and the logarithmic boundaries as much again). NNC's own tests
(``histogram.tests.c``) use 203 and 1,550."""


def _log_side(low: float, high: float, rate: float) -> int:
    """How many boundaries ``low * rate^i`` lie below ``high`` (on each side of 0),
    checked to fit :data:`MAX_COUNTS` before any is made: NNC's count where its float
    parameters hold the layout (see :func:`_float_layout`)."""
    if not all(math.isfinite(v) for v in (low, high, rate)):
        raise CommandError(
            "histogram: logarithmic bins need finite min, max and rate, got "
            f"min={low}, max={high}, rate={rate}"
        )
    ratio = high / low
    span = math.log(ratio) if math.isfinite(ratio) else math.log(high) - math.log(low)
    side = math.ceil(span / math.log(rate))
    floats = None if 2 * side + 2 > MAX_COUNTS else _float_layout(low, high, rate)
    side = side if floats is None else floats[2]
    if 2 * side + 2 > MAX_COUNTS:
        raise CommandError(
            f"histogram: logarithmic bins with min={low}, max={high}, rate={rate} need "
            f"2 * ceil(log(max / min) / log(rate)) + 2 = {2 * side + 2:.4g} counts; at "
            f"most {MAX_COUNTS} are allowed: raise rate or narrow [min, max)"
        )
    return side


def _one_float(low: float, high: float) -> bool:
    """Whether ``low < high`` are one float32 value, both in its normal range (NNC's
    float parameters, which it asserts differ); outside that range fnnc keeps doubles."""
    f32 = np.float32
    with np.errstate(all="ignore"):
        lo, hi = f32(low), f32(high)
        return bool(lo >= hi and np.isfinite(hi) and lo >= np.finfo(f32).tiny)


def _float_layout(low: float, high: float, rate: float) -> tuple[float, float, int] | None:
    """``(min, rate, side)`` as NNC computes them from its float parameters:
    ``upper_range = ceilf(logf(max / min) * log_base)`` with ``log_base = 1.0 /
    logf(rate)``, every step a C float (histogram_cpu_ref.c); a double count differed
    (rate=1.001 over [1e-12, 1e20): 147,442 counts, NNC's 147,436). ``None`` where the
    floats cannot hold the layout (min, max, rate or max / min not a normal float, or
    rate rounding to 1): the double layout stands there."""
    f32 = np.float32
    with np.errstate(all="ignore"):
        lo, hi, r = f32(low), f32(high), f32(rate)
        ratio = hi / lo
        usable = all(np.isfinite(v) and v >= np.finfo(f32).tiny for v in (lo, hi, ratio))
        if not (usable and r > 1):
            return None
        log_base = f32(1.0 / float(np.log(r)))
        return float(lo), float(r), int(np.ceil(np.log(ratio) * log_base))


def _log_bounds(low: float, high: float, rate: float) -> np.ndarray:
    side = _log_side(low, high, rate)
    floats = _float_layout(low, high, rate)
    low, rate = (low, rate) if floats is None else floats[:2]
    # rate^i alone overflows float64 where low is tiny (1e-300 * 2^1100 is finite): the
    # bound is then taken through logarithms; float32 makes such bounds inf either way.
    with np.errstate(over="ignore"):
        right = low * rate ** np.arange(side, dtype=np.float64)
    far = ~np.isfinite(right)
    right[far] = np.exp(math.log(low) + np.flatnonzero(far) * math.log(rate))
    with np.errstate(over="ignore"):
        return np.concatenate([-right[::-1], right]).astype(np.float32)


def _histogram_rule(x: Spec, boundaries: Spec | None = None, *, type, bins, min, max, rate):
    require_float("histogram", x)
    require_choice("histogram", "type", type, TYPES)
    if type == "bins":
        if boundaries is None or boundaries.ndim != 1:
            fail("histogram: type='bins' needs a 1-d tensor of ascending boundaries as input 1")
        n = boundaries.shape[0] + 2
    elif boundaries is not None:
        raise CommandError(f"histogram: type={type!r} takes no boundaries input; use type='bins'")
    elif type == "even":
        if bins < 1 or not np.float32(max) > np.float32(min):
            raise CommandError(
                f"histogram: even bins need bins >= 1 and max > min as float32 values (NNC's "
                f"parameter type), got {bins}, [{min}, {max})"
            )
        if bins + 3 > MAX_COUNTS:
            raise CommandError(
                f"histogram: bins={bins} gives bins + 3 counts; at most {MAX_COUNTS} are "
                f"allowed: give bins <= {MAX_COUNTS - 3}"
            )
        n = bins + 3
    else:
        if not (0 < min < max and rate > 1) or _one_float(min, max):
            raise CommandError(
                "histogram: logarithmic bins need 0 < min < max (as float32 values, NNC's "
                f"parameter type) and rate > 1, got min={min}, max={max}, rate={rate}"
            )
        n = 2 * _log_side(min, max, rate) + 2
    return Spec((n,), jnp.int32), Spec((4,), x.dtype)


def _count_between(x, bounds, closed_right_above_zero=False):
    """Counts per interval of sorted ``bounds``, left-closed; with
    ``closed_right_above_zero`` positive values' intervals are right-closed, as NNC's
    logarithmic bins (``ceilf(logf(v / min) / logf(rate))``: ``v == min * rate**k`` is
    in bin ``k``, ``v == min`` in the middle one with ``(-min, min)``)."""
    nan = jnp.isnan(x)
    x = jnp.where(nan, -jnp.inf, x)
    slot = jnp.searchsorted(bounds, x, side="right")
    if closed_right_above_zero:
        slot = jnp.where(x > 0, jnp.searchsorted(bounds, x, side="left"), slot)
    slot = jnp.where(nan, bounds.shape[0] + 1, slot)
    return jnp.zeros((bounds.shape[0] + 2,), jnp.int32).at[slot].add(1)


@defcommand(family="statistics", shape=_histogram_rule, uses=NOTHING, differentiable=False)
def histogram(x, boundaries=None, *, type="even", bins=10, min=0.0, max=1.0, rate=1.1):
    """Counts of ``x``'s entries per bin and ``[min, max, sum, sum of squares]``.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> counts, stats = ops.histogram(bins=2, min=0.0, max=2.0)(jnp.array([-1.0, 0.5, 1.5, 3.0]))
    >>> counts.tolist(), stats.tolist()
    ([1, 1, 1, 1, 0], [-1.0, 3.0, 4.0, 12.5])
    """
    # Bins and statistics in float32 at least (every 16-bit value is exact there): in
    # bfloat16, (x - min) * scale rounded 8.6% of uniform values into a neighbouring bin
    # of 100, and "bins" boundaries rounded to bfloat16 moved the edges themselves.
    flat = x.reshape(-1).astype(at_least_float32(x.dtype))
    if type == "even":
        nan = jnp.isnan(flat)
        # NNC's float range = bins / (max - min), each step rounded to float: the double
        # quotient rounded once moved values within an ulp of a bin edge to its neighbour
        lo, hi = np.asarray(min, flat.dtype), np.asarray(max, flat.dtype)
        scale = np.asarray(bins, flat.dtype) / (hi - lo)
        inside = jnp.clip(((flat - lo) * scale).astype(jnp.int32) + 1, 1, bins)
        slot = jnp.where(flat < min, 0, jnp.where(flat >= max, bins + 1, inside))
        slot = jnp.where(nan, bins + 2, slot)
        counts = jnp.zeros((bins + 3,), jnp.int32).at[slot].add(1)
    else:
        bounds = boundaries if type == "bins" else jnp.asarray(_log_bounds(min, max, rate))
        counts = _count_between(flat, bounds.astype(flat.dtype), type == "logarithmic")
    return counts, _stats(flat).astype(x.dtype)


def _stats(flat):
    """``[min, max, sum, sum of squares]``; min and max skip NaNs and are NaN where no
    value is left (an empty ``x`` too, whose sums are 0: NNC reads past the end)."""
    if flat.shape[0] == 0:
        return jnp.asarray([jnp.nan, jnp.nan, 0, 0], flat.dtype)
    return jnp.stack([jnp.nanmin(flat), jnp.nanmax(flat), jnp.sum(flat), jnp.sum(flat * flat)])


def _gumbel_rule(x: Spec, key: Spec, *, axis) -> Spec:
    require_float("gumbel_argmax", x)
    _check_key("gumbel_argmax", key)
    if x.ndim == 0:
        fail(f"gumbel_argmax: needs an input of rank >= 1, got {show(x)}")
    ax = norm_axes("gumbel_argmax", (axis,), x.ndim)[0]
    if x.shape[ax] == 0:  # argmax of no values: JAX's bare ValueError while tracing
        fail(f"gumbel_argmax: axis {ax} of {show(x)} is empty; it has no value to pick")
    return Spec(tuple(1 if d == ax else n for d, n in enumerate(x.shape)), jnp.int32)


@defcommand(
    family="statistics", shape=_gumbel_rule, uses=NOTHING, differentiable=False, random=True
)
def gumbel_argmax(x, key, *, axis=-1):
    """A sample of ``softmax(x)`` along ``axis``: ``argmax(x + Gumbel noise)``, ``int32``.
    The noise is added in float32 at least: in bfloat16, ``x + noise`` rounded to
    ties that argmax gave to the first index (8 equal logits of 100: 15.4% for index
    0, not 12.5%)."""
    noise = jax.random.gumbel(_key(key), x.shape, jnp.float32)
    wide = at_least_float32(x.dtype)
    return jnp.argmax(x.astype(wide) + noise.astype(wide), axis=axis, keepdims=True).astype(
        jnp.int32
    )
