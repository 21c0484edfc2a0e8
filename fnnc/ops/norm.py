"""Normalisation family: batch_norm, layer_norm, rms_norm (NNC's BATCH_NORM,
LAYER_NORM, RMSNORM); group_norm (GROUP_NORM) is in :mod:`fnnc.ops.group_norm`.

Each normalises ``x`` with statistics over some axes and returns the statistics it used
as extra outputs (``saved_mean``, ``saved_inv_std``), as NNC does, so a backward needs
no recomputation: the hand-written backwards of the hot ops layer_norm and rms_norm
read ``x``, ``scale`` and those saved outputs only. Variances are biased (divide by
the count) and ``epsilon`` goes inside the square root:
``inv_std = 1 / sqrt(var + epsilon)``. Statistics and sums are computed in float32 at
least (:func:`~fnnc.core.dtypes.at_least_float32`) and the outputs and gradients cast
back, so a 16-bit x whose deviations square past its range (``|x - mean| >= 256`` in
float16) still normalises. The saved statistics keep their documented type (x's, as
NNC's and the Pallas kernels'); where that is 16-bit the centred norms' backwards
(batch_norm, layer_norm, group_norm) recompute them in float32 from x rather than read
the rounded ones, whose rounding (a mean of 100 in bfloat16) would have shifted every
``x - mean`` of the gradient. rms_norm's backward reads its saved ``inv_std`` as NNC's
does: its rounding scales the gradient by at most one rounding of x's type, as large as
the outputs' own (bfloat16 dx 0.3% off float64 against 0.2% for rounding alone).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import Spec, Uses, defcommand
from fnnc.core.dtypes import at_least_float32
from fnnc.ops._rules import (
    fail,
    leading_sum,
    norm_axes,
    require_float,
    require_same_dtype,
    show,
    to_shape,
)


def _kept(shape, axes) -> tuple[int, ...]:
    return tuple(1 if d in axes else n for d, n in enumerate(shape))


def _widen(*ts):
    """Each tensor in float32 at least (``None`` stays ``None``). In float16 a deviation
    of 256 squares to inf (``inv_std`` 0, y silently 0) and ``inv_std**2`` of a constant
    row (``1 / epsilon``) overflows the backward."""
    return tuple(None if t is None else t.astype(at_least_float32(t.dtype)) for t in ts)


def _rounded(dtype) -> bool:
    """Whether statistics saved in ``dtype`` were rounded (a 16-bit type)."""
    return at_least_float32(dtype) != dtype


def _mean_inv_std(x, axes, epsilon):
    """The mean and ``1 / sqrt(biased variance + epsilon)`` of ``x`` over ``axes``
    (kept), in x's type: what the forwards compute and what a backward recomputes when
    the saved statistics were rounded to 16 bits (a mean of 100 rounded to bfloat16
    shifts every centred value by up to 0.25, a quarter of a unit deviation)."""
    mu = jnp.mean(x, axis=axes, keepdims=True)
    return mu, lax.rsqrt(jnp.mean(jnp.square(x - mu), axis=axes, keepdims=True) + epsilon)


def _like(values, originals) -> tuple:
    """Each value cast back to the type of its original (``None`` stays ``None``)."""
    return tuple(None if v is None else v.astype(o.dtype) for v, o in zip(values, originals))


def _param(p, x, axes):
    """A per-``axes`` parameter (shaped like x at axes) broadcast against x."""
    keep = tuple(n if d in axes else 1 for d, n in enumerate(x.shape))
    return to_shape(jnp.reshape(p, keep), x.shape)


def _kept_params(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    """x's shape with 1 off ``axes``: NNC's layout of a layer norm's scale and bias."""
    return tuple(n if d in axes else 1 for d, n in enumerate(shape))


def _check_params(
    name: str, x: Spec, want: tuple[int, ...], where: str, kept: tuple[int, ...] = (), **params
) -> None:
    """Each parameter shaped ``want``, or ``kept`` (x's rank, 1 off the normalized axes,
    as NNC shapes a layer norm's scale) where given."""
    require_float(name, x)
    given = {k: p for k, p in params.items() if p is not None}
    require_same_dtype(name, x, *given.values())
    for label, p in given.items():
        if tuple(p.shape) != want and not (kept and tuple(p.shape) == kept):
            also = f" or {list(kept)}" if kept else ""
            fail(
                f"{name}: {label} {show(p)} must have shape {list(want)}{also} ({where} of x "
                f"{show(x)})"
            )


# --- batch_norm ------------------------------------------------------------------------


def _batch_norm_shape(x, scale, bias, mean, var, *, axes, epsilon, momentum, is_test):
    ax = norm_axes("batch_norm", axes, x.ndim)
    stat = tuple(n for d, n in enumerate(x.shape) if d not in ax)
    where = f"x's shape without the reduced axes {list(ax)}"
    like = Spec(tuple(x.shape), _stat_dtype(x.dtype, scale.dtype))
    _check_params("batch_norm", like, stat, where, scale=scale, bias=bias, mean=mean, var=var)
    s = Spec(stat, like.dtype)
    return Spec(tuple(x.shape), x.dtype), s, s, s, s


def _stat_dtype(x_dtype, param_dtype) -> np.dtype:
    """The statistics' type: x's, or float32 beside a 16-bit x (NNC's and cuDNN's mixed
    layout: half activations, float parameters and statistics)."""
    half = jnp.issubdtype(x_dtype, jnp.floating) and np.dtype(x_dtype).itemsize == 2
    return np.dtype(param_dtype if half and param_dtype == np.float32 else x_dtype)


@defcommand(
    family="norm",
    shape=_batch_norm_shape,
    uses=Uses(inputs=(0, 1), outputs=(3, 4)),
    batch_statistics=lambda cmd: not cmd.param("is_test"),
)
def batch_norm(
    x, scale, bias, mean, var, *, axes=(0, 1, 2), epsilon=1e-5, momentum=0.9, is_test=False
):
    """Batch normalisation over ``axes`` (NHWC default: per channel).

    Returns ``(y, new_mean, new_var, saved_mean, saved_inv_std)``. ``scale``, ``bias``
    and the running ``mean`` / ``var`` have x's shape without ``axes`` (``[C]``), as do
    the last four outputs; they share x's type, or are float32 beside a 16-bit x (NNC's
    and cuDNN's mixed layout). All is computed in float32 at least, y in x's type. Follows NNC
    (lib/nnc/cmd/norm/ccv_nnc_batch_norm_cpu_ref.c):
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
    out_dtype, stat = x.dtype, _stat_dtype(x.dtype, scale.dtype)
    x, scale, bias, mean, var = _widen(x, scale, bias, mean, var)

    def full(t):
        return to_shape(jnp.reshape(t, keep), x.shape)

    if is_test:
        mu, batch_var = mean, var
    else:
        n = math.prod(x.shape[a] for a in ax)
        mu = leading_sum(x, ax) / n
        batch_var = leading_sum(jnp.square(x - full(mu)), ax) / n
    inv_std = lax.rsqrt(batch_var + epsilon)
    y = ((x - full(mu)) * full(inv_std * scale) + full(bias)).astype(out_dtype)
    if is_test:
        return y, *(t.astype(stat) for t in (mean, var, mean, inv_std))
    new_mean = momentum * mean + (1 - momentum) * mu
    new_var = momentum * var + (1 - momentum) * batch_var
    return y, *(t.astype(stat) for t in (new_mean, new_var, mu, inv_std))


def _sum_or_none(*terms):
    """The sum of the terms that are not ``None`` (``None`` if all are)."""
    given = [t for t in terms if t is not None]
    return sum(given[1:], given[0]) if given else None


@batch_norm.backward
def _batch_norm_backward(grads, inputs, outputs, *, axes, epsilon, momentum, is_test):
    """Closed form from the saved statistics: ``x``, ``scale``, ``saved_mean`` and
    ``saved_inv_std`` are all it reads (two reductions and one elementwise pass over
    ``x`` in training, where differentiating the reference would recompute the
    centred input and its square)."""
    x_dtype, stat = inputs[0].dtype, outputs[-1].dtype
    gy, g_new_mean, g_new_var, g_mean, g_inv = _widen(*grads)
    x, scale = _widen(*inputs[:2])
    mu, inv_std = _widen(*outputs[-2:])
    ax = norm_axes("batch_norm", axes, x.ndim)
    keep = _kept(x.shape, ax)
    n = math.prod(x.shape[a] for a in ax)
    if _rounded(stat):  # 16-bit saved statistics: recomputed unrounded, as the forward's
        if is_test:
            mu, var = _widen(*inputs[3:5])
            inv_std = lax.rsqrt(var + epsilon)
        else:
            mu = leading_sum(x, ax) / n
            diff = x - to_shape(jnp.reshape(mu, keep), x.shape)
            inv_std = lax.rsqrt(leading_sum(jnp.square(diff), ax) / n + epsilon)

    def full(t):
        return to_shape(jnp.reshape(t, keep), x.shape)

    xhat = (x - full(mu)) * full(inv_std)
    gy = jnp.zeros(x.shape, x.dtype) if gy is None else gy
    sum_gy = leading_sum(gy, ax)
    sum_gy_xhat = leading_sum(gy * xhat, ax)
    g_scale, g_bias = sum_gy_xhat, sum_gy
    # What reaches the statistics by other routes than y: the running averages (in
    # training they take the batch's), and saved_mean / saved_inv_std themselves.
    d_inv = -0.5 * inv_std**3  # d inv_std / d var
    g_stat_mean = _sum_or_none(g_mean, None if is_test else _scaled(g_new_mean, 1 - momentum))
    g_stat_var = _sum_or_none(
        None if g_inv is None else g_inv * d_inv,
        None if is_test else _scaled(g_new_var, 1 - momentum),
    )
    if is_test:
        gx = gy * full(inv_std * scale)
        g_run_mean = _sum_or_none(-sum_gy * inv_std * scale, g_new_mean, g_stat_mean)
        g_run_var = _sum_or_none(sum_gy_xhat * scale * d_inv / inv_std, g_new_var, g_stat_var)
        return _narrow(x_dtype, stat, gx, g_scale, g_bias, g_run_mean, g_run_var)
    gx = full(inv_std * scale) * (gy - full(sum_gy / n) - xhat * full(sum_gy_xhat / n))
    if g_stat_mean is not None:
        gx = gx + full(g_stat_mean / n)
    if g_stat_var is not None:
        # xhat minus its own mean: the variance's derivative 2 (x - mean(x)) / n sums to
        # 0, but x - mu with mu rounded (7 threes average to 3.0000002) does not, and
        # inv_std**2 (1e5 on a constant row) made that a gradient of 1 where it is 0
        centred = xhat - full(leading_sum(xhat, ax) / n)
        gx = gx + full(2 * g_stat_var / (n * inv_std)) * centred
    g_mean, g_var = _scaled(g_new_mean, momentum), _scaled(g_new_var, momentum)
    return _narrow(x_dtype, stat, gx, g_scale, g_bias, g_mean, g_var)


def _scaled(g, factor):
    return None if g is None else g * factor


def _narrow(x_dtype, stat, gx, *stat_grads) -> tuple:
    """batch_norm's gradients back in their inputs' types (x's; the statistics')."""
    return gx.astype(x_dtype), *(None if g is None else g.astype(stat) for g in stat_grads)


# --- layer_norm ------------------------------------------------------------------------


def _layer_norm_shape(x, scale=None, bias=None, *, axes, epsilon):
    ax = norm_axes("layer_norm", axes, x.ndim)
    want = tuple(x.shape[a] for a in ax)
    where, kept = f"the sizes at axes {list(ax)}", _kept_params(x.shape, ax)
    _check_params("layer_norm", x, want, where, kept, scale=scale, bias=bias)
    s = Spec(_kept(x.shape, ax), x.dtype)
    return Spec(tuple(x.shape), x.dtype), s, s


@defcommand(family="norm", shape=_layer_norm_shape, uses=Uses(inputs=(0, 1), outputs=(1, 2)))
def layer_norm(x, scale=None, bias=None, *, axes=(-1,), epsilon=1e-5):
    """Layer normalisation over ``axes``: ``(x - mean) * inv_std * scale + bias``.

    Returns ``(y, saved_mean, saved_inv_std)``, the statistics with ``axes`` kept as
    size 1. ``scale`` and ``bias`` are optional and shaped like x at ``axes``
    (``[C]`` for the default ``axes=(-1,)``), or as NNC shapes them, with x's rank and 1
    off ``axes`` (``[1, 1, C]``). A 16-bit x is normalised in float32 (as the Pallas
    kernel does); the outputs have x's type.
    """
    ax = norm_axes("layer_norm", axes, x.ndim)
    orig, (x, scale, bias) = x, _widen(x, scale, bias)
    mu, inv_std = _mean_inv_std(x, ax, epsilon)
    y = (x - mu) * inv_std
    if scale is not None:
        y = y * _param(scale, x, ax)
    if bias is not None:
        y = y + _param(bias, x, ax)
    return _like((y, mu, inv_std), (orig,) * 3)


def _affine_grads(gy, xhat, x, ax, params):
    """Gradients of the optional scale (``sum gy * xhat``) and bias (``sum gy``)."""
    other = tuple(d for d in range(x.ndim) if d not in ax)
    sums = (jnp.sum(gy * xhat, axis=other), jnp.sum(gy, axis=other))
    # A left-out parameter (``None``, as an eager call may pass a bias without a scale)
    # has no gradient.
    return tuple(None if p is None else jnp.reshape(s, p.shape) for s, p in zip(sums, params))


@layer_norm.backward
def _layer_norm_backward(grads, inputs, outputs, *, axes, epsilon):
    originals = inputs
    (gy, g_mean, g_inv), (x, *params) = _widen(*grads), (*_widen(*inputs[:2]), *inputs[2:])
    mu, inv_std = _widen(*outputs[1:])  # y is not kept (a spec)
    ax = norm_axes("layer_norm", axes, x.ndim)
    n = math.prod(x.shape[a] for a in ax)
    if _rounded(originals[0].dtype):  # the saved statistics were rounded to x's type
        mu, inv_std = _mean_inv_std(x, ax, epsilon)
    gy = jnp.zeros(x.shape, x.dtype) if gy is None else gy
    xhat = (x - mu) * inv_std
    gxh = gy if not params or params[0] is None else gy * _param(params[0], x, ax)
    gx = inv_std * (
        gxh
        - jnp.mean(gxh, axis=ax, keepdims=True)
        - xhat * jnp.mean(gxh * xhat, axis=ax, keepdims=True)
    )
    if g_mean is not None:
        gx = gx + g_mean / n
    if g_inv is not None:
        centred = xhat - jnp.mean(xhat, axis=ax, keepdims=True)  # as in batch_norm's
        gx = gx - (g_inv * inv_std * inv_std / n) * centred
    return _like((gx, *_affine_grads(gy, xhat, x, ax, params)), originals)


# --- rms_norm --------------------------------------------------------------------------


def _rms_norm_shape(x, scale=None, *, axes, epsilon):
    ax = norm_axes("rms_norm", axes, x.ndim)
    want, kept = tuple(x.shape[a] for a in ax), _kept_params(x.shape, ax)
    _check_params("rms_norm", x, want, f"the sizes at axes {list(ax)}", kept, scale=scale)
    return Spec(tuple(x.shape), x.dtype), Spec(_kept(x.shape, ax), x.dtype)


@defcommand(family="norm", shape=_rms_norm_shape, uses=Uses(inputs=(0, 1), outputs=(1,)))
def rms_norm(x, scale=None, *, axes=(-1,), epsilon=1e-6):
    """RMS normalisation over ``axes``: ``x * inv_std * scale`` with
    ``inv_std = 1 / sqrt(mean(x^2) + epsilon)``.

    Returns ``(y, saved_inv_std)`` (``axes`` kept as size 1); ``scale`` is optional and
    shaped like x at ``axes`` (or with x's rank and 1 off ``axes``, as NNC's). A 16-bit x
    is normalised in float32 (as the Pallas kernel does); the outputs have x's type.
    """
    ax = norm_axes("rms_norm", axes, x.ndim)
    orig, (x, scale) = x, _widen(x, scale)
    inv_std = lax.rsqrt(jnp.mean(jnp.square(x), axis=ax, keepdims=True) + epsilon)
    y = x * inv_std
    if scale is not None:
        y = y * _param(scale, x, ax)
    return _like((y, inv_std), (orig, orig))


@rms_norm.backward
def _rms_norm_backward(grads, inputs, outputs, *, axes, epsilon):
    originals = inputs
    (gy, g_inv), (x, *params) = _widen(*grads), (*_widen(*inputs[:2]), *inputs[2:])
    (inv_std,) = _widen(outputs[1])
    ax = norm_axes("rms_norm", axes, x.ndim)
    n = math.prod(x.shape[a] for a in ax)
    gy = jnp.zeros(x.shape, x.dtype) if gy is None else gy
    xhat = x * inv_std
    gxh = gy if not params or params[0] is None else gy * _param(params[0], x, ax)
    gx = inv_std * (gxh - xhat * jnp.mean(gxh * xhat, axis=ax, keepdims=True))
    if g_inv is not None:
        gx = gx - (g_inv * inv_std * inv_std / n) * xhat
    return _like((gx, *_affine_grads(gy, xhat, x, ax, params)), originals)
