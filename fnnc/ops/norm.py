"""Normalisation family: batch_norm, layer_norm, group_norm, rms_norm (NNC's
BATCH_NORM, LAYER_NORM, GROUP_NORM, RMSNORM).

Each normalises ``x`` with statistics over some axes and returns the statistics it used
as extra outputs (``saved_mean``, ``saved_inv_std``), as NNC does, so a backward needs
no recomputation: the hand-written backwards of the hot ops layer_norm and rms_norm
read ``x``, ``scale`` and those saved outputs only. Variances are biased (divide by
the count) and ``epsilon`` goes inside the square root:
``inv_std = 1 / sqrt(var + epsilon)``.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from fnnc.core.command import Spec, Uses, defcommand
from fnnc.errors import CommandError
from fnnc.ops._rules import fail, norm_axes, require_float, require_same_dtype, show, to_shape


def _kept(shape, axes) -> tuple[int, ...]:
    return tuple(1 if d in axes else n for d, n in enumerate(shape))


def _param(p, x, axes):
    """A per-``axes`` parameter (shaped like x at axes) broadcast against x."""
    keep = tuple(n if d in axes else 1 for d, n in enumerate(x.shape))
    return to_shape(jnp.reshape(p, keep), x.shape)


def _check_params(name: str, x: Spec, want: tuple[int, ...], where: str, **params) -> None:
    require_float(name, x)
    given = {k: p for k, p in params.items() if p is not None}
    require_same_dtype(name, x, *given.values())
    for label, p in given.items():
        if tuple(p.shape) != want:
            fail(f"{name}: {label} {show(p)} must have shape {list(want)} ({where} of x {show(x)})")


# --- batch_norm ------------------------------------------------------------------------


def _batch_norm_shape(x, scale, bias, mean, var, *, axes, epsilon, momentum, is_test):
    ax = norm_axes("batch_norm", axes, x.ndim)
    stat = tuple(n for d, n in enumerate(x.shape) if d not in ax)
    where = f"x's shape without the reduced axes {list(ax)}"
    _check_params("batch_norm", x, stat, where, scale=scale, bias=bias, mean=mean, var=var)
    s = Spec(stat, x.dtype)
    return Spec(tuple(x.shape), x.dtype), s, s, s, s


@defcommand(family="norm", shape=_batch_norm_shape)
def batch_norm(
    x, scale, bias, mean, var, *, axes=(0, 1, 2), epsilon=1e-5, momentum=0.9, is_test=False
):
    """Batch normalisation over ``axes`` (NHWC default: per channel).

    Returns ``(y, new_mean, new_var, saved_mean, saved_inv_std)``. ``scale``, ``bias``
    and the running ``mean`` / ``var`` have x's shape without ``axes`` (``[C]``), as do
    the last four outputs. Follows NNC (lib/nnc/cmd/norm/ccv_nnc_batch_norm_cpu_ref.c):
    in training, ``saved_mean`` / ``saved_inv_std`` come from the batch with the *biased*
    variance, and ``new_mean = momentum * mean + (1 - momentum) * saved_mean``,
    ``new_var = momentum * var + (1 - momentum) * batch_var`` (momentum weights the old
    value; the biased batch variance goes in). With ``is_test`` the running statistics
    normalise and pass through unchanged (``saved_*`` are then those statistics).
    NNC's CPU test path divides by ``sqrt(var) + epsilon``; this uses
    ``sqrt(var + epsilon)`` like its cuDNN path and its training path.
    """
    ax = norm_axes("batch_norm", axes, x.ndim)
    keep = _kept(x.shape, ax)

    def full(t):
        return to_shape(jnp.reshape(t, keep), x.shape)

    if is_test:
        mu, batch_var = mean, var
    else:
        mu = jnp.mean(x, axis=ax)
        batch_var = jnp.mean(jnp.square(x - full(mu)), axis=ax)
    inv_std = lax.rsqrt(batch_var + epsilon)
    y = (x - full(mu)) * full(inv_std * scale) + full(bias)
    if is_test:
        return y, mean, var, mean, inv_std
    new_mean = momentum * mean + (1 - momentum) * mu
    new_var = momentum * var + (1 - momentum) * batch_var
    return y, new_mean, new_var, mu, inv_std


# --- layer_norm ------------------------------------------------------------------------


def _layer_norm_shape(x, scale=None, bias=None, *, axes, epsilon):
    ax = norm_axes("layer_norm", axes, x.ndim)
    want = tuple(x.shape[a] for a in ax)
    _check_params("layer_norm", x, want, f"the sizes at axes {list(ax)}", scale=scale, bias=bias)
    s = Spec(_kept(x.shape, ax), x.dtype)
    return Spec(tuple(x.shape), x.dtype), s, s


@defcommand(family="norm", shape=_layer_norm_shape, uses=Uses(inputs=(0, 1), outputs=(1, 2)))
def layer_norm(x, scale=None, bias=None, *, axes=(-1,), epsilon=1e-5):
    """Layer normalisation over ``axes``: ``(x - mean) * inv_std * scale + bias``.

    Returns ``(y, saved_mean, saved_inv_std)``, the statistics with ``axes`` kept as
    size 1. ``scale`` and ``bias`` are optional and shaped like x at ``axes``
    (``[C]`` for the default ``axes=(-1,)``).
    """
    ax = norm_axes("layer_norm", axes, x.ndim)
    mu = jnp.mean(x, axis=ax, keepdims=True)
    xc = x - mu
    inv_std = lax.rsqrt(jnp.mean(jnp.square(xc), axis=ax, keepdims=True) + epsilon)
    y = xc * inv_std
    if scale is not None:
        y = y * _param(scale, x, ax)
    if bias is not None:
        y = y + _param(bias, x, ax)
    return y, mu, inv_std


def _affine_grads(gy, xhat, x, ax, params):
    """Gradients of the optional scale (``sum gy * xhat``) and bias (``sum gy``)."""
    other = tuple(d for d in range(x.ndim) if d not in ax)
    sums = (jnp.sum(gy * xhat, axis=other), jnp.sum(gy, axis=other))
    return tuple(jnp.reshape(s, p.shape) for s, p in zip(sums, params))


@layer_norm.backward
def _layer_norm_backward(grads, inputs, outputs, *, axes, epsilon):
    gy, g_mean, g_inv = grads
    x, *params = inputs
    _, mu, inv_std = outputs
    ax = norm_axes("layer_norm", axes, x.ndim)
    n = math.prod(x.shape[a] for a in ax)
    gy = jnp.zeros(x.shape, x.dtype) if gy is None else gy
    xhat = (x - mu) * inv_std
    gxh = gy * _param(params[0], x, ax) if params else gy
    gx = inv_std * (
        gxh
        - jnp.mean(gxh, axis=ax, keepdims=True)
        - xhat * jnp.mean(gxh * xhat, axis=ax, keepdims=True)
    )
    if g_mean is not None:
        gx = gx + g_mean / n
    if g_inv is not None:
        gx = gx - (g_inv * inv_std * inv_std / n) * xhat
    return (gx, *_affine_grads(gy, xhat, x, ax, params))


# --- group_norm ------------------------------------------------------------------------


def _group_layout(x, groups: int, axis: int):
    """(channel axis, x split as [..., groups, C // groups, ...], reduced axes of the
    split, statistics shape)."""
    (ax,) = norm_axes("group_norm", (axis,), x.ndim)
    if ax == 0:
        fail(f"group_norm: axis 0 of {show(x)} is the batch axis; put channels on another axis")
    c = x.shape[ax]
    if groups < 1 or c % groups:
        raise CommandError(f"group_norm: groups={groups} must divide the {c} channels of {show(x)}")
    split = (*x.shape[:ax], groups, c // groups, *x.shape[ax + 1 :])
    reduced = tuple(d for d in range(1, len(split)) if d != ax)
    stat = tuple(n if d == 0 else groups if d == ax else 1 for d, n in enumerate(x.shape))
    return ax, split, reduced, stat


def _group_norm_shape(x, scale=None, bias=None, *, groups, axis, epsilon):
    ax, _, _, stat = _group_layout(x, groups, axis)
    _check_params(
        "group_norm", x, (x.shape[ax],), f"the channels on axis {ax}", scale=scale, bias=bias
    )
    s = Spec(stat, x.dtype)
    return Spec(tuple(x.shape), x.dtype), s, s


@defcommand(family="norm", shape=_group_norm_shape)
def group_norm(x, scale=None, bias=None, *, groups, axis=-1, epsilon=1e-5):
    """Group normalisation: channels on ``axis`` fall into ``groups`` equal groups, each
    normalised per sample over all its non-batch entries (axis 0 is the batch).

    Returns ``(y, saved_mean, saved_inv_std)``; the statistics are shaped like x with
    ``groups`` on ``axis``, 1 on the other non-batch axes (NNC's layout, e.g.
    ``[N, 1, 1, G]`` for NHWC). ``scale`` and ``bias`` are optional, shaped ``[C]``.
    """
    ax, split, reduced, stat = _group_layout(x, groups, axis)
    xs = jnp.reshape(x, split)
    mu = jnp.mean(xs, axis=reduced, keepdims=True)
    xc = xs - mu
    inv_std = lax.rsqrt(jnp.mean(jnp.square(xc), axis=reduced, keepdims=True) + epsilon)
    y = jnp.reshape(xc * inv_std, x.shape)
    if scale is not None:
        y = y * _param(scale, x, (ax,))
    if bias is not None:
        y = y + _param(bias, x, (ax,))
    return y, jnp.reshape(mu, stat), jnp.reshape(inv_std, stat)


# --- rms_norm --------------------------------------------------------------------------


def _rms_norm_shape(x, scale=None, *, axes, epsilon):
    ax = norm_axes("rms_norm", axes, x.ndim)
    _check_params(
        "rms_norm", x, tuple(x.shape[a] for a in ax), f"the sizes at axes {list(ax)}", scale=scale
    )
    return Spec(tuple(x.shape), x.dtype), Spec(_kept(x.shape, ax), x.dtype)


@defcommand(family="norm", shape=_rms_norm_shape, uses=Uses(inputs=(0, 1), outputs=(1,)))
def rms_norm(x, scale=None, *, axes=(-1,), epsilon=1e-6):
    """RMS normalisation over ``axes``: ``x * inv_std * scale`` with
    ``inv_std = 1 / sqrt(mean(x^2) + epsilon)``.

    Returns ``(y, saved_inv_std)`` (``axes`` kept as size 1); ``scale`` is optional and
    shaped like x at ``axes``.
    """
    ax = norm_axes("rms_norm", axes, x.ndim)
    inv_std = lax.rsqrt(jnp.mean(jnp.square(x), axis=ax, keepdims=True) + epsilon)
    y = x * inv_std
    if scale is not None:
        y = y * _param(scale, x, ax)
    return y, inv_std


@rms_norm.backward
def _rms_norm_backward(grads, inputs, outputs, *, axes, epsilon):
    gy, g_inv = grads
    x, *params = inputs
    _, inv_std = outputs
    ax = norm_axes("rms_norm", axes, x.ndim)
    n = math.prod(x.shape[a] for a in ax)
    gy = jnp.zeros(x.shape, x.dtype) if gy is None else gy
    xhat = x * inv_std
    gxh = gy * _param(params[0], x, ax) if params else gy
    gx = inv_std * (gxh - xhat * jnp.mean(gxh * xhat, axis=ax, keepdims=True))
    if g_inv is not None:
        gx = gx - (g_inv * inv_std * inv_std / n) * xhat
    return (gx, *_affine_grads(gy, xhat, x, ax, params))
