"""linear_softmax_crossentropy_mean: the mean softmax cross-entropy of a dense layer's
logits, with its gradient made while the logits are at hand, so a training step runs
the ``[N, D] x [D, V]`` product three times instead of four.

:mod:`fnnc.ops.linear_crossentropy` keeps each row's logsumexp only and recomputes
every block of logits in its backward: one product in the forward, three in the
backward (the logits again, then ``dx`` and ``dw``). At issue 24's language model (16 x
1024 tokens, width 1024, 32768 classes) that extra product is 1.1 of the step's 9.1
TFLOP, about the time fnnc's step trailed ``torch.compile``'s by on an H200, which keeps
the whole logits instead (and three times fnnc's peak memory).

A training loss is a mean over rows, so the cotangent reaching each row's loss is one
scalar ``g / N`` and the gradients are ``g`` times tensors fixed by the forward. This
command computes those while each block's logits exist::

    mean, gx, gw, gb = linear_softmax_crossentropy_mean()(x, w, label, bias)
    # mean == reduce_mean(linear_softmax_crossentropy()(x, w, label, bias)[0]), kept dims
    # gx, gw, gb == d mean / d (x, w, bias), float32

Rows are walked in blocks of ``row_chunk``; a block's logits cover the whole vocabulary
(``[row_chunk, V]``, emitted in the inputs' dtype as the gemm command emits them and
widened to float32 for the softmax; the fusing pass picks 256 MiB of them in the
inputs' dtype, 4096 x 32768 in bfloat16 where the full logits of that step are 1 GiB),
which gives the block's losses, its softmax and
``(softmax - t) / N``, rounded to the gemm's dtype as the unfused pair's backward rounds
it; two products turn that into the block's rows of ``gx`` and its share of ``gw``
(float32 accumulation). The ragged last block starts at ``N - row_chunk`` and zeroes the
rows an earlier block had. float16 inputs multiply those in float32: ``(softmax - t) /
N`` is below float16's range at a language model's sizes (the unfused pair's backward is
lifted by its loss scale).

The backward (NNC's convention) scales ``gx``, ``gw`` and ``gb`` by the mean's
cotangent: no product at all. The gradient outputs are residuals, constants to
differentiation (as NNC's saved batch statistics are): a second derivative through this
command is not computed. Where no backward follows (inference) the two extra products
are waste, so :func:`fnnc.graph.passes.fuse_linear_crossentropy_mean` uses this command
in training graphs only (``Model.fit``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import Spec, Uses, defcommand
from fnnc.errors import CommandError
from fnnc.ops.linear_crossentropy import (
    _block_logits,
    _fresh,
    _indices,
    _shape,
    _start,
    result_dtype,
)

NAME = "linear_softmax_crossentropy_mean"
ROW_CHUNK = 2048
"""Default rows per block: ``[2048, 32768]`` float32 logits are 256 MiB."""


def _mean_shape(x, w, label, bias=None, *, trim0, trim1, row_chunk):
    if not isinstance(row_chunk, int) or row_chunk < 1:
        raise CommandError(f"{NAME}: row_chunk={row_chunk!r} must be a positive int")
    (loss, _) = _shape(
        x, w, label, bias, trim0=trim0, trim1=trim1, row_chunk=row_chunk, class_chunk=1
    )
    acc = loss.dtype
    return (
        Spec((1,) * len(loss.shape), acc),
        Spec(tuple(x.shape), acc),
        Spec(tuple(w.shape), acc),
        Spec((w.shape[0],), acc),
    )


@defcommand(family="loss", shape=_mean_shape, uses=Uses(inputs=None, outputs=(1, 2, 3)))
def linear_softmax_crossentropy_mean(
    x, w, label, bias=None, *, trim0=0.0, trim1=1.0, row_chunk=ROW_CHUNK
):
    """The mean over rows of the softmax cross-entropy of ``x wᵀ + bias`` to ``label``,
    and its gradients: ``(mean, gx, gw, gb)``. ``mean`` has the loss's dims, all 1
    (``reduce_mean``'s kept dims); ``gx``, ``gw``, ``gb`` are ``d mean / d x``, ``/ d w``,
    ``/ d bias`` in float32 (``gb`` too where no bias is given). Layouts, labels and
    trims are :func:`~fnnc.ops.linear_softmax_crossentropy`'s; see the module docstring.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> x, w = jnp.ones((4, 8)), jnp.zeros((1000, 8))
    >>> mean, gx, gw, gb = ops.linear_softmax_crossentropy_mean(row_chunk=3)(
    ...     x, w, jnp.arange(4))
    >>> mean.shape, float(mean[0, 0])  # uniform logits: log(1000)
    ((1, 1), 6.907755374908447)
    >>> round(float(gb[0]), 6)  # class 0, the label of row 0: (4 * 0.001 - 1) / 4
    -0.249
    """
    return _residual(x, w, label, bias, (trim0, trim1, row_chunk))


def _forward(x, w, label, bias, trim0, trim1, row_chunk):
    lead, (v, d) = x.shape[:-1], w.shape
    n = int(np.prod(lead, dtype=np.int64))
    acc = result_dtype(x.dtype)
    keep = (1,) * (len(lead) + 1)
    gx, gw, gb = jnp.zeros((n, d), acc), jnp.zeros((v, d), acc), jnp.zeros((v,), acc)
    if n == 0:  # the mean of no rows, as reduce_mean gives it
        return jnp.full(keep, jnp.nan, acc), jnp.reshape(gx, x.shape), gw, gb
    x2, labels, cr = jnp.reshape(x, (n, d)), _indices(label, n), min(row_chunk, n)
    cols = lax.iota(jnp.int32, v)[None, :]
    # (softmax - t) / N is tiny: float16 flushes it toward zero where the unfused pair's
    # backward, lifted by a loss scale, keeps it. bfloat16 has float32's range.
    grad_dtype = acc if x.dtype == jnp.float16 else x.dtype
    wg = w.astype(grad_dtype)
    mm = lambda a, b, c: lax.dot_general(a, b, (c, ((), ())), preferred_element_type=acc)

    def body(i, carry):
        total, gx, gw, gb = carry
        r0 = _start(i, cr, n)
        xr = lax.dynamic_slice_in_dim(x2, r0, cr, 0)
        lr = lax.dynamic_slice_in_dim(labels, r0, cr, 0)
        fresh = _fresh(r0, i, cr)
        z = _block_logits(xr, w, bias, 0, v)
        lse = jax.nn.logsumexp(z, axis=1)
        hit = cols == lr[:, None]
        # loss = lse - sum(t * logits), t = trim1 at the label and trim0 elsewhere.
        picked = jnp.sum(jnp.where(hit, z, 0.0), axis=1)
        loss = lse - (trim1 - trim0) * picked
        if trim0:
            loss = loss - trim0 * jnp.sum(z, axis=1)
        total = total + jnp.sum(jnp.where(fresh, loss, 0.0))
        t = jnp.where(hit, acc.type(trim1), acc.type(trim0))
        dz = (jnp.exp(z - lse[:, None]) - t) * acc.type(1.0 / n)
        # The gemm's backward reads the logits' gradient in the gemm's dtype.
        dz = jnp.where(fresh[:, None], dz, 0.0).astype(grad_dtype)
        grown = lax.dynamic_slice_in_dim(gx, r0, cr, 0) + mm(dz, wg, ((1,), (0,)))
        gx = lax.dynamic_update_slice_in_dim(gx, grown, r0, 0)
        xr = xr.astype(grad_dtype)
        # The bias's gradient as a product too: XLA:CPU's column sum of a [rows, V] block
        # took as long as the three products together.
        ones = jnp.ones((cr,), dz.dtype)
        return total, gx, gw + mm(dz, xr, ((0,), (0,))), gb + mm(ones, dz, ((0,), (0,)))

    init = (jnp.zeros((), acc), gx, gw, gb)
    total, gx, gw, gb = lax.fori_loop(0, -(-n // cr), body, init)
    return jnp.reshape(total / n, keep), jnp.reshape(gx, x.shape), gw, gb


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _residual(x, w, label, bias, params):
    """The forward, whose ``jax.vjp`` scales its gradient outputs (no product)."""
    return _forward(x, w, label, bias, *params)


def _residual_fwd(x, w, label, bias, params):
    out = _forward(x, w, label, bias, *params)
    return out, (x, w, label, bias, out)


def _residual_bwd(params, residuals, cotangents):
    x, w, label, bias, out = residuals
    grads = _backward(cotangents, (x, w, label, *([] if bias is None else [bias])), out)
    floats = jnp.issubdtype(label.dtype, jnp.inexact)
    dlabel = (
        jnp.zeros(label.shape, label.dtype) if floats else np.zeros(label.shape, jax.dtypes.float0)
    )
    return (grads[0], grads[1], dlabel, grads[3] if bias is not None else None)


_residual.defvjp(_residual_fwd, _residual_bwd)


@linear_softmax_crossentropy_mean.backward
def _backward(grads, inputs, outputs, **_params):
    """``g * (gx, gw, gb)``, ``g`` the mean's cotangent (its one element)."""
    g_mean = grads[0]
    x, w, _label, *rest = inputs
    bias = rest[0] if rest else None
    _, gx, gw, gb = outputs
    if g_mean is None:
        dx, dw = jnp.zeros(x.shape, x.dtype), jnp.zeros(w.shape, w.dtype)
        db = None if bias is None else jnp.zeros(bias.shape, bias.dtype)
    else:
        g = jnp.sum(g_mean).astype(gx.dtype)
        dx, dw = (g * gx).astype(x.dtype), (g * gw).astype(w.dtype)
        db = None if bias is None else (g * gb).astype(bias.dtype)
    result = (dx, dw, None)
    return result if bias is None else (*result, db)
