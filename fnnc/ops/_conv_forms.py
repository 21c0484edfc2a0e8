"""Formulations of a convolution's three products for XLA:CPU (behind :mod:`fnnc.ops.conv_cpu`).

A convolution's forward, data gradient and weight gradient can each be written several
ways that compute the same sums in different orders. XLA:CPU runs them at very
different speeds, because it hands a plain 2-D float convolution to YNNPACK (fast for
the forward of thin layers, slow elsewhere: its weight gradient, a convolution whose
window is the whole feature map, is 3-4x slower than it should be) and everything else
to Eigen's convolution or to its GEMM. Here, for channels-last ``x``, weight ``[O, k...,
C/groups]`` and explicit geometry (``strides``, ``pads`` as (low, high) pairs,
``dilation``, ``groups``, output sizes, as :func:`fnnc.ops.conv._conv_geometry` gives
it):

``reference``
    XLA's convolution, its transposed convolution (data gradient) and the transpose of
    the map ``w -> conv(x, w)`` (weight gradient): what the ``"xla"`` backend runs.
``dilated``
    the same convolution with the input *base-dilated* by 2 (zeros between cells) read
    at twice the stride and kernel dilation: the very same products, but YNNPACK
    declines base dilation, so XLA runs it, and both its gradients, with Eigen.
``chunked`` (weight gradient)
    the reference weight gradient of every :data:`CHUNK` images, summed: a sum over
    the batch split into parts, each small enough to stay in cache.
``gemm``
    *im2col*: ``patches(x)`` is ``[N, out..., K, C]``, for each output position the
    ``K = prod(kernel)`` input cells its window reads (kernel offsets in row-major
    order, the weight's flattening order); forward ``patches @ wᵀ``, weight gradient
    ``dyᵀ @ patches``, data gradient ``col2im(dy @ w)``: each kernel offset's slice of
    ``dy @ w`` scattered back to the cells it read (a zero-interleaved pad per offset,
    summed) and the padding cropped. Groups become a batch axis of the products.

Every form works for 1 to 3 spatial axes and is exact in math (float sums in another
order). The ``dilated`` form relies on YNNPACK declining base-dilated convolutions (XLA:CPU's
``IsConvolutionOpSupportedByYnn`` in jaxlib 0.10); were that to change it would stay correct,
only its speed would.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from fnnc.ops import _spatial
from fnnc.ops.conv import _DIMS, _conv, _conv_t

Pads = Sequence[tuple[int, int]]

CHUNK = 8
"""Images per ``chunked`` weight-gradient part (4 to 16 measured alike on batch 32-256)."""


# -- reference and chunked -------------------------------------------------------------


def reference_forward(x, w, strides, pads: Pads, dilation, groups: int) -> Any:
    """XLA's convolution (the ``"xla"`` backend's forward, without bias)."""
    return _conv(x, w, strides, pads, dilation, groups)


def reference_data_grad(g, x, w, strides, pads: Pads, dilation, groups: int) -> Any:
    """XLA's transposed convolution of ``g``, sized like ``x``."""
    out = g.shape[1:-1]
    keff = _spatial.dilated(w.shape[1:-1], dilation)
    # The output_padding that makes the transpose give back exactly x's sizes.
    r = tuple(
        n - ((m - 1) * si + ke - lo - hi)
        for n, m, si, ke, (lo, hi) in zip(x.shape[1:-1], out, strides, keff, pads)
    )
    return _conv_t(g, w, strides, pads, dilation, groups, r)


def _transpose_in_w(conv, g, x, w):
    """The weight gradient of ``conv(x, w)``: the transpose of a map linear in ``w``."""
    (gw,) = jax.linear_transpose(
        functools.partial(conv, x), jax.ShapeDtypeStruct(w.shape, w.dtype)
    )(g)
    return gw


def reference_weight_grad(g, x, w, strides, pads: Pads, dilation, groups: int) -> Any:
    """XLA's weight gradient (the reference backward's)."""
    conv = functools.partial(_conv, strides=strides, pads=pads, dilation=dilation, groups=groups)
    return _transpose_in_w(lambda x, w: conv(x, w), g, x, w)


def chunked_weight_grad(g, x, w, strides, pads: Pads, dilation, groups: int, chunk=None) -> Any:
    """The reference weight gradient of every ``chunk`` images (default :data:`CHUNK`;
    the last part may be smaller), summed."""
    chunk = chunk or CHUNK
    total = None
    for start in range(0, x.shape[0], chunk):
        stop = min(start + chunk, x.shape[0])
        part = reference_weight_grad(
            g[start:stop], x[start:stop], w, strides, pads, dilation, groups
        )
        total = part if total is None else total + part
    return total


# -- dilated ---------------------------------------------------------------------------


def dilated_forward(x, w, strides, pads: Pads, dilation, groups: int) -> Any:
    """The convolution over ``x`` base-dilated by 2, at twice the stride, kernel dilation
    and padding: output ``i`` reads dilated cell ``2(s i + d k) - 2 lo``, which is input
    cell ``s i + d k - lo``, exactly the reference's."""
    nd = len(strides)
    return lax.conv_general_dilated(
        x, w, tuple(2 * s for s in strides), tuple((2 * lo, 2 * hi) for lo, hi in pads),
        lhs_dilation=(2,) * nd, rhs_dilation=tuple(2 * d for d in dilation),
        dimension_numbers=_DIMS[nd], feature_group_count=groups,
    )  # fmt: skip


def dilated_data_grad(g, x, w, strides, pads: Pads, dilation, groups: int) -> Any:
    """The transpose of :func:`dilated_forward` in ``x``."""
    f = functools.partial(
        dilated_forward, w=w, strides=strides, pads=pads, dilation=dilation, groups=groups
    )
    (gx,) = jax.linear_transpose(f, jax.ShapeDtypeStruct(x.shape, x.dtype))(g)
    return gx


def dilated_weight_grad(g, x, w, strides, pads: Pads, dilation, groups: int) -> Any:
    """The transpose of :func:`dilated_forward` in ``w``."""
    conv = functools.partial(
        dilated_forward, strides=strides, pads=pads, dilation=dilation, groups=groups
    )
    return _transpose_in_w(lambda x, w: conv(x, w), g, x, w)


# -- gemm (im2col) ---------------------------------------------------------------------


def offsets(kernel: Sequence[int]) -> list[tuple[int, ...]]:
    """The kernel offsets in row-major order (the weight's flattening order)."""
    return list(itertools.product(*(range(k) for k in kernel)))


def patches(x: Any, kernel, strides, pads: Pads, dilation, out) -> Any:
    """``[N, out..., K, C]``: the input cells each output position's window reads."""
    n, c = x.shape[0], x.shape[-1]
    zero = jnp.zeros((), x.dtype)
    xp = lax.pad(x, zero, ((0, 0, 0), *((lo, hi, 0) for lo, hi in pads), (0, 0, 0)))
    cells = []
    for off in offsets(kernel):
        start = tuple(o * d for o, d in zip(off, dilation))
        limit = tuple(b + (m - 1) * s + 1 for b, m, s in zip(start, out, strides))
        cells.append(lax.slice(xp, (0, *start, 0), (n, *limit, c), (1, *strides, 1)))
    return jnp.stack(cells, axis=-2)


def col2im(dp: Any, sizes, kernel, strides, pads: Pads, dilation) -> Any:
    """The adjoint of :func:`patches`: ``[N, out..., K, C]`` summed back to ``[N, sizes..., C]``."""
    out = dp.shape[1:-2]
    padded = [n + lo + hi for n, (lo, hi) in zip(sizes, pads)]
    zero = jnp.zeros((), dp.dtype)
    acc = None
    for k, off in enumerate(offsets(kernel)):
        spec = [(0, 0, 0)]
        for o, d, m, s, p in zip(off, dilation, out, strides, padded):
            lo = o * d
            spec.append((lo, p - lo - (m - 1) * s - 1, s - 1))
        piece = lax.pad(dp[..., k, :], zero, (*spec, (0, 0, 0)))
        acc = piece if acc is None else acc + piece
    start = (0, *(lo for lo, _ in pads), 0)
    limit = (dp.shape[0], *(lo + n for n, (lo, _) in zip(sizes, pads)), dp.shape[-1])
    return lax.slice(acc, start, limit)


def gemm_forward(x: Any, w: Any, strides, pads: Pads, dilation, groups: int) -> Any:
    """The convolution ``y [N, out..., O]`` as one GEMM over patches (a batched one per group)."""
    o, *kernel, cg = w.shape
    keff = _spatial.dilated(kernel, dilation)
    out = tuple(
        (n + lo + hi - k) // s + 1 for n, (lo, hi), k, s in zip(x.shape[1:-1], pads, keff, strides)
    )
    p = patches(x, kernel, strides, pads, dilation, out)
    m, k = math.prod(p.shape[:-2]), math.prod(kernel)
    if groups == 1:
        y = jnp.dot(jnp.reshape(p, (m, k * cg)), jnp.reshape(w, (o, k * cg)).T)
    else:
        p4 = jnp.reshape(p, (m, k, groups, cg))
        w4 = jnp.reshape(w, (groups, o // groups, k, cg))
        y = lax.dot_general(p4, w4, (((1, 3), (2, 3)), ((2,), (0,))))  # [G, M, O/G]
        y = jnp.reshape(jnp.transpose(y, (1, 0, 2)), (m, o))
    return jnp.reshape(y, (x.shape[0], *out, o))


def gemm_weight_grad(g: Any, x: Any, w: Any, strides, pads: Pads, dilation, groups: int) -> Any:
    """``dw [O, k..., C/groups]`` as ``dyᵀ @ patches`` (a batched product per group)."""
    kernel = w.shape[1:-1]
    out, o = g.shape[1:-1], g.shape[-1]
    cg = x.shape[-1] // groups
    p = patches(x, kernel, strides, pads, dilation, out)
    m, k = math.prod(p.shape[:-2]), math.prod(kernel)
    if groups == 1:
        # An explicit dyᵀ keeps the product in the row-major form XLA hands to its GEMM.
        dw = jnp.dot(jnp.reshape(g, (m, o)).T, jnp.reshape(p, (m, k * cg)))
    else:
        g3 = jnp.reshape(g, (m, groups, o // groups))
        p4 = jnp.reshape(p, (m, k, groups, cg))
        dw = lax.dot_general(g3, p4, (((0,), (0,)), ((1,), (2,))))  # [G, O/G, K, Cg]
    return jnp.reshape(dw, (o, *kernel, cg))


def gemm_data_grad(g: Any, x: Any, w: Any, strides, pads: Pads, dilation, groups: int) -> Any:
    """``dx``, shaped like ``x``, as ``col2im(dy @ w)`` (a batched product per group)."""
    sizes = x.shape[1:-1]
    o, *kernel, cg = w.shape
    out = g.shape[1:-1]
    m, k = math.prod(out) * g.shape[0], math.prod(kernel)
    if groups == 1:
        dp = jnp.dot(jnp.reshape(g, (m, o)), jnp.reshape(w, (o, k * cg)))
    else:
        g3 = jnp.reshape(g, (m, groups, o // groups))
        w4 = jnp.reshape(w, (groups, o // groups, k, cg))
        dp = lax.dot_general(g3, w4, (((2,), (1,)), ((1,), (0,))))  # [G, M, K, Cg]
        dp = jnp.transpose(dp, (1, 2, 0, 3))
    dp = jnp.reshape(dp, (g.shape[0], *out, k, cg * groups))
    return col2im(dp, sizes, kernel, strides, pads, dilation)
