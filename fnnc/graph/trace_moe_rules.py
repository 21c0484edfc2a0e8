"""Trace rules for mixture-of-experts code: ``lax.ragged_dot`` as ``segmented_gemm``.

Part of :data:`fnnc.graph.trace_rules.TRACE_RULES` (see that module for the contract
every rule keeps). ``ragged_dot(lhs [M, K], rhs [G, K, N], group_sizes [G])`` is NNC's
grouped GEMM whose segment ``g`` uses expert ``g``: ``segmented_gemm`` with the
constant indices ``0 .. G - 1`` (``rhs [G, N, K]``, contracted on its last axis, is
``transpose_b``).
"""

from __future__ import annotations

import numpy as np

from fnnc.graph._trace_base import _default_precision, _kind, _out, _plain


def _ragged_dot(ctx, eqn, args):
    lhs, rhs, sizes = args
    p = eqn.params
    numbers = p["ragged_dot_dimension_numbers"]
    (contract, batch) = numbers.dot_dimension_numbers
    if tuple(batch) != ((), ()) or tuple(numbers.lhs_ragged_dimensions) != (0,):
        return None
    if tuple(numbers.rhs_group_dimensions) != (0,) or tuple(contract[0]) != (1,):
        return None
    if tuple(contract[1]) not in ((1,), (2,)) or len(lhs.shape) != 2 or len(rhs.shape) != 3:
        return None
    out = _out(eqn)
    plain = _plain(p, "group_offset", "out_sharding") and _default_precision(p)
    if not (plain and _kind(lhs.dtype, "float") and np.dtype(out.dtype) == np.dtype(lhs.dtype)):
        return None
    if np.dtype(sizes.dtype) != np.int32 or not ctx.has("segmented_gemm"):
        return None
    transpose_b = tuple(contract[1]) == (2,)
    indices = ctx.constant(np.arange(rhs.shape[0], dtype=np.int32))
    spec = [lhs, indices, sizes, rhs]
    if not ctx.fits("segmented_gemm", spec, out, transpose_b=transpose_b):
        return None
    return [ctx.exec("segmented_gemm", lhs, indices, sizes, rhs, transpose_b=transpose_b)]


MOE_TRACE_RULES = {"ragged_dot_general": _ragged_dot}
