"""Transcendental family: ewsin, ewcos, ewpow, signed_sqrt, reduce_logsumexp,
fill_if_less_than (NNC's EWSIN, EWCOS, EWPOW, SIGNED_SQRT, REDUCE_LOGSUMEXP and
FILL_IF_LESS_THAN).

Every one has a hand-written backward in NNC's convention:

* ``ewpow(a, b)`` broadcasts; ``d/da = b a^(b-1)``, ``d/db = a^b log a`` (JAX's rule:
  0 where ``a == 0``, so a zero base with a constant exponent trains as in JAX);
* ``signed_sqrt(x, floor)`` is ``sign(x) sqrt(max(|x|, floor))``, keeping the sign of
  zeros and NaNs and mapping NaN to ``+-sqrt(floor)``; its slope ``0.5 / sqrt(|x|)``
  is positive on both sides and 0 where ``|x| < floor`` (NNC's
  ``signed_sqrt.tests.c``);
* ``reduce_logsumexp`` keeps reduced axes as size 1 like every NNC reduction; its
  gradient is the softmax ``exp(x - top) / sum(exp(x - top))`` with the finite maximum
  ``top`` shifted out, as ``jax.grad`` of ``jax.nn.logsumexp`` (exact for large logits);
  a 16-bit x is computed in float32 (float16 sums of over 65504 terms overflow);
* ``fill_if_less_than(a, selector, threshold, value)`` is ``value`` where
  ``selector < threshold`` else ``a`` (broadcasting selector and threshold); the
  gradient reaches ``a`` where it was kept.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from fnnc.core.command import Spec, Uses, defcommand
from fnnc.core.dtypes import at_least_float32
from fnnc.errors import CommandError
from fnnc.ops._rules import (
    broadcast,
    broadcast_shape,
    norm_axes,
    require_float,
    require_same_dtype,
    to_shape,
    unbroadcast,
)
from fnnc.ops.elementwise import _unary

ewsin = _unary("ewsin", lax.sin, lambda x, y: lax.cos(x), Uses(inputs=(0,)))
ewcos = _unary("ewcos", lax.cos, lambda x, y: -lax.sin(x), Uses(inputs=(0,)))


def _pow_rule(a: Spec, b: Spec) -> Spec:
    require_float("ewpow", a, b)
    return broadcast("ewpow")(a, b)


@defcommand(
    family="elementwise", shape=_pow_rule, uses=Uses(inputs=(0, 1), outputs=(0,)), elementwise=True
)
def ewpow(a, b):
    """``a ** b`` elementwise (broadcasting), for floating-point tensors."""
    shape = broadcast_shape("ewpow", a.shape, b.shape)
    return lax.pow(to_shape(a, shape), to_shape(b, shape))


@ewpow.backward
def _ewpow_backward(grads, inputs, outputs):
    (g,), (a, b), (y,) = grads, inputs, outputs
    aa, bb = to_shape(a, g.shape), to_shape(b, g.shape)
    zero = jnp.zeros((), g.dtype)
    # JAX's pow JVP: b * a^(b-1) with 0 where b == 0, and y * log(a) with 0 where a == 0.
    da = jnp.where(bb == 0, zero, bb * lax.pow(aa, bb - 1))
    safe = jnp.where(aa == 0, jnp.ones((), aa.dtype), aa)
    db = jnp.where(aa == 0, zero, y * lax.log(safe))
    return unbroadcast(g * da, a.shape), unbroadcast(g * db, b.shape)


def _floor_problem(floor: float) -> str | None:
    if math.isfinite(floor) and floor > 0:
        return None
    return f"signed_sqrt: floor must be finite and positive, got {floor}"


def _check_floor(floor: float) -> None:
    problem = _floor_problem(floor)
    if problem is not None:
        raise CommandError(problem)


def _signed_sqrt_rule(x: Spec, *, floor) -> Spec:
    require_float("signed_sqrt", x)
    _check_floor(floor)
    return Spec(tuple(x.shape), x.dtype)


@defcommand(
    family="elementwise",
    shape=_signed_sqrt_rule,
    uses=Uses(inputs=(0,)),
    elementwise=True,
    backward_check=lambda cmd: _floor_problem(cmd.param("floor")),
)
def signed_sqrt(x, *, floor=1e-6):
    """``sign(x) * sqrt(max(|x|, floor))``; NaN counts as below the floor (its sign kept)."""
    m = jnp.abs(x)
    kept = jnp.where(m >= floor, m, jnp.asarray(floor, x.dtype))
    return jnp.copysign(lax.sqrt(kept), x)


@signed_sqrt.backward
def _signed_sqrt_backward(grads, inputs, outputs, *, floor):
    _check_floor(floor)  # as NNC's backward kernel refuses it (empty inputs too)
    (g,), (x,) = grads, inputs
    m = jnp.abs(x)
    safe = jnp.where(m >= floor, m, jnp.ones((), x.dtype))
    return (jnp.where(m >= floor, g * (0.5 / lax.sqrt(safe)), jnp.zeros((), g.dtype)),)


def _logsumexp_rule(x: Spec, *, axes) -> Spec:
    require_float("reduce_logsumexp", x)
    ax = norm_axes("reduce_logsumexp", axes, x.ndim)
    return Spec(tuple(1 if d in ax else n for d, n in enumerate(x.shape)), x.dtype)


def _shifted_exp(x, axes):
    """``exp(x - top)`` and its sum over ``axes`` (kept), ``top`` the maximum where it is
    finite (else 0): the stable pieces of logsumexp, as ``jax.nn.logsumexp`` takes them."""
    ax = norm_axes("reduce_logsumexp", axes, x.ndim)
    x = x.astype(at_least_float32(x.dtype))  # float16's sum overflows past 65504 terms
    # initial=-inf: over an empty axis the sum is 0 and logsumexp -inf, as in jax.nn.
    top = lax.stop_gradient(jnp.max(x, axis=ax, keepdims=True, initial=-jnp.inf))
    top = jnp.where(jnp.isfinite(top), top, jnp.zeros((), x.dtype))
    e = jnp.exp(x - top)
    return e, jnp.sum(e, axis=ax, keepdims=True), top


@defcommand(family="reduce", shape=_logsumexp_rule, uses=Uses(inputs=(0,)))
def reduce_logsumexp(x, *, axes):
    """``log(sum(exp(x)))`` over ``axes`` (kept as size 1), computed stably (the maximum
    taken out first, as ``jax.nn.logsumexp`` does); a 16-bit x in float32, rounded once.
    Over an empty axis it is ``-inf`` (the log of an empty sum)."""
    _, total, top = _shifted_exp(x, axes)
    return (jnp.log(total) + top).astype(x.dtype)


@reduce_logsumexp.backward
def _reduce_logsumexp_backward(grads, inputs, outputs, *, axes):
    # The softmax with the maximum shifted out, as jax.grad computes it: exp(x - y) with
    # the rounded output y = top + log(sum) is off by y's rounding (2% at logits ~1e6).
    (g,), (x,) = grads, inputs
    e, total, _ = _shifted_exp(x, axes)
    return ((to_shape(g.astype(total.dtype) / total, x.shape) * e).astype(x.dtype),)


def _fill_rule(a: Spec, selector: Spec, threshold: Spec, *, value) -> Spec:
    require_float("fill_if_less_than", a)
    require_same_dtype("fill_if_less_than", selector, threshold)
    shape = broadcast_shape("fill_if_less_than", a.shape, selector.shape, threshold.shape)
    if shape != tuple(a.shape):
        raise CommandError(
            f"fill_if_less_than: selector {list(selector.shape)} and threshold "
            f"{list(threshold.shape)} must broadcast to a's shape {list(a.shape)}"
        )
    return Spec(tuple(a.shape), a.dtype)


def _filled(selector, threshold, shape):
    return to_shape(selector, shape) < to_shape(threshold, shape)


@defcommand(family="elementwise", shape=_fill_rule, uses=Uses(inputs=(1, 2)), elementwise=True)
def fill_if_less_than(a, selector, threshold, *, value=0.0):
    """``value`` where ``selector < threshold`` (broadcast to ``a``), else ``a``."""
    return jnp.where(_filled(selector, threshold, a.shape), jnp.asarray(value, a.dtype), a)


@fill_if_less_than.backward
def _fill_if_less_than_backward(grads, inputs, outputs, *, value):
    (g,), (_, selector, threshold) = grads, inputs
    return (jnp.where(_filled(selector, threshold, g.shape), jnp.zeros((), g.dtype), g), None, None)
