"""linear_softmax_crossentropy: a dense layer's logits and their softmax cross-entropy,
computed in chunks so the ``[N, V]`` logits never exist at once.

A language model's last layer projects ``N`` hidden rows of width ``D`` onto a
vocabulary of ``V`` classes and the loss reads those logits once: for 16 x 1024 tokens
and 32768 classes they are 1 GiB in bfloat16, plus their float32 softmax and gradient.
This command is ``gemm(transpose_b=True)`` followed by ``softmax_crossentropy``'s loss,
exactly::

    loss, lse = linear_softmax_crossentropy()(x, w, label, bias)
    # == softmax_crossentropy()(float32(gemm(transpose_b=True)(x, w, bias)), label)[0]
    # (16-bit inputs: up to the roundings XLA may skip, see _block_logits)

with ``x [..., D]``, ``w [V, D]`` (NNC's dense layout), ``label`` class indices shaped
``[...]`` or ``[..., 1]`` (or ``[N]`` for ``x [N, 1, ..., 1, D]``, NNC's batch-first rule,
as the pair takes them; integers, or floats rounded as NNC does; NNC's label smoothing
``trim0``, ``trim1`` applies; an index outside ``[0, V)`` hits no class, as in the pair)
and an optional ``bias [V]``. The outputs are
the per-row loss ``[..., 1]`` and the row's logsumexp ``[..., 1]`` (the backward's
residual; ``softmax = exp(logits - lse)``), both float32 for 16-bit inputs. Per-class
float targets are not taken: they are ``[N, V]`` themselves (use the pair of commands).

How: rows are walked in blocks of ``row_chunk`` and, inside each, the classes in blocks
of ``class_chunk``; a block's logits are one ``[row_chunk, D] x [D, class_chunk]``
product in the inputs' dtype with the bias added in that dtype, as the ``gemm`` command
computes a dense layer (float32 accumulation, rounded once), folded into an online
logsumexp (running max and rescaled sum) and the picked label logit. Ragged sizes need
no padding: the last block starts at ``n - chunk`` and masks the rows or classes an
earlier block already covered. The hand-written backward (NNC's convention) recomputes
each block's logits from ``x`` and ``w``, forms ``g_loss (softmax - t) + g_lse softmax``
there, and accumulates ``dx``, ``dw`` and ``db`` in float32, so it holds one block at a
time too. The price is one more ``[N, D] x [D, V]`` product in the backward (four
instead of three). The reference forward is a ``jax.custom_vjp`` with that backward, so
``jax.grad`` of the command (eager code, traced functions) is blockwise as well.

Backends: the reference (``"xla"``) is the blockwise computation; ``"dense"``
materialises the logits (one product and XLA's fused softmax), which pays where they
are small. It has priority 0, so it is chosen only where ``python -m
fnnc.ops.measure_defaults`` measured it faster or when forced.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import Spec, Uses, defcommand
from fnnc.core.dispatch import Backend, register_backend
from fnnc.core.dtypes import at_least_float32
from fnnc.errors import CommandError, DTypeError
from fnnc.ops._rules import fail, require_float, require_same_dtype, show
from fnnc.ops.loss import batch_label, class_index

NAME = "linear_softmax_crossentropy"
ROW_CHUNK = 4096
CLASS_CHUNK = 8192
"""Default blocks: a ``[4096, 8192]`` float32 block is 128 MiB, against 2 GiB for the
issue's full ``[16384, 32768]`` logits, and each block's product still fills a GPU."""


result_dtype = at_least_float32
"""The loss's dtype for inputs of ``dtype``: float32 at least, as losses are kept."""


def _shape(x, w, label, bias=None, *, trim0, trim1, row_chunk, class_chunk):
    require_float(NAME, x, w)
    require_same_dtype(NAME, x, w, *([bias] if bias is not None else []))
    if x.ndim < 1 or w.ndim != 2 or w.shape[1] != x.shape[-1]:
        fail(
            f"{NAME}: hidden {show(x)} must be [..., D] and weights {show(w)} [V, D] "
            "(NNC's dense layout) with the same D"
        )
    if w.shape[0] == 0:  # a softmax over no classes is undefined, as in softmax_crossentropy
        fail(f"{NAME}: weights {show(w)} have no classes; a softmax needs at least one")
    if bias is not None and tuple(bias.shape) != (w.shape[0],):
        fail(f"{NAME}: bias {show(bias)} must be [{w.shape[0]}], one per class of {show(w)}")
    lead = tuple(x.shape[:-1])
    if not (jnp.issubdtype(label.dtype, jnp.integer) or jnp.issubdtype(label.dtype, jnp.floating)):
        raise DTypeError(f"{NAME}: label {show(label)} must be class indices (int or float)")
    if tuple(label.shape) not in (lead, (*lead, 1)) and not batch_label(
        (*lead, w.shape[0]), label.shape
    ):
        fail(
            f"{NAME}: label {show(label)} must be class indices shaped {list(lead)} or "
            f"{[*lead, 1]} (or [N] for hidden [N, 1, ..., 1, D], NNC's batch-first rule) for "
            f"hidden {show(x)}; for per-class targets use gemm and softmax_crossentropy"
        )
    for key, n in (("row_chunk", row_chunk), ("class_chunk", class_chunk)):
        if not isinstance(n, int) or n < 1:
            raise CommandError(f"{NAME}: {key}={n!r} must be a positive int")
    out = Spec((*lead, 1), result_dtype(x.dtype))
    return out, out


def _indices(label: Any, rows: int) -> Any:
    """Class indices ``[N]`` int32 (floats rounded to the nearest class, as NNC does)."""
    return jnp.reshape(class_index(label), (rows,)).astype(jnp.int32)


def _start(i: Any, chunk: int, n: int) -> Any:
    """Block ``i``'s first index: ``i * chunk``, but the last block ends at ``n``."""
    return jnp.minimum(i * chunk, n - chunk)


def _fresh(start: Any, i: Any, chunk: int) -> Any:
    """Which of block ``i``'s indices no earlier block covered (the ragged last block
    starts early and overlaps the one before)."""
    return start + lax.iota(jnp.int32, chunk) >= i * chunk


def _block_logits(xr: Any, w: Any, bias: Any, c0: Any, cv: int) -> Any:
    """Float32 logits of one block, computed as the ``gemm`` command computes a dense
    layer: the product in the inputs' dtype (accumulated in float32 by the backend,
    rounded once), plus the bias in that dtype, then widened for the softmax.

    The product is *emitted* in the inputs' dtype, not computed in float32 and rounded
    after: a 16-bit block ``[2048, 32768]`` is then 128 MiB where float32 is 256 MiB,
    and the softmax's reductions and the gradient read it three times (on an H100, the
    LM step's largest reduction, ``input_convert_reduce_fusion``, which these reads
    likely are, took 1.1 ms a step; unmeasured since).

    Whether the 16-bit roundings happen is XLA's choice: with its excess precision
    (``xla_allow_excess_precision``, on by default) it may drop a round trip to 16 bits
    and back. XLA:CPU does so for bfloat16, in jitted programs and in eager calls alike
    (the block loop is always compiled): it computes the product in float32, so a block's
    logits are that product unrounded, or with a bias the product rounded once plus the
    bias in float32, not rounded again. It keeps float16's roundings. An eager ``gemm``
    (its 16-bit result written out) rounds, so the command can differ from that pair of
    commands run op by op by a 16-bit rounding of the logits (compiled as one program on
    CPU, the pair skips the same roundings). ``XLA_FLAGS=--xla_allow_excess_precision=false``
    keeps every rounding. Where XLA:GPU rounds is unmeasured."""
    acc = result_dtype(xr.dtype)
    wj = lax.dynamic_slice_in_dim(w, c0, cv, 0)
    z = lax.dot_general(xr, wj, (((1,), (1,)), ((), ())))
    if bias is not None:
        z = z + lax.dynamic_slice_in_dim(bias, c0, cv, 0)[None, :]
    return z.astype(acc)


def _row_losses(xr, lr, w, bias, trims, cv):
    """``(loss, lse)`` of one block of rows, walking the classes (online logsumexp)."""
    v, (trim0, trim1) = w.shape[0], trims
    rows, acc = xr.shape[0], result_dtype(xr.dtype)

    def body(j, carry):
        m, s, picked, total = carry
        c0 = _start(j, cv, v)
        z = _block_logits(xr, w, bias, c0, cv)
        fresh = _fresh(c0, j, cv)[None, :]
        zm = jnp.where(fresh, z, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(zm, axis=1))
        # A row with only -inf logits so far (a bias masking a block) shifts by 0, not by
        # -inf: -inf - -inf is NaN.
        shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        s = s * jnp.exp(m - shift) + jnp.sum(jnp.exp(zm - shift[:, None]), axis=1)
        hit = fresh & (c0 + lax.iota(jnp.int32, cv)[None, :] == lr[:, None])
        picked = picked + jnp.sum(jnp.where(hit, z, 0.0), axis=1)
        if trim0:
            total = total + jnp.sum(jnp.where(fresh, z, 0.0), axis=1)
        return m_new, s, picked, total

    zeros = jnp.zeros((rows,), acc)
    init = (jnp.full((rows,), -jnp.inf, acc), zeros, zeros, zeros)
    m, s, picked, total = lax.fori_loop(0, -(-v // cv), body, init)
    lse = m + jnp.log(s)
    # loss = lse - sum(t * logits), t = trim1 at the label and trim0 elsewhere.
    return lse - (trim0 * total + (trim1 - trim0) * picked), lse


@defcommand(family="loss", shape=_shape, uses=Uses(inputs=None, outputs=(1,)))
def linear_softmax_crossentropy(
    x,
    w,
    label,
    bias=None,
    *,
    trim0=0.0,
    trim1=1.0,
    row_chunk=ROW_CHUNK,
    class_chunk=CLASS_CHUNK,
):
    """Softmax cross-entropy of the logits ``x wᵀ + bias`` to ``label``, never holding
    more than a ``[row_chunk, class_chunk]`` block of logits: ``(loss, lse)``, both
    ``[..., 1]`` (see the module docstring).

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> x, w = jnp.ones((4, 8)), jnp.zeros((1000, 8))
    >>> loss, lse = ops.linear_softmax_crossentropy(class_chunk=256)(x, w, jnp.arange(4))
    >>> loss[:, 0]  # uniform logits: log(1000)
    Array([6.9077554, 6.9077554, 6.9077554, 6.9077554], dtype=float32)
    """
    return _blockwise(x, w, label, bias, (trim0, trim1, row_chunk, class_chunk))


def _forward(x, w, label, bias, trim0, trim1, row_chunk, class_chunk):
    lead, (v, d) = x.shape[:-1], w.shape
    n = int(np.prod(lead, dtype=np.int64))
    x2, labels = jnp.reshape(x, (n, d)), _indices(label, n)
    cr, cv = min(row_chunk, n), min(class_chunk, v)
    out = result_dtype(x.dtype)
    if n == 0:
        empty = jnp.zeros((*lead, 1), out)
        return empty, empty

    def body(i, carry):
        r0 = _start(i, cr, n)
        xr = lax.dynamic_slice_in_dim(x2, r0, cr, 0)
        lr = lax.dynamic_slice_in_dim(labels, r0, cr, 0)
        block = _row_losses(xr, lr, w, bias, (trim0, trim1), cv)
        return tuple(lax.dynamic_update_slice_in_dim(a, b, r0, 0) for a, b in zip(carry, block))

    zeros = jnp.zeros((n,), out)
    loss, lse = lax.fori_loop(0, -(-n // cr), body, (zeros, zeros))
    shape = (*lead, 1)
    return jnp.reshape(loss, shape).astype(out), jnp.reshape(lse, shape).astype(out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _blockwise(x, w, label, bias, params):
    """The blockwise forward whose ``jax.vjp`` is the blockwise backward (JAX's own
    derivative of the loops would keep every block's logits for its backward)."""
    return _forward(x, w, label, bias, *params)


def _blockwise_fwd(x, w, label, bias, params):
    out = _forward(x, w, label, bias, *params)
    return out, (x, w, label, bias, out[1])


def _blockwise_bwd(params, residuals, cotangents):
    x, w, label, bias, lse = residuals
    keys = ("trim0", "trim1", "row_chunk", "class_chunk")
    grads = _backward(cotangents, (x, w, label, bias), (None, lse), **dict(zip(keys, params)))
    return (*grads[:3], grads[3] if bias is not None else None)


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def _grads(g_loss, g_lse, x2, w, labels, bias, lse, trims, cr, cv):
    """``(dx, dw, db)`` in float32 (or wider), walking class blocks and, inside, row blocks."""
    (n, d), v, (trim0, trim1) = x2.shape, w.shape[0], trims
    acc = result_dtype(x2.dtype)

    def rows_of(i, carry):
        dx, dwj, dbj, c0, fresh_cols = carry
        r0 = _start(i, cr, n)
        xr = lax.dynamic_slice_in_dim(x2, r0, cr, 0)
        z = _block_logits(xr, w, bias, c0, cv)
        p = jnp.exp(z - lax.dynamic_slice_in_dim(lse, r0, cr, 0)[:, None])
        cols = c0 + lax.iota(jnp.int32, cv)[None, :]
        hit = cols == lax.dynamic_slice_in_dim(labels, r0, cr, 0)[:, None]
        dz = jnp.zeros(z.shape, acc)
        if g_loss is not None:
            t = jnp.where(hit, acc.type(trim1), acc.type(trim0))
            dz = dz + lax.dynamic_slice_in_dim(g_loss, r0, cr, 0)[:, None] * (p - t)
        if g_lse is not None:
            dz = dz + lax.dynamic_slice_in_dim(g_lse, r0, cr, 0)[:, None] * p
        keep = _fresh(r0, i, cr)[:, None] & fresh_cols[None, :]
        # The gemm's backward reads the logits' gradient in the gemm's dtype.
        dz = jnp.where(keep, dz, 0.0).astype(x2.dtype)
        wj = lax.dynamic_slice_in_dim(w, c0, cv, 0)
        mm = lambda a, b, c: lax.dot_general(a, b, (c, ((), ())), preferred_element_type=acc)
        grown = lax.dynamic_slice_in_dim(dx, r0, cr, 0) + mm(dz, wj, ((1,), (0,)))
        dx = lax.dynamic_update_slice_in_dim(dx, grown, r0, 0)
        dwj = dwj + mm(dz, xr, ((0,), (0,)))
        dbj = dbj + jnp.sum(dz.astype(acc), axis=0)
        return dx, dwj, dbj, c0, fresh_cols

    def classes_of(j, carry):
        dx, dw, db = carry
        c0 = _start(j, cv, v)
        init = (dx, jnp.zeros((cv, d), acc), jnp.zeros((cv,), acc), c0)
        dx, dwj, dbj, _, _ = lax.fori_loop(0, -(-n // cr), rows_of, (*init, _fresh(c0, j, cv)))
        add = lambda a, b: lax.dynamic_update_slice_in_dim(
            a, lax.dynamic_slice_in_dim(a, c0, cv, 0) + b, c0, 0
        )
        return dx, add(dw, dwj), add(db, dbj)

    init = (jnp.zeros((n, d), acc), jnp.zeros((v, d), acc), jnp.zeros((v,), acc))
    return lax.fori_loop(0, -(-v // cv), classes_of, init)


@linear_softmax_crossentropy.backward
def _backward(grads, inputs, outputs, *, trim0, trim1, row_chunk, class_chunk):
    (g_loss, g_lse), (x, w, label, *rest), (_, lse) = grads, inputs, outputs
    bias = rest[0] if rest else None
    (v, d), n = w.shape, int(np.prod(x.shape[:-1], dtype=np.int64))
    acc = result_dtype(x.dtype)
    flat = lambda g: None if g is None else jnp.reshape(g, (n,)).astype(acc)
    if n == 0 or (g_loss is None and g_lse is None):
        dx, dw, db = jnp.zeros(x.shape), jnp.zeros(w.shape), jnp.zeros((v,))
    else:
        dx, dw, db = _grads(
            flat(g_loss),
            flat(g_lse),
            jnp.reshape(x, (n, d)),
            w,
            _indices(label, n),
            bias,
            flat(lse),
            (trim0, trim1),
            min(row_chunk, n),
            min(class_chunk, v),
        )
    result = (jnp.reshape(dx, x.shape).astype(x.dtype), dw.astype(w.dtype), None)
    return result if bias is None else (*result, db.astype(bias.dtype))


def _dense(x, w, label, bias=None, *, trim0, trim1, row_chunk, class_chunk):
    """The ``"dense"`` backend: all ``[N, V]`` logits at once (XLA fuses the softmax
    statistics into the product's consumers); faster where the logits are small."""
    acc = result_dtype(x.dtype)
    z = lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())))  # as _block_logits
    if bias is not None:
        z = z + jnp.reshape(bias, (1,) * (z.ndim - 1) + (-1,))
    z = z.astype(acc)
    lse = jax.nn.logsumexp(z, axis=-1, keepdims=True)
    index = jnp.reshape(
        _indices(label, int(np.prod(x.shape[:-1], dtype=np.int64))), (*x.shape[:-1], 1)
    )
    picked = jnp.take_along_axis(z, jnp.clip(index, 0, w.shape[0] - 1), axis=-1)
    picked = jnp.where((index >= 0) & (index < w.shape[0]), picked, 0.0)
    total = jnp.sum(z, axis=-1, keepdims=True) if trim0 else 0.0
    return lse - (trim0 * total + (trim1 - trim0) * picked), lse


def _dense_backward(grads, inputs, outputs, wants, **params):
    """NNC's convention: ``jax.vjp`` of :func:`_dense` (it keeps the logits anyway)."""
    x, w, label, *rest = inputs
    floats = [x, w, *rest]
    run = lambda x, w, *b: _dense(x, w, label, *b, **params)
    out, vjp = jax.vjp(run, *floats)
    cts = tuple(
        jnp.zeros(o.shape, o.dtype) if g is None else g.astype(o.dtype) for g, o in zip(grads, out)
    )
    dx, dw, *db = vjp(cts)
    return (dx, dw, None, *db)


DENSE = Backend(
    "dense",
    _dense,
    ("cpu", "gpu", "tpu"),
    priority=0,
    interpret_platforms=(),
    backward=_dense_backward,
)
"""The materialising backend: the default only where measured faster (priority 0)."""

register_backend(NAME, DENSE)
