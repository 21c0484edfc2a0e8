"""BLAS family: gemm, add, mul, scalar_mul (NNC's GEMM, ADD, MUL, SCALAR_MUL).

``gemm(a, b, bias?)`` multiplies the last two axes, batching over leading axes
(broadcast). NNC's dense layer is ``gemm(transpose_b=True)`` with weight ``[out, in]``.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from fnnc.core.command import NOTHING, Spec, Uses, defcommand
from fnnc.ops._rules import (
    broadcast,
    broadcast_shape,
    fail,
    require_same_dtype,
    same_shape,
    show,
    to_shape,
    unbroadcast,
)


def _mt(x):
    return jnp.swapaxes(x, -1, -2)


def _gemm_shape(a: Spec, b: Spec, bias: Spec | None = None, *, transpose_a, transpose_b):
    dtype = require_same_dtype("gemm", *(s for s in (a, b, bias) if s is not None))
    if a.ndim < 2 or b.ndim < 2:
        fail(f"gemm: inputs need rank >= 2, got a {show(a)} and b {show(b)}")
    m, ka = (a.shape[-1], a.shape[-2]) if transpose_a else (a.shape[-2], a.shape[-1])
    kb, n = (b.shape[-1], b.shape[-2]) if transpose_b else (b.shape[-2], b.shape[-1])
    if ka != kb:
        fail(
            f"gemm: contraction sizes differ: a {show(a)} gives k={ka} "
            f"(transpose_a={transpose_a}), b {show(b)} gives k={kb} (transpose_b={transpose_b}); "
            "for a dense layer with weight [out, in] use gemm(transpose_b=True)"
        )
    batch = broadcast_shape("gemm", a.shape[:-2], b.shape[:-2])
    out = Spec((*batch, m, n), dtype)
    if bias is not None:
        broadcast_shape("gemm (bias)", out.shape, bias.shape)
        if bias.shape and bias.shape[-1] not in (1, n):
            fail(f"gemm: bias {show(bias)} does not fit output columns n={n}")
    return out


@defcommand(family="blas", shape=_gemm_shape, uses=Uses(inputs=(0, 1)))
def gemm(a, b, bias=None, *, transpose_a=False, transpose_b=False):
    """Matrix product of the last two axes, plus an optional bias: ``a @ b + bias``.

    ``transpose_a`` / ``transpose_b`` transpose the last two axes of ``a`` / ``b``
    first; leading axes are batch axes and broadcast.
    """
    x = _mt(a) if transpose_a else a
    w = _mt(b) if transpose_b else b
    batch = broadcast_shape("gemm", x.shape[:-2], w.shape[:-2])
    if x.ndim != w.ndim or x.shape[:-2] != w.shape[:-2]:
        x = to_shape(x, batch + x.shape[-2:])
        w = to_shape(w, batch + w.shape[-2:])
    out = jnp.matmul(x, w, preferred_element_type=None)
    if bias is not None:
        out = out + to_shape(bias, out.shape)
    return out


@gemm.backward
def _gemm_backward(grads, inputs, outputs, *, transpose_a, transpose_b):
    (g,), (a, b, *bias) = grads, inputs
    x = _mt(a) if transpose_a else a
    w = _mt(b) if transpose_b else b
    gx = jnp.matmul(g, _mt(to_shape(w, g.shape[:-2] + w.shape[-2:])))
    gw = jnp.matmul(_mt(to_shape(x, g.shape[:-2] + x.shape[-2:])), g)
    ga = _mt(gx) if transpose_a else gx
    gb = _mt(gw) if transpose_b else gw
    result = (unbroadcast(ga, a.shape), unbroadcast(gb, b.shape))
    return result + tuple(unbroadcast(g, c.shape) for c in bias)


@defcommand(
    family="blas",
    shape=broadcast("add"),
    uses=NOTHING,
    elementwise=True,
    commutative=lambda cmd: cmd.param("p") == cmd.param("q"),  # p*a + q*b
)
def add(a, b, *, p=1.0, q=1.0):
    """``p * a + q * b`` (broadcasting), NNC's ADD with its two scalars."""
    shape = broadcast_shape("add", a.shape, b.shape)
    a, b = to_shape(a, shape), to_shape(b, shape)
    if q == -1.0 and p == 1.0:
        return lax.sub(a, b)
    if p != 1.0:
        a = lax.mul(a, _scalar(p, a))
    if q != 1.0:
        b = lax.mul(b, _scalar(q, b))
    return lax.add(a, b)


def _scalar(value, like):
    return lax.full(like.shape, value, like.dtype)


@add.backward
def _add_backward(grads, inputs, outputs, *, p, q):
    (g,), (a, b) = grads, inputs
    return unbroadcast(g * p, a.shape), unbroadcast(g * q, b.shape)


@defcommand(
    family="blas",
    shape=broadcast("mul"),
    uses=Uses(inputs=(0, 1)),
    elementwise=True,
    commutative=True,
)
def mul(a, b, *, p=1.0):
    """``p * a * b`` (broadcasting), NNC's MUL."""
    shape = broadcast_shape("mul", a.shape, b.shape)
    out = lax.mul(to_shape(a, shape), to_shape(b, shape))
    return out if p == 1.0 else lax.mul(out, _scalar(p, out))


@mul.backward
def _mul_backward(grads, inputs, outputs, *, p):
    (g,), (a, b) = grads, inputs
    gp = g * p if p != 1.0 else g
    return unbroadcast(gp * to_shape(b, g.shape), a.shape), unbroadcast(
        gp * to_shape(a, g.shape), b.shape
    )


@defcommand(family="blas", shape=same_shape, uses=NOTHING, elementwise=True)
def scalar_mul(x, *, a=1.0):
    """``a * x`` for a Python scalar ``a``, NNC's SCALAR_MUL."""
    return lax.mul(x, _scalar(a, x))


@scalar_mul.backward
def _scalar_mul_backward(grads, inputs, outputs, *, a):
    return (grads[0] * a,)
