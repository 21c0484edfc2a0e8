"""Vision family: grid_sample, roi_align and nms (NNC's GRID_SAMPLE, ROI_ALIGN, NMS).

Data is NHWC, as everywhere in fnnc. Each follows its ``lib/nnc/cmd/<family>`` CPU
reference in liuliu/ccv:

* ``grid_sample(a [N, H, W, C], grid [N, Ho, Wo, 2])`` (or one image, ``[H, W, C]``
  and ``[Ho, Wo, 2]``): bilinear sampling at ``grid``'s ``(x, y)`` in ``[-1, 1]``
  (``align_corners`` maps -1 and 1 to the corner pixels' centres, otherwise to the
  outer edges), zeros outside the image. NNC's
  backward gives ``a`` a gradient; fnnc differentiates ``grid`` too (spatial
  transformers learn it), from ``jax.vjp`` of the reference.
* ``roi_align(a [N, H, W, C] or [H, W, C], boxes [B, 4] or [4])``: each box
  ``(x, y, w, h)``, relative to the image size, is split into ``size = (rows, cols)``
  bins (one int: square) of ``ceil(h / rows) x ceil(w / cols)`` bilinear samples,
  edge-clamped, averaged over the samples that fall inside the image; box ``n`` reads
  image ``n % N``. The sample count depends on the box, so fnnc samples up to
  ``ceil(2 H / rows)`` rows (and columns) per bin: boxes up to twice the image match
  NNC exactly. Backward as NNC's: the gradient of ``a`` only (the boxes get none). No
  boxes (``[0, 4]``) give no outputs.

grid_sample and roi_align compute in float32 at least
(:func:`~fnnc.core.dtypes.at_least_float32`) and round their outputs and gradients to
the input type once: their image gradients add every sample's share into the few
pixels it read, and 4096 bfloat16 shares of 0.1 into one pixel had stopped at 8.
* ``nms(a [M, D] or [N, M, D])``: rows ``(score, x, y, w, h, ...)`` sorted by score,
  greedily dropping a row whose IoU with a kept higher-scoring row is at least
  ``iou_threshold``. Outputs the kept rows first (the rest keep their sorted data
  with score ``-FLT_MAX``) and their source indices (``-1`` past the kept ones).
  Backward as NNC's: each kept row's gradient goes back to its source row.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import Spec, Uses, defcommand
from fnnc.core.dtypes import at_least_float32
from fnnc.errors import CommandError
from fnnc.ops._rules import fail, require_float, require_ints, require_same_dtype, show

FLT_MAX = float(np.finfo(np.float32).max)


def _grid_sample_shape(a, grid, *, align_corners):
    name = "grid_sample"
    require_float(name, a, grid)
    require_same_dtype(name, a, grid)
    if (
        a.ndim not in (3, 4)
        or grid.ndim != a.ndim
        or grid.shape[-1] != 2
        or (a.ndim == 4 and grid.shape[0] != a.shape[0])
    ):
        fail(
            f"{name}: a must be NHWC [N, H, W, C] and grid [N, Ho, Wo, 2] with the same N "
            f"(or one image, [H, W, C] and [Ho, Wo, 2]); got {show(a)}, {show(grid)}"
        )
    return Spec((*grid.shape[:-1], a.shape[-1]), a.dtype)


@defcommand(family="grid_sample", shape=_grid_sample_shape)
def grid_sample(a, grid, *, align_corners=False):
    """Bilinear sampling of ``a`` at ``grid`` (normalized ``(x, y)``), zeros outside.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> a = jnp.arange(4.0).reshape(1, 2, 2, 1)
    >>> ops.grid_sample(align_corners=True)(a, jnp.zeros((1, 1, 1, 2)))[0, 0, 0, 0]
    Array(1.5, dtype=float32)
    """
    if a.ndim == 3:  # one image without a batch axis, as NNC's kernel takes it
        return grid_sample.definition.forward(a[None], grid[None], align_corners=align_corners)[0]
    # Widened here, so jax.vjp of this (the derived backward) also adds the image
    # gradient's shares in float32 and rounds once.
    dtype, wide = a.dtype, at_least_float32(a.dtype)
    a, grid = a.astype(wide), grid.astype(wide)
    n, h, w, c = a.shape
    gx, gy = grid[..., 0], grid[..., 1]
    if align_corners:
        ix, iy = (gx + 1) * (w - 1) * 0.5, (gy + 1) * (h - 1) * 0.5
    else:
        ix, iy = ((gx + 1) * w - 1) * 0.5, ((gy + 1) * h - 1) * 0.5
    x0, y0 = jnp.floor(ix), jnp.floor(iy)
    wx1, wy1 = ix - x0, iy - y0
    x0, y0 = x0.astype(jnp.int32), y0.astype(jnp.int32)
    flat = jnp.reshape(a, (n, h * w, c))

    def tap(yy, xx):
        inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        # Sizes spelled out: -1 cannot be inferred for a batch of no images.
        at = jnp.reshape(
            jnp.clip(yy, 0, h - 1) * w + jnp.clip(xx, 0, w - 1), (n, math.prod(yy.shape[1:]))
        )
        v = jnp.take_along_axis(flat, at[..., None], axis=1).reshape((*yy.shape, c))
        return jnp.where(inside[..., None], v, jnp.zeros((), a.dtype))

    out = (
        tap(y0, x0) * ((1 - wy1) * (1 - wx1))[..., None]
        + tap(y0, x0 + 1) * ((1 - wy1) * wx1)[..., None]
        + tap(y0 + 1, x0) * (wy1 * (1 - wx1))[..., None]
        + tap(y0 + 1, x0 + 1) * (wy1 * wx1)[..., None]
    )
    return out.astype(dtype)


def _roi_align_shape(a, boxes, *, size):
    name = "roi_align"
    require_float(name, a, boxes)
    require_same_dtype(name, a, boxes)
    if a.ndim not in (3, 4) or boxes.ndim not in (1, 2) or boxes.shape[-1] != 4:
        fail(
            f"{name}: a must be [N, H, W, C] or [H, W, C] and boxes [B, 4] or [4] (x, y, w, h); "
            f"got {show(a)}, {show(boxes)}"
        )
    rows, cols = _pool_size(size)
    if a.ndim == 3 and boxes.ndim == 1:
        return Spec((rows, cols, a.shape[2]), a.dtype)
    n_a, n_b = a.shape[0] if a.ndim == 4 else 1, boxes.shape[0] if boxes.ndim == 2 else 1
    if n_a == 0 and n_b:
        fail(
            f"{name}: a {show(a)} holds no images for the boxes {show(boxes)} to read (box n "
            "reads image n % N); give at least one image, or no boxes"
        )
    return Spec((_roi_count(n_a, n_b), rows, cols, a.shape[-1]), a.dtype)


def _pool_size(size) -> tuple[int, int]:
    """``size = (rows, cols)`` (one int for both) as ints, each at least 1 (NNC's
    ``ccv_max(size, 1)``): ``size=2`` had failed inside the rule on ``2[0]`` and
    ``(1.5, 2)`` was truncated to ``(1, 2)``."""
    pair = require_ints("roi_align", "size", size)
    pair = (pair, pair) if isinstance(pair, int) else pair
    if len(pair) != 2:
        raise CommandError(f"roi_align: size must be (rows, cols), two ints, got {size!r}")
    return max(pair[0], 1), max(pair[1], 1)


def _roi_count(n_a: int, n_b: int) -> int:
    """NNC's output count ``max(N, B)``; no boxes give no outputs (where NNC's
    ``n % B`` divides by zero)."""
    return 0 if n_b == 0 else max(n_a, n_b)


def _roi_weights(start, extent, length: int, pool: int):
    """``[B, pool, length]`` weights of NNC's bin averages along one axis (separable)."""
    samples = 2 * math.ceil(length / pool)
    bins = jnp.ceil(extent / pool)  # [B]
    scale = extent / jnp.maximum(bins * pool, 1)
    s = jnp.arange(samples, dtype=extent.dtype)[None, None, :]
    i = jnp.arange(pool, dtype=extent.dtype)[None, :, None]
    bins3, start3, scale3 = bins[:, None, None], start[:, None, None], scale[:, None, None]
    pos = start3 + (s + i * bins3 + 0.5) * scale3 - 0.5  # [B, pool, samples]
    lo = jnp.floor(pos)
    r = pos - lo
    use = (s < bins3) & (lo + 1 >= 0) & (lo <= length - 1)
    lo = lo.astype(jnp.int32)
    grid = jnp.arange(length)[None, None, None, :]
    hit0 = (jnp.clip(lo, 0, length - 1)[..., None] == grid).astype(extent.dtype)
    hit1 = (jnp.clip(lo + 1, 0, length - 1)[..., None] == grid).astype(extent.dtype)
    taps = hit0 * (1 - r)[..., None] + hit1 * r[..., None]
    taps = jnp.where(use[..., None], taps, jnp.zeros((), extent.dtype))
    count = jnp.sum(use, axis=-1).astype(extent.dtype)  # [B, pool]
    return jnp.sum(taps, axis=2) / jnp.maximum(count, 1)[..., None]


@defcommand(family="roi", shape=_roi_align_shape, uses=Uses(inputs=(1,)))
def roi_align(a, boxes, *, size=(1, 1)):
    """Average of bilinear samples per bin of each box (see the module docstring).

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> a = jnp.arange(16.0).reshape(4, 4, 1)
    >>> ops.roi_align(size=(1, 1))(a, jnp.array([0.0, 0.0, 1.0, 1.0]))[0, 0, 0]
    Array(7.5, dtype=float32)
    """
    dtype = a.dtype
    return _roi_align_wide(a, boxes, size).astype(dtype)


def _roi_align_wide(a, boxes, size):
    """roi_align in :func:`~fnnc.core.dtypes.at_least_float32` of ``a``'s type (sample
    positions too: bfloat16 rounds pixel 200.5 to 200), not rounded back."""
    wide = at_least_float32(a.dtype)
    a, boxes = a.astype(wide), boxes.astype(wide)
    unbatched = a.ndim == 3 and boxes.ndim == 1
    images = a[None] if a.ndim == 3 else a
    bx = boxes[None] if boxes.ndim == 1 else boxes
    n_a, h, w, _ = images.shape
    rows, cols = _pool_size(size)
    n = _roi_count(n_a, bx.shape[0])
    if n == 0:  # no boxes: nothing to gather (jnp.take of an empty axis raises)
        out = jnp.zeros((0, rows, cols, images.shape[-1]), wide)
        return out[0] if unbatched else out
    bx = jnp.take(bx, jnp.arange(n) % bx.shape[0], axis=0)
    wy = _roi_weights(bx[:, 1] * h, bx[:, 3] * h, h, rows)
    wx = _roi_weights(bx[:, 0] * w, bx[:, 2] * w, w, cols)
    src = jnp.take(images, jnp.arange(n) % n_a, axis=0)
    out = jnp.einsum("nph,nqw,nhwc->npqc", wy, wx, src)
    return out[0] if unbatched else out


@roi_align.backward
def _roi_align_backward(grads, inputs, outputs, *, size):
    (g,), (a, boxes) = grads, inputs
    # Transposed in float32 at least: the gradient of images that many boxes read
    # (box n reads image n % N) is a sum over those boxes, and in bfloat16 1024 shares
    # of 0.0062 had stopped at 2.0 (want 6.4).
    wide = at_least_float32(a.dtype)
    spec = jax.ShapeDtypeStruct(a.shape, wide)
    (ga,) = jax.linear_transpose(lambda x: _roi_align_wide(x, boxes, size), spec)(g.astype(wide))
    return ga.astype(a.dtype), None


def _nms_shape(a, *, iou_threshold):
    require_float("nms", a)
    if a.ndim not in (2, 3) or a.shape[-1] < 5:
        fail(
            f"nms: a {show(a)} must be [M, D] or [N, M, D] with rows (score, x, y, w, h, ...), "
            "D >= 5"
        )
    return Spec(tuple(a.shape), a.dtype), Spec(tuple(a.shape[:-1]), np.int32)


def _nms_one(a, threshold):
    m = a.shape[0]
    if m == 0:  # no rows to keep: the gathers below would index an empty axis
        return a, jnp.zeros((0,), jnp.int32)
    order = jnp.argsort(-a[:, 0], stable=True)
    b = a[order]
    x, y, w, h = b[:, 1], b[:, 2], b[:, 3], b[:, 4]
    xd = jnp.maximum(
        0, jnp.minimum((x + w)[:, None], (x + w)[None]) - jnp.maximum(x[:, None], x[None])
    )
    yd = jnp.maximum(
        0, jnp.minimum((y + h)[:, None], (y + h)[None]) - jnp.maximum(y[:, None], y[None])
    )
    inter = xd * yd
    area = w * h
    iou = inter / (area[:, None] + area[None] - inter)
    later = jnp.arange(m)[None] > jnp.arange(m)[:, None]
    hits = (iou >= threshold) & later

    def step(i, dropped):
        return jnp.where(dropped[i], dropped, dropped | hits[i])

    dropped = lax.fori_loop(0, m, step, b[:, 0] == -FLT_MAX)
    kept = jnp.sum(~dropped)
    pick = jnp.argsort(dropped, stable=True)  # kept rows first, in score order
    rows = jnp.arange(m)
    front = rows < kept
    # Past the kept rows NNC leaves the sorted rows in place with score -FLT_MAX:
    # padding, which passes no gradient.
    tail = lax.stop_gradient(b.at[:, 0].set(-FLT_MAX))
    out = jnp.where(front[:, None], b[pick], tail)
    return out, jnp.where(front, order[pick], -1).astype(jnp.int32)


@defcommand(family="nms", shape=_nms_shape, uses=Uses(inputs=(), outputs=(1,)))
def nms(a, *, iou_threshold=0.5):
    """Non-maximum suppression of ``(score, x, y, w, h, ...)`` rows (see module docstring).

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> a = jnp.array([[1.0, 0, 0, 2, 2], [2.0, 0, 0, 2, 2], [0.5, 5, 5, 1, 1]])
    >>> ops.nms(iou_threshold=0.5)(a)[1]
    Array([ 1,  2, -1], dtype=int32)
    """
    if a.ndim == 2:
        return _nms_one(a, iou_threshold)
    return jax.vmap(lambda x: _nms_one(x, iou_threshold))(a)


@nms.backward
def _nms_backward(grads, inputs, outputs, *, iou_threshold):
    g, (a,), idx = grads[0], inputs, outputs[1]
    if g is None:
        return (jnp.zeros(a.shape, a.dtype),)

    def one(g, idx):
        rows = jnp.where(idx >= 0, idx, idx.shape[0])  # -1 -> out of range: dropped
        return jnp.zeros(g.shape, g.dtype).at[rows].add(g, mode="drop")

    return (one(g, idx) if g.ndim == 2 else jax.vmap(one)(g, idx),)
