"""Trace rules for data movement: reshapes, transposes, broadcasts, conversions,
concatenation, slices, pads, row lookups (gather) and iota, as fnnc's data commands.

Part of :data:`fnnc.graph.trace_rules.TRACE_RULES` (see that module for the contract
every rule keeps).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.graph._trace_base import _kind, _out, _plain


def _reshape(ctx, eqn, args):
    if len(args) != 1 or not _plain(eqn.params, "dimensions", "sharding") or not ctx.has("reshape"):
        return None
    return [ctx.reshape(args[0], _out(eqn).shape)]


def _squeeze(ctx, eqn, args):
    if not ctx.has("reshape"):
        return None
    return [ctx.reshape(args[0], _out(eqn).shape)]


def _transpose(ctx, eqn, args):
    if not ctx.has("transpose"):
        return None
    return [ctx.transpose(args[0], eqn.params["permutation"])]


def _broadcast_in_dim(ctx, eqn, args):
    """broadcast_in_dim as a reshape (operand axes in place, size 1 elsewhere) + broadcast_to."""
    if len(args) != 1 or not _plain(eqn.params, "sharding"):
        return None
    (x,) = args
    shape, dims = tuple(eqn.params["shape"]), tuple(eqn.params["broadcast_dimensions"])
    if list(dims) != sorted(dims) or not ctx.has("reshape", "broadcast_to"):
        return None
    middle = [1] * len(shape)
    for i, d in enumerate(dims):
        middle[d] = x.shape[i]
    y = ctx.reshape(x, middle)
    return [y if y.shape == shape else ctx.exec("broadcast_to", y, shape=shape)]


def _convert(ctx, eqn, args):
    (x,) = args
    dtype = np.dtype(_out(eqn).dtype)
    if not _plain(eqn.params, "sharding"):
        return None
    if dtype == np.dtype(x.dtype):
        return [x]
    known = ctx.value(x)
    if known is not None and known.size == 1:  # a literal converted: a literal (jnp.pad's 0)
        return [ctx.constant(np.asarray(jax.lax.convert_element_type(known, dtype)), _out(eqn))]
    if not ctx.has("datatype_conversion"):
        return None
    return [ctx.exec("datatype_conversion", x, dtype=dtype)]


def _concatenate(ctx, eqn, args):
    if not ctx.has("concat"):
        return None
    return [ctx.exec("concat", *args, axis=int(eqn.params["dimension"]))]


def _slice(ctx, eqn, args):
    p = eqn.params
    params = {
        "start": tuple(int(s) for s in p["start_indices"]),
        "limit": tuple(int(s) for s in p["limit_indices"]),
        "strides": None if p["strides"] is None else tuple(int(s) for s in p["strides"]),
    }
    if not ctx.fits("slice", args, _out(eqn), **params):
        return None
    return [ctx.exec("slice", args[0], **params)]


def _pad(ctx, eqn, args):
    """pad with non-negative edges, no interior padding and a constant padding value."""
    x, fill = args
    config = eqn.params["padding_config"]
    value = ctx.value(fill)
    if value is None or any(lo < 0 or hi < 0 or mid != 0 for lo, hi, mid in config):
        return None
    params = {
        "pads": tuple((int(lo), int(hi)) for lo, hi, _ in config),
        "mode": "constant",
        "value": value.reshape(()).item(),
    }
    if not ctx.fits("pad", [x], _out(eqn), **params):
        return None
    return [ctx.exec("pad", x, **params)]


def _gather(ctx, eqn, args):
    """Rows of a table along axis 0 (``jnp.take``, ``x[idx]``, Flax's ``Embed``): a gather
    of ``[1, rest...]`` slices at indices ``[..., 1]``.

    Clipped lookups are ``embedding``, which clamps in the forward and the backward as
    JAX does. So are promised in-bounds ones (``x[i]``), where the two agree for every
    index the promise allows (outside it, JAX clamps the read but drops the gradient);
    FILL_OR_DROP (NaN outside ``[0, n)``) is ``index_select`` on indices whose negatives
    are first sent past the end, since ``index_select`` would count them from the end.
    """
    x, idx = args
    p, out = eqn.params, _out(eqn)
    dn, mode = p["dimension_numbers"], p["mode"]
    lead, rest = tuple(idx.shape[:-1]), tuple(x.shape[1:])
    if not (len(x.shape) >= 1 and len(idx.shape) >= 1 and idx.shape[-1] == 1):
        return None
    if (
        tuple(dn.collapsed_slice_dims) != (0,)
        or tuple(dn.start_index_map) != (0,)
        or dn.operand_batching_dims
        or dn.start_indices_batching_dims
        or tuple(dn.offset_dims) != tuple(range(len(lead), len(lead) + len(rest)))
        or tuple(p["slice_sizes"]) != (1, *rest)
    ):
        return None
    if not (_kind(x.dtype, "float") and jnp.issubdtype(idx.dtype, jnp.integer)):
        return None
    modes = jax.lax.GatherScatterMode
    if mode in (modes.CLIP, modes.PROMISE_IN_BOUNDS) and ctx.has("embedding", "reshape"):
        return [ctx.exec("embedding", x, ctx.reshape(idx, lead))]
    fill = p.get("fill_value")
    if mode != modes.FILL_OR_DROP or (fill is not None and not math.isnan(fill)):
        return None
    if not ctx.has("index_select", "reshape", "compare", "select"):
        return None
    flat = ctx.reshape(idx, (math.prod(lead),))
    if jnp.issubdtype(idx.dtype, jnp.signedinteger):
        below = ctx.exec("compare", flat, ctx.constant(np.zeros((), idx.dtype)), op="lt")
        flat = ctx.exec("select", below, ctx.constant(np.array(x.shape[0], idx.dtype)), flat)
    y = ctx.exec("index_select", x, flat, axis=0)
    return [ctx.reshape(y, out.shape)]


def _iota(ctx, eqn, args):
    """A constant: iota depends on its shape only (``one_hot``, masks)."""
    p = eqn.params
    if not _plain(p, "sharding"):
        return None
    shape, dim = tuple(p["shape"]), int(p["dimension"])
    ramp = np.arange(shape[dim], dtype=np.dtype(p["dtype"]))
    ramp = ramp.reshape([-1 if d == dim else 1 for d in range(len(shape))])
    return [ctx.constant(np.broadcast_to(ramp, shape).copy(), _out(eqn))]


def _rev(ctx, eqn, args):
    """``rev`` (``jnp.flip``; JAX's descending sort and argsort): of a constant, the
    reversed constant; otherwise an ``index_select`` of the reversed positions along
    each reversed axis (exact for every dtype, and differentiable as the flip is)."""
    (x,) = args
    dims = tuple(int(d) % max(len(x.shape), 1) for d in eqn.params["dimensions"])
    value = ctx.value(x)
    if value is not None:
        return [ctx.constant(np.flip(value, dims).copy(), _out(eqn))]
    dims = tuple(d for d in dims if x.shape[d] > 1)  # a length-1 axis reads the same
    if dims and not ctx.has("index_select"):
        return None
    for d in dims:
        back = ctx.constant(np.arange(x.shape[d] - 1, -1, -1, dtype=np.int32))
        x = ctx.exec("index_select", x, back, axis=d)
    return [x]


def _stack(ctx, eqn, args):
    """``stack`` (its own primitive since JAX 0.10; ``jnp.stack``): each operand
    reshaped with a size-1 ``axis``, then concatenated along it."""
    out = _out(eqn)
    axis = int(eqn.params["axis"]) % len(out.shape)
    if not args or any(tuple(a.shape) != tuple(args[0].shape) for a in args):
        return None
    if not ctx.has("reshape", "concat"):
        return None
    shape = (*args[0].shape[:axis], 1, *args[0].shape[axis:])
    parts = [ctx.reshape(a, shape) for a in args]
    return [parts[0] if len(parts) == 1 else ctx.exec("concat", *parts, axis=axis)]
