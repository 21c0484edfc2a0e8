"""Activation family: relu, leaky_relu, sigmoid, softplus, tanh, swish, gelu, mish, softmax,
log_softmax.

All take one floating-point tensor and keep its shape. Every backward is hand-written;
those of relu, sigmoid, tanh, softmax and log_softmax read only the *output*
(``uses=Uses(inputs=(), outputs=(0,))``), so the input can be freed right after the
forward, as in NNC. softmax and log_softmax normalise along ``axis`` (default last).
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
from jax import lax

from fnnc.core.command import Spec, Uses, defcommand
from fnnc.core.dtypes import at_least_float32
from fnnc.errors import CommandError
from fnnc.ops._rules import norm_axes, require_float

OUTPUT_ONLY = Uses(inputs=(), outputs=(0,))
INPUT_ONLY = Uses(inputs=(0,))


def _float_rule(name: str):
    """Shape rule: one floating-point input, output shaped and typed like it."""

    def rule(x: Spec, **params) -> Spec:
        require_float(name, x)
        if "axis" in params:
            norm_axes(name, (params["axis"],), x.ndim)
        return Spec(tuple(x.shape), x.dtype)

    return rule


def _zero(g):
    return jnp.zeros((), g.dtype)


@defcommand(family="activation", shape=_float_rule("relu"), uses=OUTPUT_ONLY, elementwise=True)
def relu(x):
    """``max(x, 0)``. Computed by ``jax.nn.relu``, whose custom derivative (0 at 0) is
    the backward's: ``jax.grad`` of a graph run by ``interpret`` or ``compile`` gives
    what fnnc's backward and ``jax.grad`` of a traced ``jax.nn.relu`` give, where
    ``lax.max``'s own derivative splits the tie at 0 (0.5)."""
    return jax.nn.relu(x)


@relu.backward
def _relu_backward(grads, inputs, outputs):
    (g,), (y,) = grads, outputs
    return (jnp.where(y > 0, g, _zero(g)),)


def _leaky_relu_rule(x: Spec, *, negative_slope) -> Spec:
    if not isinstance(negative_slope, numbers.Real) or not negative_slope >= 0:
        raise CommandError(
            f"leaky_relu: negative_slope must be a number >= 0 (the backward tells the two "
            f"sides apart by the output's sign), got {negative_slope!r}"
        )
    return _float_rule("leaky_relu")(x)


@defcommand(family="activation", shape=_leaky_relu_rule, uses=OUTPUT_ONLY, elementwise=True)
def leaky_relu(x, *, negative_slope=0.01):
    """``x`` where ``x > 0`` else ``negative_slope * x`` (``negative_slope >= 0``).

    The backward reads the output alone, as NNC's: ``g`` where ``y >= 0`` (so at
    ``x = 0`` too), else ``negative_slope * g``; with ``negative_slope = 0`` it is
    relu's, ``0`` where ``y = 0``."""
    return jnp.where(x > 0, x, x * jnp.asarray(negative_slope, x.dtype))


@leaky_relu.backward
def _leaky_relu_backward(grads, inputs, outputs, *, negative_slope):
    (g,), (y,) = grads, outputs
    upper = (y >= 0) if negative_slope > 0 else (y > 0)
    return (jnp.where(upper, g, g * jnp.asarray(negative_slope, g.dtype)),)


@defcommand(family="activation", shape=_float_rule("sigmoid"), uses=OUTPUT_ONLY, elementwise=True)
def sigmoid(x):
    """``1 / (1 + exp(-x))``."""
    return jax.nn.sigmoid(x)


@sigmoid.backward
def _sigmoid_backward(grads, inputs, outputs):
    (g,), (y,) = grads, outputs
    return (g * y * (1 - y),)


@defcommand(
    family="activation",
    shape=_float_rule("softplus"),
    uses=Uses(inputs=(0,), outputs=(0,)),
    elementwise=True,
)
def softplus(x):
    """``log(1 + exp(x))``, computed as ``jax.nn.softplus`` (``logaddexp(x, 0)``)."""
    return jnp.logaddexp(x, jnp.zeros((), x.dtype))


@softplus.backward
def _softplus_backward(grads, inputs, outputs):
    # logaddexp's own JVP rule (``exp(x - y)`` with +inf read as 0), so traced Flax
    # softplus differentiates exactly as jax.grad does, also at +-inf.
    (g,), (x,), (y,) = grads, inputs, outputs
    zero = jnp.zeros((), x.dtype)
    return (g * lax.exp(jnp.where(jnp.isposinf(x), zero, x) - jnp.where(jnp.isposinf(y), zero, y)),)


@defcommand(family="activation", shape=_float_rule("tanh"), uses=OUTPUT_ONLY, elementwise=True)
def tanh(x):
    """Hyperbolic tangent."""
    return lax.tanh(x)


@tanh.backward
def _tanh_backward(grads, inputs, outputs):
    (g,), (y,) = grads, outputs
    return (g * (1 - y * y),)


@defcommand(family="activation", shape=_float_rule("swish"), uses=INPUT_ONLY, elementwise=True)
def swish(x, *, beta=1.0):
    """``x * sigmoid(beta * x)``; SiLU at NNC's default ``beta=1`` (``CMD_SWISH_FORWARD``)."""
    if beta == 1.0:
        return x * jax.nn.sigmoid(x)
    return x * jax.nn.sigmoid(x * jnp.asarray(beta, x.dtype))


@swish.backward
def _swish_backward(grads, inputs, outputs, *, beta):
    (g,), (x,) = grads, inputs
    bx = x if beta == 1.0 else x * jnp.asarray(beta, x.dtype)
    s = jax.nn.sigmoid(bx)
    return (g * s * (1 + bx * (1 - s)),)


_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_GELU_C = 0.044715
_GELU_FLAT = 20.0
"""Past ``|x| = 20`` the tanh form's ``tanh(sqrt(2/pi) (x + 0.044715 x^3))`` is ``+-1``
(its argument passes 300), so the cubic is taken at ``x`` clipped there: the same values,
where ``x * x`` had overflowed (float16 from ``|x| = 256``, float32 from ``1.8e19``) and
made the gradient ``0 * inf = NaN`` instead of 1 (or 0 below)."""


def _gelu_tanh_parts(x):
    """``x`` clipped to ``[-20, 20]``, ``tanh(u)`` and ``du/dx`` of the tanh form."""
    xc = jnp.clip(x, -_GELU_FLAT, _GELU_FLAT)
    t = jnp.tanh(_SQRT_2_OVER_PI * (xc + _GELU_C * xc * xc * xc))
    return xc, t, _SQRT_2_OVER_PI * (1 + 3 * _GELU_C * xc * xc)


@defcommand(family="activation", shape=_float_rule("gelu"), uses=INPUT_ONLY, elementwise=True)
def gelu(x, *, approximate=False):
    """``x * Phi(x)`` with Phi the standard normal CDF; ``approximate=True`` uses
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (NNC's GELU ``tanh`` flag)."""
    if approximate:  # cubic at x clipped where tanh is flat (_GELU_FLAT): no overflow
        _, t, _ = _gelu_tanh_parts(x)
        return 0.5 * x * (1 + t)
    return 0.5 * x * (1 + lax.erf(x * (1 / math.sqrt(2))))


@gelu.backward
def _gelu_backward(grads, inputs, outputs, *, approximate):
    (g,), (x,) = grads, inputs
    if approximate:
        xc, t, du = _gelu_tanh_parts(x)  # 1 - t * t is 0 where x was clipped
        return (g * (0.5 * (1 + t) + 0.5 * xc * (1 - t * t) * du),)
    cdf = 0.5 * (1 + lax.erf(x * (1 / math.sqrt(2))))
    pdf = jnp.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))
    return (g * (cdf + x * pdf),)


@defcommand(family="activation", shape=_float_rule("mish"), uses=INPUT_ONLY, elementwise=True)
def mish(x):
    """``x * tanh(softplus(x))``."""
    return x * jnp.tanh(jax.nn.softplus(x))


@mish.backward
def _mish_backward(grads, inputs, outputs):
    (g,), (x,) = grads, inputs
    t = jnp.tanh(jax.nn.softplus(x))
    return (g * (t + x * (1 - t * t) * jax.nn.sigmoid(x)),)


@defcommand(family="activation", shape=_float_rule("softmax"), uses=OUTPUT_ONLY)
def softmax(x, *, axis=-1):
    """``exp(x) / sum(exp(x))`` along ``axis`` (computed stably). A 16-bit x is computed
    in float32 and the output rounded once: over more than 65504 classes float16's sum
    of exponentials overflowed and every probability came out 0.

    NNC's ``CMD_SOFTMAX_FORWARD()`` has no axis: it normalises a tensor of rank 3 or
    more over every axis but the first (each batch row as one distribution); fnnc's
    default is the last axis (what attention and classifier heads mean). For NNC's
    reading, reshape to ``[N, -1]`` first (``ops.reshape``) and back after."""
    return jax.nn.softmax(_widen(x), axis=axis).astype(x.dtype)


@softmax.backward
def _softmax_backward(grads, inputs, outputs, *, axis):
    (g,), (y,) = grads, outputs
    gw, yw = _widen(g), _widen(y)
    return ((yw * (gw - jnp.sum(gw * yw, axis=axis, keepdims=True))).astype(y.dtype),)


@defcommand(family="activation", shape=_float_rule("log_softmax"), uses=OUTPUT_ONLY)
def log_softmax(x, *, axis=-1):
    """``x - logsumexp(x)`` along ``axis``; a 16-bit x in float32, rounded once (as
    softmax)."""
    return jax.nn.log_softmax(_widen(x), axis=axis).astype(x.dtype)


@log_softmax.backward
def _log_softmax_backward(grads, inputs, outputs, *, axis):
    (g,), (y,) = grads, outputs
    gw, yw = _widen(g), _widen(y)
    return ((gw - jnp.exp(yw) * jnp.sum(gw, axis=axis, keepdims=True)).astype(y.dtype),)


def _widen(t):
    """``t`` in float32 at least: sums over a vocabulary pass float16's range."""
    return t.astype(at_least_float32(t.dtype))
