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
import os
from typing import Any

import jax
import numpy as np

from fnnc.graph._trace_base import (
    PASS_THROUGH,
    Rule,
    Spec,
    _default_precision,
    _kind,
    _out,
    _plain,
    _simple,
)
from fnnc.graph.trace_data_rules import (
    _broadcast_in_dim,
    _concatenate,
    _convert,
    _gather,
    _iota,
    _pad,
    _reshape,
    _rev,
    _slice,
    _squeeze,
    _stack,
    _transpose,
)
from fnnc.graph.trace_llm_rules import LLM_RULES
from fnnc.graph.trace_moe_rules import MOE_TRACE_RULES

__all__ = ["CUSTOM_JVP_RULES", "PASS_THROUGH", "TRACE_RULES"]


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
        or not _plain(eqn.params, "out_sharding")
        or not _default_precision(eqn.params)
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
    if (pet is not None and np.dtype(pet) != np.dtype(x.dtype)) or not _default_precision(p):
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


def _is_finite(ctx, eqn, args):
    """``|x| < inf``: False for +-inf and NaN, as is_finite."""
    (x,) = args
    if not (_kind(x.dtype, "float") and ctx.has("ewabs", "compare")):
        return None
    inf = ctx.constant(np.array(np.inf, x.dtype))
    return [ctx.exec("compare", ctx.exec("ewabs", x), inf, op="lt")]


# -- reductions -------------------------------------------------------------------------


def _reduce(cmd: str) -> Rule:
    """A reduction that drops axes: the keep-dims command, then a reshape. Declined
    where the command refuses the input (``reduce_max`` over an empty axis, which JAX
    fills with its identity, ``-inf``): the generic node keeps JAX's value."""

    def rule(ctx, eqn, args):
        (x,) = args
        if not (_kind(x.dtype, "number") and _plain(eqn.params, "out_sharding")):
            return None
        axes = tuple(int(a) for a in eqn.params["axes"])
        kept = Spec(tuple(1 if d in axes else n for d, n in enumerate(x.shape)), x.dtype)
        if not (ctx.has("reshape") and ctx.fits(cmd, [x], kept, axes=axes)):
            return None
        y = ctx.exec(cmd, x, axes=axes)
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


def _custom_relu(ctx, eqn, args):
    """``jax.nn.relu``: a custom_jvp around max(x, 0)."""
    if len(args) != 1 or not _is_relu(eqn.params["call_jaxpr"]):
        return None
    if not (_kind(args[0].dtype, "float") and ctx.has("relu")):
        return None
    return [ctx.exec("relu", args[0])]


def _custom_softplus(ctx, eqn, args):
    """``logaddexp(x, 0)`` (``jax.nn.softplus``, and ``log_sigmoid`` around it): the
    ``softplus`` command, whose backward is logaddexp's own JVP rule."""
    if len(args) != 2:
        return None
    for x, zero in (args, args[::-1]):
        value = ctx.value(zero)
        if value is None or value.size != 1 or float(value.reshape(())) != 0.0:
            continue
        if x.shape == tuple(_out(eqn).shape) and _kind(x.dtype, "float") and ctx.has("softplus"):
            return [ctx.exec("softplus", x)]
    return None


CUSTOM_JVP_RULES: dict[str, Rule] = {"relu": _custom_relu, "logaddexp": _custom_softplus}
"""Rules for ``custom_jvp_call`` by the name of the JAX function (``jax.nn.relu``,
``jnp.logaddexp``) differentiated specially; each maps it only to a command whose
backward is that custom derivative. A function of the same name defined outside the
``jax`` package stays a generic node (its own derivative)."""


def _custom_jvp(ctx, eqn, args):
    """A custom derivative that :data:`CUSTOM_JVP_RULES` knows; others stay generic,
    which keeps their derivative.

    The name alone says nothing: a user's ``@jax.custom_jvp def relu`` (a
    straight-through ReLU, say) has its own derivative, so a rule fires only for JAX's
    own function, defined inside the ``jax`` package."""
    debug = eqn.params["call_jaxpr"].jaxpr.debug_info
    rule = CUSTOM_JVP_RULES.get(getattr(debug, "func_name", ""))
    if rule is None or eqn.params.get("num_consts", 0) or not _defined_in_jax(debug):
        return None
    return rule(ctx, eqn, args)


_JAX_DIR = os.path.realpath(os.path.dirname(jax.__file__))


def _defined_in_jax(debug: Any) -> bool:
    """Whether ``debug.func_src_info`` (``"relu at /.../jax/_src/nn/functions.py:71"``)
    places the function inside the ``jax`` package; ``False`` when unknown."""
    src = getattr(debug, "func_src_info", None)
    if not isinstance(src, str) or " at " not in src:
        return False
    path = src.split(" at ", 1)[1].rsplit(":", 1)[0]
    try:
        return os.path.commonpath([os.path.realpath(path), _JAX_DIR]) == _JAX_DIR
    except ValueError:  # different drives, relative vs absolute
        return False


TRACE_RULES: dict[str, Rule] = {
    # elementwise and BLAS
    "add": _simple("add", "number"),
    "sub": _simple("add", "real", q=-1.0),
    "mul": _simple("mul", "number"),
    "div": _simple("ewdiv", "inexact"),
    "max": _simple("max", ties="split"),  # JAX's tie rule: trace keeps jax.grad
    "min": _simple("min", ties="split"),
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
    "stack": _stack,
    "rev": _rev,
    "slice": _slice,
    "pad": _pad,
    "gather": _gather,
    "iota": _iota,
    "copy": _simple("data_transfer"),
    # calls: inlined so the commands inside are visible to passes
    "jit": _inline,
    # mixture of experts
    **MOE_TRACE_RULES,
    # sorting, scatter-add, RoPE's sin / cos / split, pow
    **LLM_RULES,
}
