"""Row normalisation kernels shared by the ``layer_norm`` and ``rms_norm`` backends.

The input is viewed as ``[R, N]`` rows (the normalised axes are the trailing ones).
One program owns ``bm`` rows and walks the ``N`` lanes in power-of-two blocks of
``bn``; when ``N`` is not a multiple of ``bn`` (200 features) the last block is masked
(missing lanes read as 0 and are kept out of every sum, nothing is stored past ``N``).
Statistics and sums are float32 whatever the input dtype:

- forward: the mean (layer norm only), then the biased variance of ``x - mean`` (two
  passes, as the reference, so no cancellation), then ``y`` with scale and bias;
- backward: for a 16-bit layer norm, the statistics again from ``x`` in float32 (the
  saved ones were rounded to x's type); the row sums ``sum(g xhat)`` (and ``sum(g)``
  for layer norm) of ``g = gy * scale``, then ``dx``; the same walk writes this
  program's partial sums of ``d scale = sum_rows gy xhat`` and ``d bias = sum_rows gy``,
  which XLA adds up over the ``R / bm`` programs (a small ``[R / bm, N]`` array).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from fnnc.core.command import Spec
from fnnc.ops import norm as _norm_commands
from fnnc.ops._rules import norm_axes
from fnnc.ops.pallas import _derivatives
from fnnc.ops.pallas._common import (
    float_reason,
    lane_block,
    launch,
    load,
    row_block,
    span,
    steps,
    store,
    trailing,
)

LANE_BLOCK = 1024


@dataclasses.dataclass(frozen=True)
class Norm:
    """Static description of one normalisation call."""

    centered: bool  # layer norm (subtract the mean) or RMS norm
    epsilon: float
    has_scale: bool
    has_bias: bool = False

    @property
    def name(self) -> str:
        return "layer_norm" if self.centered else "rms_norm"


def blocks(rows: int, lanes: int) -> tuple[int, int]:
    bn = lane_block(lanes, LANE_BLOCK)
    return row_block(rows, bn), bn


def _lanes(ref: Any, j: Any, bn: int, n: int) -> tuple[Any, Any]:
    """Lane block ``j`` of a ``[rows, N]`` ref: its index and mask (``None`` if never ragged)."""
    return (slice(None), pl.ds(j * bn, bn)), span(j * bn, bn, n, (ref.shape[0], bn), 1)


def _load(ref: Any, j: Any, bn: int, n: int) -> Any:
    """Lane block ``j`` of ``ref`` in float32, 0 past ``N``."""
    return load(ref, *_lanes(ref, j, bn, n)).astype(jnp.float32)


def _stats(x_ref: Any, norm: Norm, bn: int) -> tuple[Any, Any]:
    bm, n = x_ref.shape
    walk = steps(n, bn)
    mean = jnp.zeros((bm, 1), jnp.float32)
    if norm.centered:
        total = lambda j, acc: acc + jnp.sum(_load(x_ref, j, bn, n), axis=1, keepdims=True)
        mean = lax.fori_loop(0, walk, total, mean) / n

    def squares(j, acc):
        xc = _load(x_ref, j, bn, n) - mean
        mask = _lanes(x_ref, j, bn, n)[1]
        xc = xc if mask is None else jnp.where(mask, xc, 0.0)
        return acc + jnp.sum(xc * xc, axis=1, keepdims=True)

    var = lax.fori_loop(0, walk, squares, jnp.zeros((bm, 1), jnp.float32)) / n
    return mean, lax.rsqrt(var + norm.epsilon)


def _forward_kernel(x_ref, *refs, norm: Norm, bn: int):
    it = iter(refs)
    scale_ref = next(it) if norm.has_scale else None
    bias_ref = next(it) if norm.has_bias else None
    y_ref, *stat_refs = it
    mean, inv = _stats(x_ref, norm, bn)

    n = x_ref.shape[1]

    def write(j, carry):
        y = (_load(x_ref, j, bn, n) - mean) * inv
        if scale_ref is not None:
            y = y * _load(scale_ref, j, bn, n)
        if bias_ref is not None:
            y = y + _load(bias_ref, j, bn, n)
        idx, mask = _lanes(y_ref, j, bn, n)
        store(y_ref, idx, y, mask)
        return carry

    lax.fori_loop(0, steps(n, bn), write, 0)
    stats = (mean, inv) if norm.centered else (inv,)
    for ref, value in zip(stat_refs, stats):
        ref[...] = value.astype(ref.dtype)


def forward(norm: Norm, x: Any, *params: Any) -> tuple[Any, ...]:
    """``(y, mean, inv_std)`` (layer norm) or ``(y, inv_std)`` of ``x [R, N]``; params [1, N]."""
    rows, n = x.shape
    bm, bn = blocks(rows, n)
    row = lambda i: (i, 0)
    stats = 2 if norm.centered else 1
    return tuple(
        launch(
            functools.partial(_forward_kernel, norm=norm, bn=bn),
            grid=(rows // bm,),
            in_specs=[pl.BlockSpec((bm, n), row)]
            + [pl.BlockSpec((1, n), lambda i: (0, 0))] * len(params),
            out_specs=[pl.BlockSpec((bm, n), row)] + [pl.BlockSpec((bm, 1), row)] * stats,
            out_shape=[Spec((rows, n), x.dtype)] + [Spec((rows, 1), x.dtype)] * stats,
            name=f"fnnc_{norm.name}",
        )(x, *params)
    )


def _backward_kernel(*refs, norm: Norm, bn: int, has: tuple[bool, bool, bool]):
    it = iter(refs)
    x_ref = next(it)
    scale_ref = next(it) if norm.has_scale else None
    mean_ref = next(it) if norm.centered else None
    inv_ref = next(it)
    gy_ref, gmean_ref, ginv_ref = (next(it) if h else None for h in has)
    gx_ref, *partial_refs = it
    bm, n = x_ref.shape
    walk = steps(n, bn)
    mean = mean_ref[...].astype(jnp.float32) if mean_ref is not None else 0.0
    inv = inv_ref[...].astype(jnp.float32)
    if norm.centered and x_ref.dtype.itemsize == 2:
        # 16-bit saved statistics were rounded (a mean of 100 in bfloat16 is off by up to
        # 0.25, shifting every x - mean): recomputed in float32 from x, as the reference
        # layer_norm backward does
        mean, inv = _stats(x_ref, norm, bn)

    def pieces(j):  # past N, gy and g are 0, so no sum below sees those lanes
        xhat = (_load(x_ref, j, bn, n) - mean) * inv
        gy = _load(gy_ref, j, bn, n) if gy_ref is not None else jnp.zeros_like(xhat)
        g = gy * _load(scale_ref, j, bn, n) if scale_ref is not None else gy
        return xhat, gy, g

    # The variance's derivative 2 (x - mean(x)) / n sums to 0, but x - mean with the mean
    # rounded (7 threes average to 3.0000002) does not, and a cotangent of inv_std times
    # inv_std**2 turned that into a gradient of 1 on a constant row: xhat is recentred.
    recentre = norm.centered and ginv_ref is not None

    def sums(j, acc):
        xhat, _, g = pieces(j)
        if recentre:
            mask = _lanes(x_ref, j, bn, n)[1]
            inside = xhat if mask is None else jnp.where(mask, xhat, 0.0)
            acc = (*acc[:2], acc[2] + jnp.sum(inside, axis=1, keepdims=True))
        return (
            acc[0] + jnp.sum(g, axis=1, keepdims=True),
            acc[1] + jnp.sum(g * xhat, axis=1, keepdims=True),
            acc[2],
        )

    zero = jnp.zeros((bm, 1), jnp.float32)
    sum_g, sum_gx, sum_xhat = lax.fori_loop(0, walk, sums, (zero, zero, zero))

    def write(j, carry):
        xhat, gy, g = pieces(j)
        gx = g - xhat * (sum_gx / n)
        if norm.centered:
            gx = gx - sum_g / n
        gx = gx * inv
        if gmean_ref is not None:
            gx = gx + gmean_ref[...].astype(jnp.float32) / n
        if ginv_ref is not None:
            gx = gx - (ginv_ref[...].astype(jnp.float32) * inv * inv / n) * (xhat - sum_xhat / n)
        idx, mask = _lanes(gx_ref, j, bn, n)
        store(gx_ref, idx, gx, mask)
        parts = ([gy * xhat] if norm.has_scale else []) + ([gy] if norm.has_bias else [])
        for ref, part in zip(partial_refs, parts):
            idx, mask = _lanes(ref, j, bn, n)
            store(ref, idx, jnp.sum(part, axis=0, keepdims=True), mask)
        return carry

    lax.fori_loop(0, walk, write, 0)


def backward(
    norm: Norm,
    x: Any,
    params: tuple[Any, ...],
    stats: tuple[Any, ...],
    grads: tuple[Any, ...],
) -> tuple[Any, ...]:
    """``(dx, d scale?, d bias?)`` for ``x [R, N]``, params ``[1, N]``, stats ``[R, 1]``.

    ``grads`` are the gradients of ``y`` and of each statistic, any of them ``None``.
    """
    rows, n = x.shape
    bm, bn = blocks(rows, n)
    row = lambda i: (i, 0)
    wide, narrow = pl.BlockSpec((bm, n), row), pl.BlockSpec((bm, 1), row)
    args = [x, *params[:1], *stats]
    specs = (
        [wide] + [pl.BlockSpec((1, n), lambda i: (0, 0))] * len(params[:1]) + [narrow] * len(stats)
    )
    for g, spec in zip(grads, [wide] + [narrow] * len(stats)):
        if g is not None:
            args.append(g.astype(x.dtype))
            specs.append(spec)
    n_partials = int(norm.has_scale) + int(norm.has_bias)
    has = tuple(g is not None for g in grads)
    if not norm.centered:
        has = (has[0], False, has[1])
    kernel = functools.partial(_backward_kernel, norm=norm, bn=bn, has=has)
    gx, *partials = launch(
        kernel,
        grid=(rows // bm,),
        in_specs=specs,
        out_specs=[wide] + [pl.BlockSpec((1, n), lambda i: (i, 0))] * n_partials,
        out_shape=[Spec((rows, n), x.dtype)] + [Spec((rows // bm, n), jnp.float32)] * n_partials,
        name=f"fnnc_{norm.name}_backward",
        warps=8,
    )(*args)
    sums = (jnp.sum(p, axis=0, keepdims=True).astype(x.dtype) for p in partials)
    return (gx, *sums)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def normalize(norm: Norm, x: Any, *params: Any) -> tuple[Any, ...]:
    """:func:`forward` with the :func:`backward` kernel as its VJP."""
    return forward(norm, x, *params)


def _normalize_fwd(norm, x, *params):
    outs = forward(norm, x, *params)
    return outs, (x, params, outs[1:])


def _normalize_bwd(norm, residuals, cts):
    x, params, stats = residuals
    return backward(norm, x, params, stats, tuple(cts))


def _normalize_reference(norm: Norm, x: Any, *params: Any) -> tuple[Any, ...]:
    """The command's reference forward on the kernels' ``[R, N]`` rows."""
    command = _norm_commands.layer_norm if norm.centered else _norm_commands.rms_norm
    return tuple(command.definition.forward(x, *params, axes=(-1,), epsilon=norm.epsilon))


_derivatives.defvjp(normalize, _normalize_fwd, _normalize_bwd, _normalize_reference)


def support_reason(norm_name: str, specs: Sequence[Spec], axes: Sequence[int]) -> str | None:
    """Why the kernels cannot normalise ``specs[0]`` over ``axes`` (``None`` if they can)."""
    x = specs[0]
    why = float_reason(norm_name, *specs)
    if why is not None:
        return why
    ax = norm_axes(norm_name, axes, x.ndim)
    if not trailing(ax, x.ndim):
        return f"{norm_name}: axes {list(ax)} of a rank-{x.ndim} input are not the trailing axes"
    rows, lanes = _split(x.shape, len(ax))
    if rows == 0:
        return f"{norm_name}: input {list(x.shape)} is empty"
    if lanes == 0:
        return f"{norm_name}: input {list(x.shape)} normalises over no elements"
    return None


def _split(shape: Sequence[int], k: int) -> tuple[int, int]:
    return math.prod(shape[: len(shape) - k]), math.prod(shape[len(shape) - k :])


def run(norm: Norm, x: Any, params: Sequence[Any], axes: Sequence[int]) -> tuple[Any, ...]:
    """The command's forward on ``x`` in its own shape: ``(y, *statistics)``."""
    k = len(norm_axes(norm.name, axes, x.ndim))
    rows, lanes = _split(x.shape, k)
    flat = [jnp.reshape(p, (1, lanes)) for p in params]
    y, *stats = normalize(norm, jnp.reshape(x, (rows, lanes)), *flat)
    kept = (*x.shape[: x.ndim - k], *(1,) * k)
    return (jnp.reshape(y, x.shape), *(jnp.reshape(s, kept) for s in stats))


def grad(
    norm: Norm,
    grads: Sequence[Any],
    x: Any,
    params: Sequence[Any],
    stats: Sequence[Any],
    axes: Sequence[int],
) -> tuple[Any, ...]:
    """The command's backward in NNC's convention; ``params`` may hold bare specs."""
    k = len(norm_axes(norm.name, axes, x.ndim))
    rows, lanes = _split(x.shape, k)
    flat = lambda a, n: None if a is None else jnp.reshape(a, (rows, n))
    scale = [jnp.reshape(params[0], (1, lanes))] if norm.has_scale else []
    gx, *gp = backward(
        norm,
        jnp.reshape(x, (rows, lanes)),
        tuple(scale),
        tuple(flat(s, 1) for s in stats),
        (flat(grads[0], lanes), *(flat(g, 1) for g in grads[1:])),
    )
    return (jnp.reshape(gx, x.shape), *(jnp.reshape(g, p.shape) for g, p in zip(gp, params)))
