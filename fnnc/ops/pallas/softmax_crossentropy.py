"""Pallas ``softmax_crossentropy``: loss and softmax in one pass pair over the classes.

The scores are viewed as ``[R, C]`` rows. One program owns ``bm`` rows and walks the
class axis in power-of-two blocks of ``bc`` lanes (a 32k vocabulary never sits in
registers at once). ``C`` need not be a multiple of ``bc`` (1001 classes): the last
block is masked, its missing scores read as ``-inf`` (no mass in the logsumexp) and
its missing targets as 0, and nothing is stored past ``C``. Statistics are float32
for every input dtype (16-bit scores are widened on load, results rounded on store):

1. an online logsumexp: the running max ``m`` and ``s = sum exp(x - m)``, rescaled when
   ``m`` grows;
2. a second walk writes the softmax ``exp(x - m) / s`` and sums ``t * (x - m)`` and
   ``t``, so the loss is assembled exactly as the reference does
   (``-sum(t z) + m (1 - sum t) + log s``).

Targets are never materialised for class-index labels: a block compares its column
indices with the row's label. The backward kernel computes NNC's
``g_loss (p - t) + p (g_p - sum(g_p p))`` from the softmax and the label only (the
command's ``backward_uses``), walking the classes once (twice when ``g_p`` is given).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from fnnc.core.command import Command, Spec
from fnnc.ops.loss import class_index
from fnnc.ops.loss import softmax_crossentropy as _command
from fnnc.ops.pallas import _derivatives
from fnnc.ops.pallas._common import (
    FLOATS,
    float_reason,
    lane_block,
    launch,
    load,
    row_block,
    span,
    steps,
    store,
)

NAME = "softmax_crossentropy"
CLASS_BLOCK = 1024
"""Most classes one program touches per step."""

softmax_crossentropy_reference = _command.definition.forward
"""The command's reference forward (the ``"xla"`` backend), which the kernel matches."""


def supports(cmd: Command, specs: Sequence[Spec]) -> str | None:
    """``None`` when the kernel runs these inputs, else the reason (see module doc)."""
    x = specs[0]
    why = float_reason(NAME, x)
    if why is not None:
        return why
    if x.ndim < 1 or math.prod(x.shape[:-1]) == 0:
        return f"{NAME}: scores {list(x.shape)} have no rows"
    if x.shape[-1] == 0:
        return f"{NAME}: scores {list(x.shape)} have no classes"
    return None


def _is_target(label: Any, x_shape: Sequence[int]) -> bool:
    return jnp.issubdtype(label.dtype, jnp.floating) and tuple(label.shape) == tuple(x_shape)


def _prepare(x_shape: Sequence[int], label: Any, dtype: Any = None) -> tuple[Any, bool]:
    """The label as kernel input: targets ``[R, C]`` or class indices ``[R, 1]`` int32.

    Targets are cast to ``dtype``; ``None`` (the forward) keeps a kernel float type and
    takes float32 otherwise, as the reference reads them in its float32 arithmetic:
    rounding float32 targets to 16-bit scores' type moved the loss (1/3 in bfloat16 is
    0.33398)."""
    rows, c = math.prod(x_shape[:-1]), x_shape[-1]
    if _is_target(label, x_shape):
        if dtype is None:
            dtype = label.dtype if np.dtype(label.dtype) in FLOATS else jnp.float32
        return jnp.reshape(label.astype(dtype), (rows, c)), True
    label = class_index(label)  # NNC: (int)(label + 0.5), in float32 at least
    return jnp.reshape(label.astype(jnp.int32), (rows, 1)), False


def _cols(j: Any, bm: int, bc: int, c: int) -> tuple[Any, Any]:
    """Class block ``j``'s index and its mask (``None`` when ``C`` splits evenly)."""
    return (slice(None), pl.ds(j * bc, bc)), span(j * bc, bc, c, (bm, bc), 1)


def _blk(ref: Any, j: Any, bc: int, c: int, other: float = 0.0) -> Any:
    """Class block ``j`` of ``ref`` in float32, lanes past ``C`` read as ``other``."""
    idx, mask = _cols(j, ref.shape[0], bc, c)
    return load(ref, idx, mask, other).astype(jnp.float32)


def _targets(t_ref: Any, j: Any, bm: int, bc: int, c: int, dense: bool, trims: Any) -> Any:
    """Targets of class block ``j`` (0 past ``C``): loaded, or built from class indices."""
    if dense:
        return _blk(t_ref, j, bc, c)
    cols = j * bc + lax.broadcasted_iota(jnp.int32, (bm, bc), 1)
    t = jnp.where(cols == t_ref[...], trims[1], trims[0]).astype(jnp.float32)
    mask = span(j * bc, bc, c, (bm, bc), 1)
    return t if mask is None else jnp.where(mask, t, 0.0)


def _forward_kernel(x_ref, t_ref, loss_ref, p_ref, *, bc, dense, trims):
    bm, c = x_ref.shape
    n = steps(c, bc)

    def stats(j, carry):
        m, s = carry
        x = _blk(x_ref, j, bc, c, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(x, axis=1, keepdims=True))
        # A row with only -inf so far (a masked block) shifts by 0: -inf - -inf is NaN.
        shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        s = s * jnp.exp(m - shift) + jnp.sum(jnp.exp(x - shift), axis=1, keepdims=True)
        return m_new, s

    init = (jnp.full((bm, 1), -jnp.inf, jnp.float32), jnp.zeros((bm, 1), jnp.float32))
    m, s = lax.fori_loop(0, n, stats, init)

    def write(j, carry):
        tz, t_sum = carry
        idx, mask = _cols(j, bm, bc, c)
        z = _blk(x_ref, j, bc, c) - m
        store(p_ref, idx, jnp.exp(z) / s, mask)
        t = _targets(t_ref, j, bm, bc, c, dense, trims)
        tz = tz + jnp.sum(jnp.where(t == 0, 0.0, t * z), axis=1, keepdims=True)  # 0 at -inf
        return tz, t_sum + jnp.sum(t, axis=1, keepdims=True)

    zero = jnp.zeros((bm, 1), jnp.float32)
    tz, t_sum = lax.fori_loop(0, n, write, (zero, zero))
    loss_ref[...] = (-tz + m * (1 - t_sum) + jnp.log(s)).astype(loss_ref.dtype)


def _blocks(rows: int, c: int) -> tuple[int, int]:
    bc = lane_block(c, CLASS_BLOCK)
    return row_block(rows, bc), bc


def _forward(x: Any, t: Any, dense: bool, trims: tuple[float, float]) -> tuple[Any, Any]:
    rows, c = x.shape
    bm, bc = _blocks(rows, c)
    row = lambda i: (i, 0)
    return launch(
        functools.partial(_forward_kernel, bc=bc, dense=dense, trims=trims),
        grid=(rows // bm,),
        in_specs=[pl.BlockSpec((bm, c), row), pl.BlockSpec((bm, t.shape[1]), row)],
        out_specs=[pl.BlockSpec((bm, 1), row), pl.BlockSpec((bm, c), row)],
        out_shape=[Spec((rows, 1), x.dtype), Spec((rows, c), x.dtype)],
        name="fnnc_softmax_crossentropy",
    )(x, t)


def _grad_kernel(*refs, bc, dense, trims, has_gl, has_gp):
    it = iter(refs)
    gl_ref = next(it) if has_gl else None
    gp_ref = next(it) if has_gp else None
    t_ref, p_ref, gx_ref = next(it), next(it), next(it)
    bm, c = p_ref.shape
    blk = lambda ref, j: _blk(ref, j, bc, c)
    r = jnp.zeros((bm, 1), jnp.float32)
    if has_gp:
        dot = lambda j, acc: acc + jnp.sum(blk(gp_ref, j) * blk(p_ref, j), axis=1, keepdims=True)
        r = lax.fori_loop(0, steps(c, bc), dot, r)

    def write(j, carry):
        p = blk(p_ref, j)
        gx = jnp.zeros_like(p)
        if has_gl:
            gx = gx + gl_ref[...].astype(jnp.float32) * (
                p - _targets(t_ref, j, bm, bc, c, dense, trims)
            )
        if has_gp:
            gx = gx + p * (blk(gp_ref, j) - r)
        idx, mask = _cols(j, bm, bc, c)
        store(gx_ref, idx, gx, mask)
        return carry

    lax.fori_loop(0, steps(c, bc), write, 0)


def _grad(g_loss: Any, g_p: Any, t: Any, p: Any, dense: bool, trims: tuple[float, float]) -> Any:
    """``d loss / d x`` from the output gradients (either may be ``None``), targets, softmax."""
    rows, c = p.shape
    bm, bc = _blocks(rows, c)
    row = lambda i: (i, 0)
    args, specs = [], []
    if g_loss is not None:
        args.append(g_loss.astype(p.dtype))
        specs.append(pl.BlockSpec((bm, 1), row))
    if g_p is not None:
        args.append(g_p.astype(p.dtype))
        specs.append(pl.BlockSpec((bm, c), row))
    kernel = functools.partial(
        _grad_kernel,
        bc=bc,
        dense=dense,
        trims=trims,
        has_gl=g_loss is not None,
        has_gp=g_p is not None,
    )
    return launch(
        kernel,
        grid=(rows // bm,),
        in_specs=[*specs, pl.BlockSpec((bm, t.shape[1]), row), pl.BlockSpec((bm, c), row)],
        out_specs=pl.BlockSpec((bm, c), row),
        out_shape=Spec((rows, c), p.dtype),
        name="fnnc_softmax_crossentropy_backward",
    )(*args, t, p)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _fused(x: Any, t: Any, dense: bool, trims: tuple[float, float]) -> tuple[Any, Any]:
    return _forward(x, t, dense, trims)


def _fused_fwd(x, t, dense, trims):
    loss, p = _forward(x, t, dense, trims)
    return (loss, p), (t, p)


def _fused_bwd(dense, trims, residuals, cts):
    t, p = residuals
    g_loss, g_p = cts
    # The label gets no gradient, as in the command's backward.
    return _grad(g_loss, g_p, t, p, dense, trims), None


def _fused_reference(x, t, dense, trims):
    """The reference on the kernel's operands (class indices came as ``[R, 1]``)."""
    label = t if dense else t[:, 0]
    return tuple(_command.definition.forward(x, label, trim0=trims[0], trim1=trims[1]))


_derivatives.defvjp(_fused, _fused_fwd, _fused_bwd, _fused_reference)


def softmax_crossentropy(x: Any, label: Any, *, trim0: float = 0.0, trim1: float = 1.0) -> Any:
    """The kernel backend: same signature and results as the reference."""
    t, dense = _prepare(x.shape, label)
    rows, c = math.prod(x.shape[:-1]), x.shape[-1]
    loss, p = _fused(jnp.reshape(x, (rows, c)), t, dense, (float(trim0), float(trim1)))
    return jnp.reshape(loss, (*x.shape[:-1], 1)), jnp.reshape(p, x.shape)


def backward(
    grads: Sequence[Any],
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    wants: Sequence[int],
    *,
    trim0: float,
    trim1: float,
) -> tuple[Any, ...]:
    """The command's backward (NNC convention) as a kernel: reads ``label`` and ``p``."""
    (g_loss, g_p), (_, label), (_, p) = grads, inputs, outputs
    shape = tuple(p.shape)
    rows, c = math.prod(shape[:-1]), shape[-1]
    t, dense = _prepare(shape, label, p.dtype)
    flat = lambda g, n: None if g is None else jnp.reshape(g, (rows, n))
    gx = _grad(flat(g_loss, 1), flat(g_p, c), t, jnp.reshape(p, (rows, c)), dense, (trim0, trim1))
    return jnp.reshape(gx, shape), None
