"""Trace rules: how :func:`~fnnc.graph.trace` maps JAX primitives to fnnc commands.

:data:`TRACE_RULES` maps a primitive name to ``rule(ctx, eqn, args)``: ``ctx`` is the
tracer (``exec``, ``reshape``, ``transpose``, ``has``, ``fits``, ``value``,
``inline``), ``eqn`` the jaxpr equation, ``args`` its input symbols. A rule returns
the output symbols, or ``None`` to leave the equation to the generic ``primitive``
node; it checks what it needs (dtypes, parameters, registered commands) *before*
adding nodes, so a declined equation leaves nothing behind.

Every mapping is value-preserving: jaxpr binary ops broadcast rank-0 and size-1 axes,
as fnnc's elementwise commands do (NumPy rules), and a rule only fires where the
command computes exactly what the primitive computes (``sub`` of integers, say, maps
only for signed types, where ``a + (-1) * b`` wraps like ``a - b``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Spec = jax.ShapeDtypeStruct
Rule = Callable[[Any, Any, list[Any]], list[Any] | None]

# Rules that may see non-array values (PRNG keys) and pass them through unchanged.
PASS_THROUGH = frozenset({"jit"})


def _out(eqn: Any, i: int = 0) -> Any:
    return eqn.outvars[i].aval


def _kind(dtype: Any, kind: str) -> bool:
    """``real``: float or signed int; ``float``: real floating; ``number``: not bool."""
    dtype = np.dtype(dtype)
    if kind == "float":
        return jnp.issubdtype(dtype, jnp.floating)
    if kind == "real":
        return jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.signedinteger)
    if kind == "inexact":
        return jnp.issubdtype(dtype, jnp.inexact)
    if kind == "number":
        return dtype != np.bool_
    return True


def _plain(params: dict[str, Any], *keys: str) -> bool:
    """The parameters that would change the result (accuracy, sharding...) are unset."""
    return all(params.get(k) is None for k in keys)


def _simple(cmd: str, kind: str = "any", **params: Any) -> Rule:
    """A primitive that is exactly one command on the same inputs."""

    def rule(ctx, eqn, args):
        if not (_kind(args[0].dtype, kind) and _plain(eqn.params, "accuracy")):
            return None
        if not ctx.fits(cmd, args, _out(eqn), **params):
            return None
        return [ctx.exec(cmd, *args, **params)]

    rule.__name__ = f"rule_{cmd}"
    return rule


def _square(ctx, eqn, args):
    (x,) = args
    if not (_kind(x.dtype, "number") and ctx.has("mul")):
        return None
    return [ctx.exec("mul", x, x)]


def _integer_pow(ctx, eqn, args):
    """``x ** y`` for a positive int ``y`` as ``mul`` nodes, squaring as JAX's lowering
    does (so the products round alike): tanh-GELU's ``x ** 3`` is ``x * (x * x)``."""
    (x,) = args
    y = eqn.params["y"]
    if not (2 <= y <= 16 and _kind(x.dtype, "number") and ctx.has("mul")):
        return None
    acc = None
    while y > 0:
        if y & 1:
            acc = x if acc is None else ctx.exec("mul", acc, x)
        y >>= 1
        if y:
            x = ctx.exec("mul", x, x)
    return [acc]


# -- matmul and convolution ----------------------------------------------------------


def _dot_general(ctx, eqn, args):
    """Any dot_general as ``gemm`` on [batch..., m, k] x [batch..., k, n] (+ reshapes)."""
    a, b = args
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    out = _out(eqn)
    pet = eqn.params.get("preferred_element_type")
    if not (a.dtype == b.dtype == np.dtype(out.dtype) and _kind(a.dtype, "number")):
        return None
    if (
        (pet is not None and np.dtype(pet) != np.dtype(a.dtype))
        or not _plain(eqn.params, "precision", "out_sharding")
        or not ctx.has("gemm", "reshape", "transpose")
    ):
        return None
    af = [d for d in range(len(a.shape)) if d not in lc and d not in lb]
    bf = [d for d in range(len(b.shape)) if d not in rc and d not in rb]
    batch = tuple(a.shape[d] for d in lb)
    m = math.prod(a.shape[d] for d in af)
    k = math.prod(a.shape[d] for d in lc)
    n = math.prod(b.shape[d] for d in bf)
    # Keep the operand's own axis order where gemm's transpose flags allow it.
    ta = _in_order(a, (*lb, *lc, *af)) and not _in_order(a, (*lb, *af, *lc))
    tb = _in_order(b, (*rb, *bf, *rc)) and not _in_order(b, (*rb, *rc, *bf))
    a2 = ctx.transpose(a, (*lb, *lc, *af) if ta else (*lb, *af, *lc))
    b2 = ctx.transpose(b, (*rb, *bf, *rc) if tb else (*rb, *rc, *bf))
    a2 = ctx.reshape(a2, batch + ((k, m) if ta else (m, k)))
    b2 = ctx.reshape(b2, batch + ((n, k) if tb else (k, n)))
    y = ctx.exec("gemm", a2, b2, transpose_a=ta, transpose_b=tb)
    return [ctx.reshape(y, out.shape)]


def _in_order(x: Any, perm: tuple[int, ...]) -> bool:
    return perm == tuple(range(len(x.shape)))


def _conv(ctx, eqn, args):
    """conv_general_dilated as channels-last ``convolution`` (transposes around it)."""
    p = eqn.params
    x, w = args
    lhs, rhs, outs = p["dimension_numbers"]
    nd = len(p["window_strides"])
    pet = p.get("preferred_element_type")
    pads = tuple((int(lo), int(hi)) for lo, hi in p["padding"])
    if nd not in (1, 2, 3) or any(d != 1 for d in p["lhs_dilation"]) or p["batch_group_count"] != 1:
        return None
    if any(v < 0 for pair in pads for v in pair) or not _kind(x.dtype, "float"):
        return None
    if (pet is not None and np.dtype(pet) != np.dtype(x.dtype)) or not _plain(p, "precision"):
        return None
    xp, wp = (lhs[0], *lhs[2:], lhs[1]), (rhs[0], *rhs[2:], rhs[1])
    perm = [0] * (nd + 2)
    perm[outs[0]], perm[outs[1]] = 0, nd + 1
    for i, d in enumerate(outs[2:]):
        perm[d] = i + 1
    params = {
        "strides": tuple(int(s) for s in p["window_strides"]),
        "padding": pads,
        "dilation": tuple(int(d) for d in p["rhs_dilation"]),
        "groups": int(p["feature_group_count"]),
    }
    out = _out(eqn)
    want = Spec(tuple(out.shape[perm.index(i)] for i in range(nd + 2)), out.dtype)
    if not ctx.has("transpose") or not ctx.fits(
        "convolution", [_permuted(x, xp), _permuted(w, wp)], want, **params
    ):
        return None
    y = ctx.exec("convolution", ctx.transpose(x, xp), ctx.transpose(w, wp), **params)
    return [ctx.transpose(y, perm)]


def _permuted(x: Any, perm: tuple[int, ...]) -> Spec:
    return Spec(tuple(x.shape[d] for d in perm), x.dtype)


def _pool(cmd: str) -> Rule:
    """reduce_window_max / _sum over the spatial axes of a channels-last tensor as
    ``max_pool`` / ``sum_pool`` (Flax's ``avg_pool`` is ``sum_pool`` then a division)."""

    def rule(ctx, eqn, args):
        p = eqn.params
        (x,) = args
        win, strides, pads = p["window_dimensions"], p["window_strides"], p["padding"]
        if len(x.shape) < 3 or any(d != 1 for d in (*p["base_dilation"], *p["window_dilation"])):
            return None
        if (win[0], win[-1], strides[0], strides[-1]) != (1, 1, 1, 1):
            return None
        if tuple(pads[0]) != (0, 0) or tuple(pads[-1]) != (0, 0):
            return None
        params = {
            "window": tuple(int(k) for k in win[1:-1]),
            "strides": tuple(int(s) for s in strides[1:-1]),
            "padding": tuple((int(lo), int(hi)) for lo, hi in pads[1:-1]),
        }
        if not ctx.fits(cmd, [x], _out(eqn), **params):
            return None
        return [ctx.exec(cmd, x, **params)]

    rule.__name__ = f"rule_{cmd}"
    return rule


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


def _is_finite(ctx, eqn, args):
    """``|x| < inf``: False for +-inf and NaN, as is_finite."""
    (x,) = args
    if not (_kind(x.dtype, "float") and ctx.has("ewabs", "compare")):
        return None
    inf = ctx.constant(np.array(np.inf, x.dtype))
    return [ctx.exec("compare", ctx.exec("ewabs", x), inf, op="lt")]


# -- reductions and data movement ---------------------------------------------------------


def _reduce(cmd: str) -> Rule:
    """A reduction that drops axes: the keep-dims command, then a reshape."""

    def rule(ctx, eqn, args):
        (x,) = args
        if not (_kind(x.dtype, "number") and _plain(eqn.params, "out_sharding")):
            return None
        if not ctx.has(cmd, "reshape"):
            return None
        y = ctx.exec(cmd, x, axes=tuple(int(a) for a in eqn.params["axes"]))
        return [ctx.reshape(y, _out(eqn).shape)]

    rule.__name__ = f"rule_{cmd}"
    return rule


def _arg(cmd: str) -> Rule:
    def rule(ctx, eqn, args):
        (x,) = args
        (axis,) = eqn.params["axes"]
        if np.dtype(eqn.params["index_dtype"]) != np.int32 or not ctx.has(cmd, "reshape"):
            return None
        y = ctx.exec(cmd, x, axis=int(axis))
        return [ctx.reshape(y, _out(eqn).shape)]

    rule.__name__ = f"rule_{cmd}"
    return rule


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


def _select_n(ctx, eqn, args):
    """select_n(p, a, b) picks b where p is True: ``select(p, b, a)``."""
    pred, *cases = args
    if len(cases) != 2 or np.dtype(pred.dtype) != np.bool_ or not ctx.has("select"):
        return None
    return [ctx.exec("select", pred, cases[1], cases[0])]


# -- calls ----------------------------------------------------------------------------------


def _inline(ctx, eqn, args):
    """A jit call, replayed in place: a jit boundary does not change values."""
    return ctx.inline(eqn.params["jaxpr"], args)


def _is_relu(closed: Any) -> bool:
    """Whether a closed jaxpr is ``max(x, 0)`` (through jit calls), i.e. ``jax.nn.relu``."""
    jaxpr = closed.jaxpr
    while len(jaxpr.eqns) == 1 and jaxpr.eqns[0].primitive.name == "jit":
        eqn = jaxpr.eqns[0]
        if list(eqn.invars) != list(jaxpr.invars) or list(eqn.outvars) != list(jaxpr.outvars):
            return False
        jaxpr = eqn.params["jaxpr"].jaxpr
    if len(jaxpr.eqns) != 1 or len(jaxpr.invars) != 1 or jaxpr.constvars:
        return False
    (eqn,) = jaxpr.eqns
    if eqn.primitive.name != "max" or list(eqn.outvars) != list(jaxpr.outvars):
        return False
    x, zero = eqn.invars if eqn.invars[0] is jaxpr.invars[0] else eqn.invars[::-1]
    val = getattr(zero, "val", None)
    return x is jaxpr.invars[0] and val is not None and np.ndim(val) == 0 and float(val) == 0.0


def _custom_jvp(ctx, eqn, args):
    """``jax.nn.relu`` (a custom_jvp around max(x, 0)) as ``relu``; ``logaddexp(x, 0)``
    (``jax.nn.softplus``, and ``log_sigmoid`` around it) as ``softplus``, whose backward
    is logaddexp's own rule. Other custom derivatives stay generic, which keeps them."""
    closed = eqn.params["call_jaxpr"]
    name = getattr(closed.jaxpr.debug_info, "func_name", "")
    if eqn.params.get("num_consts", 0):
        return None
    if name == "logaddexp" and len(args) == 2:
        return _softplus(ctx, eqn, args)
    if name != "relu" or len(args) != 1:
        return None
    if not (_kind(args[0].dtype, "float") and _is_relu(closed) and ctx.has("relu")):
        return None
    return [ctx.exec("relu", args[0])]


def _softplus(ctx, eqn, args):
    for x, zero in (args, args[::-1]):
        value = ctx.value(zero)
        if value is None or value.size != 1 or float(value.reshape(())) != 0.0:
            continue
        if x.shape == tuple(_out(eqn).shape) and _kind(x.dtype, "float") and ctx.has("softplus"):
            return [ctx.exec("softplus", x)]
    return None


TRACE_RULES: dict[str, Rule] = {
    # elementwise and BLAS
    "add": _simple("add", "number"),
    "sub": _simple("add", "real", q=-1.0),
    "mul": _simple("mul", "number"),
    "div": _simple("ewdiv", "inexact"),
    "max": _simple("max"),
    "min": _simple("min"),
    "neg": _simple("scalar_mul", "real", a=-1.0),
    "exp": _simple("ewexp", "float"),
    "log": _simple("ewlog", "float"),
    "sqrt": _simple("ewsqrt", "float"),
    "rsqrt": _simple("ewrsqrt", "float"),
    "expm1": _simple("ewexpm1", "float"),
    "log1p": _simple("ewlog1p", "float"),
    "abs": _simple("ewabs", "real"),
    "erf": _simple("ewerf", "float"),
    "erfc": _simple("ewerfc", "float"),
    "is_finite": _is_finite,
    "stop_gradient": _simple("stop_gradient"),
    "square": _square,
    "integer_pow": _integer_pow,
    "select_n": _select_n,
    # comparisons (ELU, leaky ReLU, Embed's bounds checks)
    **{op: _simple("compare", op=op) for op in ("lt", "le", "gt", "ge", "eq", "ne")},
    # activations
    "tanh": _simple("tanh", "float"),
    "logistic": _simple("sigmoid", "float"),
    "custom_jvp_call": _custom_jvp,
    # matmul, convolution, pooling
    "dot_general": _dot_general,
    "conv_general_dilated": _conv,
    "reduce_window_max": _pool("max_pool"),
    "reduce_window_sum": _pool("sum_pool"),
    # reductions
    "reduce_sum": _reduce("reduce_sum"),
    "reduce_max": _reduce("reduce_max"),
    "reduce_min": _reduce("reduce_min"),
    "argmax": _arg("argmax"),
    "argmin": _arg("argmin"),
    # data movement
    "reshape": _reshape,
    "squeeze": _squeeze,
    "transpose": _transpose,
    "broadcast_in_dim": _broadcast_in_dim,
    "convert_element_type": _convert,
    "concatenate": _concatenate,
    "slice": _slice,
    "pad": _pad,
    "gather": _gather,
    "iota": _iota,
    "copy": _simple("data_transfer"),
    # calls: inlined so the commands inside are visible to passes
    "jit": _inline,
}
