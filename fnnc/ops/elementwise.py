"""Elementwise family: ewsum, ewprod, ewdiv, ewexp, ewlog, ewsqrt, ewabs, clamp, min, max, select;
and beyond NNC: ewrsqrt, ewexpm1, ewlog1p, ewerf, ewerfc.

Binary and n-ary commands broadcast like NumPy (NNC broadcasts size-1 axes); their
backwards sum gradients back to each input's shape.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import NOTHING, Spec, Uses, defcommand
from fnnc.errors import CommandError, DTypeError
from fnnc.ops._rules import (
    broadcast,
    broadcast_shape,
    int_range,
    require_float,
    require_same_dtype,
    same_shape,
    show,
    to_shape,
    unbroadcast,
)


def _out_shape(*xs: Any) -> tuple[int, ...]:
    return broadcast_shape("elementwise", *(x.shape for x in xs))


def _fold(op, inputs):
    """``op`` applied left to right over inputs broadcast to their common shape."""
    shape = _out_shape(*inputs)
    out = to_shape(inputs[0], shape)
    for x in inputs[1:]:
        out = op(out, to_shape(x, shape))
    return out


@defcommand(
    family="elementwise",
    shape=broadcast("ewsum", numbers=True),
    uses=NOTHING,
    elementwise=True,
    commutative=True,
)
def ewsum(*inputs):
    """Sum of any number of tensors (broadcasting)."""
    return _fold(lax.add, inputs)


@ewsum.backward
def _ewsum_backward(grads, inputs, outputs):
    (g,) = grads
    return tuple(unbroadcast(g, x.shape) for x in inputs)


@defcommand(
    family="elementwise",
    shape=broadcast("ewprod", numbers=True),
    uses=Uses(inputs=None),
    elementwise=True,
    commutative=True,
)
def ewprod(*inputs):
    """Product of any number of tensors (broadcasting)."""
    return _fold(lax.mul, inputs)


@ewprod.backward
def _ewprod_backward(grads, inputs, outputs):
    (g,) = grads
    shape = g.shape
    result = []
    for i, x in enumerate(inputs):
        rest = jnp.ones(shape, g.dtype)
        for j, y in enumerate(inputs):
            if j != i:
                rest = rest * to_shape(y, shape)
        result.append(unbroadcast(g * rest, x.shape))
    return tuple(result)


@defcommand(
    family="elementwise",
    shape=broadcast("ewdiv", numbers=True),
    uses=Uses(inputs=(0, 1)),
    elementwise=True,
)
def ewdiv(a, b):
    """a / b (broadcasting). NNC's nil numerator is ``ewdiv(ones, b)``.

    On integer tensors it is C's (and XLA's) integer division, not NumPy's ``/``: the
    quotient truncated toward zero (``-7 / 2`` is -3; NumPy's ``//`` floors to -4), and
    no error where it is undefined: ``x / 0`` is -1 in a signed type, the largest value
    (all bits set) in an unsigned one, and the smallest signed value divided by -1 is
    itself. Convert to a float type first (datatype_conversion) for a true quotient.
    """
    shape = _out_shape(a, b)
    return lax.div(to_shape(a, shape), to_shape(b, shape))


@ewdiv.backward
def _ewdiv_backward(grads, inputs, outputs):
    (g,), (a, b) = grads, inputs
    bb = to_shape(b, g.shape)
    ga = g / bb
    return unbroadcast(ga, a.shape), unbroadcast(-ga * to_shape(a, g.shape) / bb, b.shape)


def _unary(name: str, fn, grad_from, uses: Uses, float_only: bool = True):
    """Defines a unary elementwise command with backward ``g * grad_from(x, y)``; a
    ``float_only`` one refuses integer and bool inputs in its shape rule (a
    :class:`DTypeError` naming it, where JAX's error named only its primitive)."""

    def shape(x: Spec) -> Spec:
        if float_only:
            require_float(name, x)
        return same_shape(x)

    def forward(x):
        return fn(x)

    forward.__name__ = name
    what = name[2:] if name.startswith("ew") else name
    forward.__doc__ = f"Elementwise {what}(x)" + (", for floating-point x." if float_only else ".")
    factory = defcommand(family="elementwise", shape=shape, uses=uses, elementwise=True)(forward)

    @factory.backward
    def _backward(grads, inputs, outputs):
        return (grads[0] * grad_from(inputs[0], outputs[0]),)

    return factory


ewexp = _unary("ewexp", lax.exp, lambda x, y: y, Uses(inputs=(), outputs=(0,)))
ewlog = _unary("ewlog", lax.log, lambda x, y: 1 / x, Uses(inputs=(0,)))
ewsqrt = _unary("ewsqrt", lax.sqrt, lambda x, y: 0.5 / y, Uses(inputs=(), outputs=(0,)))
# Beyond NNC's set: the transcendental forms Flax models emit (normalisations' rsqrt,
# exact GELU's erf/erfc, ELU's expm1, softplus's log1p), so traced graphs hold commands.
ewrsqrt = _unary("ewrsqrt", lax.rsqrt, lambda x, y: -0.5 * y * y * y, Uses(inputs=(), outputs=(0,)))
ewexpm1 = _unary("ewexpm1", lax.expm1, lambda x, y: y + 1, Uses(inputs=(), outputs=(0,)))
ewlog1p = _unary("ewlog1p", lax.log1p, lambda x, y: 1 / (1 + x), Uses(inputs=(0,)))
_TWO_OVER_SQRT_PI = 1.1283791670955126
ewerf = _unary(
    "ewerf", lax.erf, lambda x, y: _TWO_OVER_SQRT_PI * lax.exp(-x * x), Uses(inputs=(0,))
)
ewerfc = _unary(
    "ewerfc", lax.erfc, lambda x, y: -_TWO_OVER_SQRT_PI * lax.exp(-x * x), Uses(inputs=(0,))
)


def _abs(x):
    """``|x|``; the identity for unsigned integers and bool, as NumPy's ``abs`` of them
    (JAX's ``abs`` refuses them: the shape rule had passed uint8 and the run failed)."""
    if jnp.issubdtype(x.dtype, jnp.unsignedinteger) or x.dtype == jnp.bool_:
        return x
    return lax.abs(x)


# The subgradient at 0 is +1, as JAX's (so traced programs differentiate identically).
ewabs = _unary(
    "ewabs",
    _abs,
    lambda x, y: jnp.where(x >= 0, 1, -1).astype(x.dtype),
    Uses(inputs=(0,)),
    float_only=False,
)


def _clamp_shape(x: Spec, *, min=None, max=None) -> Spec:
    _bounds(x.dtype, min, max)
    return same_shape(x)


@defcommand(family="elementwise", shape=_clamp_shape, uses=Uses(inputs=(0,)), elementwise=True)
def clamp(x, *, min=None, max=None):
    """Clamps x to [min, max]; either bound may be None, or NaN as NNC spells "no
    bound" (NNC's CLAMP). The gradient passes strictly inside the bounds, as NNC's
    (``ccv_nnc_ew_cpu_ref.c``): zero where x is at or beyond one (relu6's 0 at 0).

    On an integer x the result is the exact integer clamp, as ``np.clip`` in a wide
    type: a fractional bound rounds inward (``min=0.5`` is 1, ``max=5.5`` is 5), and a
    bound beyond the dtype's range (``max=255`` on int8) is no bound. A bound that would
    put every element outside the dtype (``min=300`` on int8) is a :class:`DTypeError`.
    """
    lo, hi = _bounds(x.dtype, min, max)
    if lo is not None:
        x = lax.max(x, jnp.full(x.shape, lo, x.dtype))
    if hi is not None:
        x = lax.min(x, jnp.full(x.shape, hi, x.dtype))
    return x


def _bound(value):
    """A clamp bound, ``None`` for none (``None`` or NaN)."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _bounds(dtype, min, max):
    """clamp's bounds as values of ``dtype``, ``None`` for none. Integers: rounded
    inward, and dropped beyond the dtype's range, where the cast would wrap them."""
    lo, hi = _bound(min), _bound(max)
    if not jnp.issubdtype(dtype, jnp.integer):
        return lo, hi
    least, most = int_range(dtype)
    for what, bound, outside in (
        ("min", lo, lo is not None and lo > most),
        ("max", hi, hi is not None and hi < least),
    ):
        if outside:
            raise DTypeError(
                f"clamp: {what}={bound!r} lies outside {np.dtype(dtype).name}'s range "
                f"[{least}, {most}], so no element could hold the result; give a bound in "
                "range, or convert x to a wider type first (datatype_conversion)"
            )
    lo = None if lo is None or lo <= least else math.ceil(lo)
    hi = None if hi is None or hi >= most else math.floor(hi)
    return lo, hi


@clamp.backward
def _clamp_backward(grads, inputs, outputs, *, min=None, max=None):
    (g,), (x,) = grads, inputs
    lo, hi = _bounds(x.dtype, min, max)
    keep = jnp.ones(x.shape, bool)
    if lo is not None:
        keep = keep & (x > lo)
    if hi is not None:
        keep = keep & (x < hi)
    return (jnp.where(keep, g, jnp.zeros_like(g)),)


def _tie_to_both(pick):
    """``pick`` (``lax.min`` / ``lax.max``) whose derivative at a tie is 1 for both
    operands, NNC's rule, so ``jax.vjp`` of the reference equals the backward (JAX's own
    splits a tie 1/2 : 1/2). A ``custom_jvp``, which the Pallas lowering traces through."""

    @jax.custom_jvp
    def picked(a, b):
        return pick(a, b)

    @picked.defjvp
    def _jvp(primals, tangents):
        (a, b), (ta, tb) = primals, tangents
        y = pick(a, b)
        zero = jnp.zeros_like(y)
        return y, jnp.where(y == a, ta, zero) + jnp.where(y == b, tb, zero)

    return picked


TIES = ("both", "split")
"""The tie rules of ``min``/``max``: ``"both"`` (NNC's, the default) gives the whole
gradient to both operands where ``a == b``; ``"split"`` gives each half, as ``jax.grad``
of ``jnp.maximum`` / ``jnp.minimum`` / ``jnp.clip`` does (what :func:`fnnc.graph.trace`
asks for, since a traced function keeps JAX's derivatives)."""


def _check_ties(name: str, ties: Any) -> None:
    if ties not in TIES:
        raise CommandError(
            f"{name}: ties={ties!r}; expected 'both' (NNC: a tie's whole gradient to both "
            "operands) or 'split' (JAX: half to each)"
        )


def _minmax(name: str, pick):
    tied = _tie_to_both(pick)
    shape_of = broadcast(name)

    def shape(*specs: Spec, ties: str = "both") -> Spec:
        _check_ties(name, ties)
        return shape_of(*specs)

    def forward(a, b, *, ties="both"):
        _check_ties(name, ties)
        shape = _out_shape(a, b)
        # "split" is lax's own min/max, whose derivative is JAX's: jax.vjp of the
        # forward (fused chains, their kernels) follows the tie rule either way.
        picked = pick if ties == "split" else tied
        return picked(to_shape(a, shape), to_shape(b, shape))

    forward.__name__ = name
    forward.__doc__ = (
        f"Elementwise {name} of two tensors (broadcasting); where ``a == b`` both inputs "
        "get the whole gradient, as in NNC (``ccv_nnc_min_cpu_ref.c``), unless "
        "``ties='split'``: half each, as ``jax.grad`` (:data:`TIES`). A ``None`` output "
        "gradient is NNC's null one, all ones."
    )
    factory = defcommand(
        family="elementwise",
        shape=shape,
        elementwise=True,
        commutative=True,
        # f(x, x) = x also in gradient only under JAX's rule (half of g to each side);
        # NNC's gives each side all of g, so x gets 2 * g and fold must keep the node.
        idempotent=lambda cmd: cmd.param("ties") == "split",
    )(forward)

    @factory.backward
    def _backward(grads, inputs, outputs, *, ties="both"):
        (g,), (a, b) = grads, inputs
        aa, bb = to_shape(a, g.shape), to_shape(b, g.shape)
        picked = pick(aa, bb)
        at_a, at_b = picked == aa, picked == bb
        zero = jnp.zeros_like(g)
        if ties == "split":  # JAX's rule: half of g to each side of a tie
            g_a = g_b = jnp.where(at_a & at_b, g * jnp.asarray(0.5, g.dtype), g)
        else:  # NNC's: a tie is picked from both sides, so both get g
            g_a = g_b = g
        return (
            unbroadcast(jnp.where(at_a, g_a, zero), a.shape),
            unbroadcast(jnp.where(at_b, g_b, zero), b.shape),
        )

    return factory


min = _minmax("min", lax.min)
max = _minmax("max", lax.max)


def _select_shape(cond: Spec, a: Spec, b: Spec) -> Spec:
    if cond.dtype != jnp.bool_:
        raise DTypeError(f"select: condition must be bool, got {show(cond)}")
    dtype = require_same_dtype("select", a, b)
    return Spec(broadcast_shape("select", cond.shape, a.shape, b.shape), dtype)


@defcommand(family="elementwise", shape=_select_shape, uses=Uses(inputs=(0,)), elementwise=True)
def select(cond, a, b):
    """``a`` where ``cond`` else ``b`` (broadcasting), like ``jnp.where``."""
    shape = _out_shape(cond, a, b)
    return lax.select(to_shape(cond, shape), to_shape(a, shape), to_shape(b, shape))


@select.backward
def _select_backward(grads, inputs, outputs):
    (g,), (cond, a, b) = grads, inputs
    c = to_shape(cond, g.shape)
    zero = jnp.zeros_like(g)
    return (
        None,
        unbroadcast(jnp.where(c, g, zero), a.shape),
        unbroadcast(jnp.where(c, zero, g), b.shape),
    )


@defcommand(family="elementwise", shape=same_shape, uses=NOTHING, differentiable=False)
def stop_gradient(x):
    """``x`` unchanged, with no gradient flowing back through it (``lax.stop_gradient``;
    not an NNC command: Flax's softmax, BatchNorm and attention trace to it).

    Not marked elementwise, so ``fuse`` keeps it out of fused chains, and never folded
    away before ``backward`` has run.
    """
    return lax.stop_gradient(x)
