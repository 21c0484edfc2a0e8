"""Pallas ``gemm``: a tiled matrix product with an elementwise epilogue.

One program owns a ``bm x bn`` output tile and walks the contraction in ``bk`` slices,
accumulating in float32; transposed operands are read through ``dot_general``'s
contraction dimensions (no transposed copies). The product is cast to the output dtype
and handed to an *epilogue* over the tile together with any broadcast operands (row,
column, scalar or full tiles, see :func:`~fnnc.ops.pallas._common.operand_kind`):

- this backend's epilogue adds the bias (``a @ b + bias``, as the reference);
- :mod:`fnnc.ops.pallas.fused_elementwise` passes the rest of a fused body whose first
  command is a gemm, so ``gelu(x @ w + b)`` is one kernel (the bias + activation
  epilogue).

The backward is three more products by the same kernel (``dA`` and ``dB`` with the
right transposes) plus a reduction for the bias.

Sizes need not be multiples of the tiles (33 x 47 x 65): the grid is
``cdiv(M, bm) x cdiv(N, bn)``, and the ragged last tiles and contraction slice are
masked (operands past the edge read as 0, so they add nothing to the product; nothing
is stored past the edge). Tiles are powers of two of at least 16 (Triton's ``dot``).

Supported: float32/bfloat16/float16 (float32 accumulation); ``b`` a rank-2 weight;
``a`` rank 2 (or any rank without ``transpose_a``: leading axes fold into rows); any
non-empty M, N, K; a bias that is a row, column, scalar or full tile.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from fnnc.core.command import Command, Spec
from fnnc.ops.blas import gemm as _command
from fnnc.ops.pallas import _derivatives
from fnnc.ops.pallas._common import (
    COL,
    FULL,
    MIN_TILE,
    ROW,
    as_operand,
    both,
    float_reason,
    lane_block,
    launch,
    load,
    operand_kind,
    operand_spec,
    reduce_partials,
    span,
    steps,
    store,
)

BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 32

gemm_reference = _command.definition.forward
"""The command's reference forward (the ``"xla"`` backend), which the kernel matches."""


def dims(a: Spec, b: Spec, ta: bool, tb: bool) -> tuple[int, int, int]:
    """(M, N, K) of the product with ``a``'s leading axes folded into M."""
    m = a.shape[-1] if ta else math.prod(a.shape[:-1])
    k = a.shape[-2] if ta else a.shape[-1]
    return m, (b.shape[0] if tb else b.shape[1]), k


def support_reason(a: Spec, b: Spec, bias: Spec | None, ta: bool, tb: bool) -> str | None:
    """Why the kernel cannot multiply these (``None`` if it can); also used by fused bodies."""
    why = float_reason("gemm", a, b, bias)
    if why is not None:
        return why
    if b.ndim != 2 or a.ndim < 2 or (ta and a.ndim != 2):
        got = f"a {list(a.shape)}, b {list(b.shape)}"
        return (
            "gemm: needs a rank-2 b and an a of rank 2 or more (exactly 2 when "
            f"transpose_a); a vector operand runs on the reference, got {got}"
        )
    m, n, k = dims(a, b, ta, tb)
    if min(m, n, k) == 0:
        return f"gemm: an empty product (M, N, K = {m}, {n}, {k})"
    out = (*a.shape[:-2], a.shape[-1] if ta else a.shape[-2], n)
    if bias is not None and operand_kind(bias.shape, out) is None:
        what = f"gemm: bias {list(bias.shape)}"
        return f"{what} is not a row, column, scalar or full tile of {list(out)}"
    return None


def supports(cmd: Command, specs: Sequence[Spec]) -> str | None:
    """``None`` when the kernel runs these inputs, else the reason (see module doc)."""
    a, b, *bias = specs
    ta, tb = cmd.param("transpose_a"), cmd.param("transpose_b")
    return support_reason(a, b, bias[0] if bias else None, ta, tb)


def _tile(ref: Any, kind: str, ij: tuple[Any, Any], blocks: tuple[int, int], mn: Any) -> Any:
    """An operand tile of the output tile at ``ij`` (starts), 0 past the output's edge."""
    if kind not in (FULL, ROW, COL):
        return ref[...]
    (bm, bn), shape = blocks, ref.shape
    rows = span(ij[0], bm, mn[0], shape, 0) if kind != ROW else None
    cols = span(ij[1], bn, mn[1], shape, 1) if kind != COL else None
    return load(ref, None, both(rows, cols))


def _kernel(a_ref, b_ref, *refs, ta, tb, bk, mnk, kinds, epilogue):
    operands, outs = refs[: len(kinds)], refs[len(kinds) :]
    (bm, bn), (m, n, k) = outs[0].shape, mnk
    i0, j0 = pl.program_id(0) * bm, pl.program_id(1) * bn
    m_a = span(i0, bm, m, (bk, bm) if ta else (bm, bk), 1 if ta else 0)
    n_b = span(j0, bn, n, (bn, bk) if tb else (bk, bn), 0 if tb else 1)

    def step(s, acc):
        cut = pl.ds(s * bk, bk)
        k_a = span(s * bk, bk, k, (bk, bm) if ta else (bm, bk), 0 if ta else 1)
        k_b = span(s * bk, bk, k, (bn, bk) if tb else (bk, bn), 1 if tb else 0)
        a = load(a_ref, (cut, slice(None)) if ta else (slice(None), cut), both(m_a, k_a))
        b = load(b_ref, (slice(None), cut) if tb else (cut, slice(None)), both(n_b, k_b))
        dn = (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))
        return acc + lax.dot_general(a, b, dn, preferred_element_type=jnp.float32)

    acc = lax.fori_loop(0, steps(k, bk), step, jnp.zeros((bm, bn), jnp.float32))
    rows, cols = span(i0, bm, m, (bm, bn), 0), span(j0, bn, n, (bm, bn), 1)
    tiles = [_tile(r, kind, (i0, j0), (bm, bn), (m, n)) for r, kind in zip(operands, kinds)]
    results = epilogue(acc.astype(outs[0].dtype), *tiles)
    for ref, value in zip(outs, results):
        store(ref, None, value, both(rows, cols))


def matmul(
    a: Any,
    b: Any,
    *,
    ta: bool = False,
    tb: bool = False,
    operands: Sequence[tuple[Any, str]] = (),
    epilogue: Callable[..., tuple[Any, ...]] | None = None,
    out_dtypes: Sequence[Any] | None = None,
) -> tuple[Any, ...]:
    """``epilogue(op(a) @ op(b), *operand tiles)`` for 2-D ``a``, ``b``, tile by tile.

    ``operands`` are ``(array, kind)`` pairs already in their 2-D layout; the default
    epilogue returns the product alone. Returns one ``[M, N]`` array per epilogue output.
    """
    (m, k), n = (a.shape[::-1] if ta else a.shape), (b.shape[0] if tb else b.shape[1])
    bm, bn = lane_block(m, BLOCK_M, MIN_TILE), lane_block(n, BLOCK_N, MIN_TILE)
    bk = lane_block(k, BLOCK_K, MIN_TILE)
    dtypes = list(out_dtypes or [a.dtype])
    a_spec = (
        pl.BlockSpec((k, bm), lambda i, j: (0, i))
        if ta
        else pl.BlockSpec((bm, k), lambda i, j: (i, 0))
    )
    b_spec = (
        pl.BlockSpec((bn, k), lambda i, j: (j, 0))
        if tb
        else pl.BlockSpec((k, bn), lambda i, j: (0, j))
    )
    kernel = functools.partial(
        _kernel,
        ta=ta,
        tb=tb,
        bk=bk,
        mnk=(m, n, k),
        kinds=tuple(kind for _, kind in operands),
        epilogue=epilogue or (lambda z: (z,)),
    )
    return tuple(
        launch(
            kernel,
            grid=(steps(m, bm), steps(n, bn)),
            in_specs=[a_spec, b_spec, *(operand_spec(kind, bm, bn) for _, kind in operands)],
            out_specs=[operand_spec(FULL, bm, bn)] * len(dtypes),
            out_shape=[Spec((m, n), d) for d in dtypes],
            name="fnnc_gemm",
            stages=3,
        )(a, b, *(x for x, _ in operands))
    )


def matmul_grads(g: Any, a: Any, b: Any, ta: bool, tb: bool) -> tuple[Any, Any]:
    """``(dA, dB)`` of ``op(a) @ op(b)`` for the output gradient ``g``, as kernel products."""
    if ta:
        da = matmul(b, g, ta=tb, tb=True)[0]
    else:
        da = matmul(g, b, tb=not tb)[0]
    if tb:
        db = matmul(g, a, ta=True, tb=ta)[0]
    else:
        db = matmul(a, g, ta=not ta)[0]
    return da, db


def _add_bias(z: Any, bias: Any) -> tuple[Any]:
    return (z + bias,)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _gemm(ta: bool, tb: bool, bias_kind: str, a: Any, b: Any, bias: Any) -> Any:
    operands = [] if bias is None else [(bias, bias_kind)]
    return matmul(a, b, ta=ta, tb=tb, operands=operands, epilogue=_add_bias if operands else None)[
        0
    ]


def _gemm_fwd(ta, tb, bias_kind, a, b, bias):
    return _gemm(ta, tb, bias_kind, a, b, bias), (a, b, bias)


def _gemm_bwd(ta, tb, bias_kind, residuals, g):
    a, b, bias = residuals
    da, db = matmul_grads(g, a, b, ta, tb)
    dbias = None if bias is None else reduce_partials(g, bias_kind, bias.shape, bias.dtype)
    return da, db, dbias


def _gemm_reference(ta, tb, bias_kind, a, b, bias):
    """The reference product on the kernel's operands (a 2-D bias broadcasts)."""
    z = _command.definition.forward(a, b, transpose_a=ta, transpose_b=tb)
    return z if bias is None else z + bias.astype(z.dtype)


_derivatives.defvjp(_gemm, _gemm_fwd, _gemm_bwd, _gemm_reference)


def _flat(a: Any, b: Any, bias: Any, ta: bool, tb: bool) -> tuple[Any, Any, str, tuple[int, ...]]:
    m, n, k = dims(a, b, ta, tb)
    out = (*a.shape[:-2], a.shape[-1] if ta else a.shape[-2], n)
    a2 = a if ta else jnp.reshape(a, (m, k))
    if bias is None:
        return a2, None, "", out
    kind = operand_kind(bias.shape, out)
    return a2, as_operand(bias, kind, m, n), kind, out


def gemm(a: Any, b: Any, bias: Any = None, *, transpose_a=False, transpose_b=False) -> Any:
    """The kernel backend: same signature and results as the reference."""
    a2, bias2, kind, out = _flat(a, b, bias, transpose_a, transpose_b)
    return jnp.reshape(_gemm(transpose_a, transpose_b, kind, a2, b, bias2), out)


def backward(grads, inputs, outputs, wants, *, transpose_a, transpose_b) -> tuple[Any, ...]:
    """The command's backward (NNC convention) as kernel products; ``bias`` may be a spec."""
    (g,), (a, b, *bias) = grads, inputs
    a2, _, _, out = _flat(a, b, None, transpose_a, transpose_b)
    g2 = jnp.reshape(g, (math.prod(out[:-1]), out[-1]))
    da, db = matmul_grads(g2, a2, b, transpose_a, transpose_b)
    result = (jnp.reshape(da, a.shape), db)
    if not bias:
        return result
    kind = operand_kind(bias[0].shape, out)
    return (*result, reduce_partials(g2, kind, bias[0].shape, bias[0].dtype))
