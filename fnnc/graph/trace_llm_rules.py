"""Trace rules for the commands large language models use: ``sort`` (``jnp.sort``,
``jnp.argsort``), ``top_k``, ``scatter-add`` (``x.at[i].add(u)``), ``sin``, ``cos``,
``pow`` and ``split`` (``jnp.split``, the first half of the rotate-half idiom).

Part of :data:`fnnc.graph.trace_rules.TRACE_RULES` (see that module for the contract
every rule keeps: value-preserving, checked before any node is added). Patterns that
span several equations (rotate-half, SiLU / SwiGLU, logsumexp) are rewritten after the
replay by :mod:`fnnc.graph.trace_idioms`.
"""

from __future__ import annotations

import numpy as np

from fnnc.graph._trace_base import Rule, _kind, _out, _simple


def _split(ctx, eqn, args):
    """Each piece of ``split`` as a ``slice`` of the operand."""
    (x,) = args
    axis, sizes = int(eqn.params["axis"]), [int(s) for s in eqn.params["sizes"]]
    if not ctx.has("slice"):
        return None
    outs, start = [], 0
    for size in sizes:
        lo = [0] * len(x.shape)
        hi = list(x.shape)
        lo[axis], hi[axis] = start, start + size
        outs.append(ctx.exec("slice", x, start=tuple(lo), limit=tuple(hi), strides=None))
        start += size
    return outs


def _is_iota(value: np.ndarray | None, shape: tuple[int, ...], axis: int) -> bool:
    if value is None or value.dtype != np.int32 or value.shape != shape:
        return False
    ramp = np.arange(shape[axis], dtype=np.int32).reshape(
        [-1 if d == axis else 1 for d in range(len(shape))]
    )
    return bool(np.array_equal(value, np.broadcast_to(ramp, shape)))


def _sort(ctx, eqn, args):
    """``sort`` of one operand (``jnp.sort``), or of an operand and an ``int32`` iota
    along the sorted axis with one key (``jnp.argsort``: stable), as ``sort``: the
    command's indices are that iota permuted. A reversed iota (``jnp.argsort(x,
    descending=True)``, which JAX spells ``rev(sort(rev(x), rev(iota)))``) permutes to
    ``n - 1 - indices``; :mod:`fnnc.graph.trace_idioms` then makes the whole spelling
    one ``argsort(descending=True)``."""
    p = eqn.params
    axis = int(p["dimension"])
    if p["num_keys"] != 1 or not _kind(args[0].dtype, "number") or not ctx.has("sort"):
        return None
    backwards = False
    if len(args) == 2:
        shape = tuple(args[0].shape)
        payload = ctx.value(args[1])
        backwards = payload is not None and _is_iota(np.flip(payload, axis), shape, axis)
        if not (p["is_stable"] and (backwards or _is_iota(payload, shape, axis))):
            return None
        if backwards and not ctx.has("add"):
            return None
    elif len(args) != 1:
        return None
    values, indices = ctx.exec("sort", args[0], axis=axis, descending=False)
    if backwards:
        last = ctx.constant(np.array(args[0].shape[axis] - 1, np.int32))
        indices = ctx.exec("add", last, indices, q=-1.0)
    return [values] if len(args) == 1 else [values, indices]


def _top_k(ctx, eqn, args):
    """``top_k`` as ``partition(descending=True)``: the k largest, lowest index first
    among ties, as ``lax.top_k``."""
    (x,) = args
    k = int(eqn.params["k"])
    axis = int(eqn.params.get("axis", len(x.shape) - 1))
    if np.dtype(_out(eqn, 1).dtype) != np.int32 or not _kind(x.dtype, "number"):
        return None
    if not (ctx.has("partition") and 1 <= k <= x.shape[axis]):
        return None
    values, indices = ctx.exec("partition", x, kth=k, axis=axis, descending=True)
    return [values, indices]


def _scatter_add(ctx, eqn, args):
    """``x.at[i].add(u)`` with rows of ``x`` picked by ``int32`` indices ``i[n, 1]``:
    ``add(x, scatter_add(u, i))``, for floats and integers (``.at[e].add(1)`` counting
    tokens per expert). Out-of-range indices are dropped (``mode=FILL_OR_DROP``, JAX's
    default for ``.at``), as ``scatter_add`` drops them; ``PROMISE_IN_BOUNDS`` gets the
    same, which is JAX's result for every index the promise allows; ``CLIP`` clamps the
    indices into ``[0, rows)`` first (``clamp``), as JAX does."""
    x, idx, upd = args
    p = eqn.params
    dn = p["dimension_numbers"]
    rank = len(x.shape)
    mode = str(p["mode"])
    clip = "CLIP" in mode
    if not (clip or "FILL_OR_DROP" in mode or "PROMISE_IN_BOUNDS" in mode):
        return None
    if p.get("update_consts"):
        return None
    if (
        tuple(dn.inserted_window_dims) != (0,)
        or tuple(dn.scatter_dims_to_operand_dims) != (0,)
        or tuple(dn.update_window_dims) != tuple(range(1, rank))
        or tuple(dn.operand_batching_dims)
        or tuple(dn.scatter_indices_batching_dims)
    ):
        return None
    n = idx.shape[0] if len(idx.shape) == 2 else -1
    if np.dtype(idx.dtype) != np.int32 or tuple(idx.shape) != (n, 1):
        return None
    if tuple(upd.shape) != (n, *x.shape[1:]) or not _kind(x.dtype, "number"):
        return None
    if np.dtype(upd.dtype) != np.dtype(x.dtype) or x.shape[0] < 1:
        return None
    if not ctx.has("scatter_add", "add", "reshape", *(("clamp",) if clip else ())):
        return None
    rows = int(x.shape[0])
    where = ctx.reshape(idx, (n,))
    if clip:
        where = ctx.exec("clamp", where, min=0, max=rows - 1)
    added = ctx.exec("scatter_add", upd, where, bincount=rows)
    return [ctx.exec("add", x, added)]


LLM_RULES: dict[str, Rule] = {
    "sin": _simple("ewsin", "float"),
    "cos": _simple("ewcos", "float"),
    "pow": _simple("ewpow", "float"),
    "split": _split,
    "sort": _sort,
    "top_k": _top_k,
    "scatter-add": _scatter_add,
}
