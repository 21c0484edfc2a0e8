"""group_norm (NNC's GROUP_NORM), of the normalisation family in :mod:`fnnc.ops.norm`
and computed as the others are there: in float32 at least, outputs and gradients cast
back to their inputs' types; a 16-bit x's backward recomputes the statistics in float32
rather than read the rounded saved ones.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from fnnc.core.command import Spec, Uses, defcommand
from fnnc.errors import CommandError
from fnnc.ops._rules import (
    fail,
    norm_axes,
    require_float,
    require_ints,
    require_same_dtype,
    show,
    to_shape,
    unbroadcast,
)
from fnnc.ops.norm import _like, _mean_inv_std, _param, _rounded, _widen


def _group_layout(x, groups: int, axis: int, reduce_axes):
    """``(channel axis, x split as [..., groups, C // groups, ...], the split's reduced
    axes, statistics shape)`` for NNC's GROUP_NORM (see :func:`group_norm`)."""
    (ax,) = norm_axes("group_norm", (axis,), x.ndim)
    c = x.shape[ax]
    # groups=2.0 passed the divisibility check and reached jnp.reshape as a bare TypeError
    groups = require_ints("group_norm", "groups", groups)
    if groups < 1 or c % groups:
        raise CommandError(f"group_norm: groups={groups} must divide the {c} channels of {show(x)}")
    if reduce_axes is None:
        if ax == 0:
            fail(
                f"group_norm: axis 0 of {show(x)} is the batch axis; put channels on another "
                "axis, or name the axes to normalise over with reduce_axes"
            )
        red = tuple(d for d in range(1, x.ndim) if d != ax)
    else:
        red = norm_axes("group_norm", reduce_axes, x.ndim)
        if ax in red:
            fail(
                f"group_norm: reduce_axes {list(reduce_axes)} include the group axis {ax} of "
                f"{show(x)}; the group's own channels are always reduced, list only other axes"
            )
    split = (*x.shape[:ax], groups, c // groups, *x.shape[ax + 1 :])
    reduced = (ax + 1, *(d if d < ax else d + 1 for d in red))
    stat = tuple(groups if d == ax else 1 if d in red else n for d, n in enumerate(x.shape))
    return ax, split, tuple(sorted(reduced)), stat


def _check_affine(x, ax: int, **params) -> None:
    """scale / bias: ``[C]`` (per channel on ``ax``) or NNC's x-ranked form that
    broadcasts to x (``[1, ..., C]``, or per position)."""
    given = {k: p for k, p in params.items() if p is not None}
    require_float("group_norm", x)
    require_same_dtype("group_norm", x, *given.values())
    for label, p in given.items():
        nnc_form = p.ndim == x.ndim and all(m in (1, n) for m, n in zip(p.shape, x.shape))
        if tuple(p.shape) != (x.shape[ax],) and not nnc_form:
            fail(
                f"group_norm: {label} {show(p)} must have shape [{x.shape[ax]}] (the channels "
                f"on axis {ax} of x {show(x)}), or x's rank and broadcast to x (NNC's form)"
            )


def _affine(p, x, ax: int):
    return to_shape(p, x.shape) if p.ndim == x.ndim else _param(p, x, (ax,))


def _affine_grad(v, p, ax: int):
    """The gradient of a scale / bias ``p`` from its per-element contribution ``v``."""
    if p.ndim == v.ndim:
        return unbroadcast(v, p.shape)
    return jnp.sum(v, axis=tuple(d for d in range(v.ndim) if d != ax))


def _group_norm_shape(x, scale=None, bias=None, *, groups, axis, epsilon, reduce_axes):
    ax, _, _, stat = _group_layout(x, groups, axis, reduce_axes)
    _check_affine(x, ax, scale=scale, bias=bias)
    s = Spec(stat, x.dtype)
    return Spec(tuple(x.shape), x.dtype), s, s


@defcommand(family="norm", shape=_group_norm_shape, uses=Uses(inputs=(0, 1), outputs=(1, 2)))
def group_norm(x, scale=None, bias=None, *, groups, axis=-1, epsilon=1e-5, reduce_axes=()):
    """Group normalisation (NNC's GROUP_NORM): the channels on ``axis`` fall into
    ``groups`` equal groups; each group is normalised over its own channels plus the
    axes ``reduce_axes``; every other axis keeps statistics of its own.

    As NNC's ``CMD_GROUP_NORM_FORWARD(group_axis, groups, epsilon, elementwise_affine,
    ...)``, which lists its reduce axes after the others, none are reduced by default
    (``reduce_axes=()``): each position is normalised over the group's channels alone.
    ``reduce_axes=None`` reduces every axis but the batch axis 0: the usual group norm
    of a CNN, ``[N, H, W, C]`` normalised per sample and group (what the ``GroupNorm``
    layer uses).

    Returns ``(y, saved_mean, saved_inv_std)``; the statistics are shaped like x with
    ``groups`` on ``axis`` and 1 on ``reduce_axes`` (NNC's layout, e.g. ``[N, 1, 1, G]``
    for NHWC). ``scale`` and ``bias`` are optional (NNC's ``elementwise_affine=0`` is
    ``group_norm(x)``): ``[C]``, or NNC's form with x's rank broadcasting to x. A 16-bit
    x is normalised in float32; the outputs have x's type.
    """
    ax, split, reduced, stat = _group_layout(x, groups, axis, reduce_axes)
    orig, (x, scale, bias) = x, _widen(x, scale, bias)
    xs = jnp.reshape(x, split)
    mu, inv_std = _mean_inv_std(xs, reduced, epsilon)
    y = jnp.reshape((xs - mu) * inv_std, x.shape)
    if scale is not None:
        y = y * _affine(scale, x, ax)
    if bias is not None:
        y = y + _affine(bias, x, ax)
    return _like((y, jnp.reshape(mu, stat), jnp.reshape(inv_std, stat)), (orig,) * 3)


@group_norm.backward
def _group_norm_backward(grads, inputs, outputs, *, groups, axis, epsilon, reduce_axes):
    originals = inputs
    (gy, g_mean, g_inv), (x, *params) = _widen(*grads), (*_widen(*inputs[:2]), *inputs[2:])
    mu, inv_std = _widen(*outputs[1:])  # y is not kept (a spec)
    ax, split, reduced, _ = _group_layout(x, groups, axis, reduce_axes)
    keep = tuple(1 if d in reduced else n for d, n in enumerate(split))
    mu, inv_std = jnp.reshape(mu, keep), jnp.reshape(inv_std, keep)
    if _rounded(originals[0].dtype):  # the saved statistics were rounded to x's type
        mu, inv_std = _mean_inv_std(jnp.reshape(x, split), reduced, epsilon)
    n = math.prod(split[d] for d in reduced)
    gy = jnp.zeros(x.shape, x.dtype) if gy is None else gy
    xhat = (jnp.reshape(x, split) - mu) * inv_std
    scale = params[0] if params else None
    gxh = jnp.reshape(gy if scale is None else gy * _affine(scale, x, ax), split)
    gx = inv_std * (
        gxh
        - jnp.mean(gxh, axis=reduced, keepdims=True)
        - xhat * jnp.mean(gxh * xhat, axis=reduced, keepdims=True)
    )
    if g_mean is not None:
        gx = gx + jnp.reshape(g_mean, keep) / n
    if g_inv is not None:
        centred = xhat - jnp.mean(xhat, axis=reduced, keepdims=True)  # as batch_norm's
        gx = gx - (jnp.reshape(g_inv, keep) * inv_std * inv_std / n) * centred
    xhat = jnp.reshape(xhat, x.shape)
    contributions = (gy * xhat, gy)
    return _like(
        (
            jnp.reshape(gx, x.shape),
            *(None if p is None else _affine_grad(v, p, ax) for v, p in zip(contributions, params)),
        ),
        originals,
    )
