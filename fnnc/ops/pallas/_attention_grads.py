"""Flash attention's backward kernels: ``delta = sum(dO * O)`` per row (XLA), a dQ kernel
over the key blocks of each query block (given the softmax statistics, or finding them
online), and a
dK/dV kernel over the query blocks of each key block. See
:mod:`fnnc.ops.pallas.scaled_dot_product_attention`."""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from fnnc.core.command import Spec
from fnnc.ops.pallas._attention_tiles import (
    Config,
    first_full_query_block,
    full_key_blocks,
    key_blocks,
    mask_tile,
    pick,
    tile_logits,
    tile_rows,
    walk,
)
from fnnc.ops.pallas._common import both, interpret, launch, load, span, steps, store


def _key_tile(cfg: Config, q, k_ref, v_ref, mask_ref, row0, j, t, causal):
    """Key block ``j`` as query rows ``row0...`` see it: its columns, keys, values and
    masked logits (``causal``: with the causal mask, see ``walk``)."""
    cols, col0 = pl.ds(j * cfg.bk, cfg.bk), j * cfg.bk
    k = tile_rows(k_ref, (cols, slice(None)), col0, t, cfg.bk)
    v = tile_rows(v_ref, (cols, slice(None)), col0, t, cfg.bk)
    tile = mask_tile(cfg, mask_ref, slice(None), cols, (row0, col0))
    return cols, k, v, tile_logits(cfg, q, k, row0, col0, tile, causal)


def _dlogits(p, go, v, delta):
    """``dS = P (dP - delta)`` of one tile, ``dP = dO Vᵀ``."""
    dp = lax.dot_general(go, v, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    return p * (dp - delta)


def probabilities(logits: Any, m: Any, log2_l: Any) -> Any:
    """A tile's softmax from the row statistics the forward wrote (base 2, as the logits:
    see :func:`tile_logits`; a row that sees nothing has logits ``-inf`` and
    statistics 0, so its ``p`` is 0). ``(logits - m) - log2(l)``: subtracting ``m`` first
    keeps ``log2(l)`` where ``m`` is huge (see the module doc)."""
    return jnp.exp2((logits - m[:, None]) - log2_l[:, None])


def _dq_kernel(q_ref, k_ref, v_ref, *refs, cfg: Config, want_dmask: bool):
    mask_ref = refs[0] if cfg.mask else None
    go_ref, m_ref, l_ref, delta_ref, dq_ref, *dmask_ref = refs[1:] if cfg.mask else refs
    i, bq, bk, t = pl.program_id(2), cfg.bq, cfg.bk, k_ref.shape[0]
    row0 = i * bq
    q, go = tile_rows(q_ref, None, row0, cfg.s, bq), tile_rows(go_ref, None, row0, cfg.s, bq)
    m, log2_l = (tile_rows(r, None, row0, cfg.s, bq) for r in (m_ref, l_ref))
    delta = tile_rows(delta_ref, None, row0, cfg.s, bq)[:, None]

    def body(j, dq, causal):
        cols, k, v, logits = _key_tile(cfg, q, k_ref, v_ref, mask_ref, row0, j, t, causal)
        ds = _dlogits(probabilities(logits, m, log2_l), go, v, delta)
        if want_dmask:
            inside = both(span(row0, bq, cfg.s, ds.shape, 0), span(j * bk, bk, t, ds.shape, 1))
            store(dmask_ref[0], (slice(None), cols), ds, inside)
        return dq + lax.dot_general(
            ds.astype(k.dtype), k, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )

    # The mask's gradient needs every tile written, so no causal early exit then.
    end = steps(t, bk) if want_dmask else key_blocks(cfg, i, t)
    split = full_key_blocks(cfg, i, t) if cfg.causal else None
    dq = walk(cfg, body, 0, end, jnp.zeros(q.shape, jnp.float32), split)
    store(dq_ref, None, dq * cfg.scale, span(row0, bq, cfg.s, dq.shape, 0))


def _dq_online_kernel(q_ref, k_ref, v_ref, *refs, cfg: Config):
    """dQ without the statistics: they accumulate online, as in the forward.
    ``dS = exp(S - m) (dP - delta)`` is summed into dQ unnormalised, rescaled whenever
    the running max ``m`` grows, and divided by the row sum at the end; the row's
    statistics are written for the dK/dV kernel. This replaces the statistics-only
    forward pass a graph's backward would otherwise run first (it is given ``O`` only)."""
    mask_ref = refs[0] if cfg.mask else None
    go_ref, delta_ref, dq_ref, m_ref, l_ref = refs[1:] if cfg.mask else refs
    i, bq, t = pl.program_id(2), cfg.bq, k_ref.shape[0]
    row0 = i * bq
    q, go = tile_rows(q_ref, None, row0, cfg.s, bq), tile_rows(go_ref, None, row0, cfg.s, bq)
    delta = tile_rows(delta_ref, None, row0, cfg.s, bq)[:, None]

    def body(j, carry, causal):
        dq, m, total = carry
        _, k, v, logits = _key_tile(cfg, q, k_ref, v_ref, mask_ref, row0, j, t, causal)
        m_new = jnp.maximum(m, jnp.max(logits, axis=1))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        p = jnp.exp2(logits - m_safe[:, None])  # base 2, as the forward's
        alpha = jnp.exp2(m - m_safe)
        ds = _dlogits(p, go, v, delta)
        dq = dq * alpha[:, None] + lax.dot_general(
            ds.astype(k.dtype), k, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )
        return dq, m_new, alpha * total + jnp.sum(p, axis=1)

    init = (
        jnp.zeros(q.shape, jnp.float32),
        jnp.full((bq,), -jnp.inf, jnp.float32),
        jnp.zeros((bq,), jnp.float32),
    )
    split = full_key_blocks(cfg, i, t) if cfg.causal else None
    dq, m, total = walk(cfg, body, 0, key_blocks(cfg, i, t), init, split)
    empty = total == 0  # a row that sees no key: dq = 0, statistics 0
    dq = dq / jnp.where(empty, 1.0, total)[:, None]
    store(dq_ref, None, dq * cfg.scale, span(row0, bq, cfg.s, dq.shape, 0))
    rows = span(row0, bq, cfg.s, (bq,), 0)
    store(m_ref, None, jnp.where(empty, 0.0, m), rows)
    store(l_ref, None, jnp.log2(jnp.where(empty, 1.0, total)), rows)


def add_into(ref: Any, idx: tuple[Any, ...], value: Any, mask: Any) -> None:
    """``ref[idx] += value`` where ``mask`` holds: an atomic add on a GPU, where programs
    run at once (indexed in one step: the Triton lowering takes one indexer, not a
    view's). Interpreted, programs run one after another, so a masked read, add and
    write is the same sum (and Pallas interprets no masked atomic add)."""
    if interpret():
        store(ref, idx, load(ref, idx, mask) + value, mask)
    else:
        plgpu.atomic_add(ref, idx, value, mask=mask)


def dkv_kernel(q_ref, k_ref, v_ref, *refs, cfg: Config, fused: bool = False):
    """dK and dV of one key block over the query blocks of its heads; ``fused``: dQ too,
    each tile's share added into a float32 dQ (:mod:`fnnc.ops.pallas._attention_fused`;
    refs ``go, m, log2 l, delta, dq given, dk, dv, dq``)."""
    mask_ref = refs[0] if cfg.mask else None
    go_ref, m_ref, l_ref, delta_ref, *outs = refs[1:] if cfg.mask else refs
    dk_ref, dv_ref, dq_ref = outs[1:] if fused else (*outs, None)
    j, bq, bk, s = pl.program_id(2), cfg.bq, cfg.bk, q_ref.shape[0]
    k, v = tile_rows(k_ref, None, j * bk, cfg.t, bk), tile_rows(v_ref, None, j * bk, cfg.t, bk)
    first = 0
    if cfg.causal:  # the first query row that sees key j * bk is j * bk - offset
        first = jnp.minimum(lax.div(jnp.maximum(j * bk - cfg.offset, 0), bq), steps(s, bq))
    dk = jnp.zeros(k.shape, jnp.float32)
    dv = jnp.zeros(v.shape, jnp.float32)
    for head in range(cfg.group):  # the query heads that share this key/value head

        def body(i, carry, causal, head=head):
            dk, dv = carry
            rows, row0 = pl.ds(i * bq, bq), i * bq
            q = tile_rows(q_ref, (rows, head, slice(None)), row0, s, bq)
            go = tile_rows(go_ref, (rows, head, slice(None)), row0, s, bq)
            m, log2_l = (tile_rows(r, (head, rows), row0, s, bq) for r in (m_ref, l_ref))
            delta = tile_rows(delta_ref, (head, rows), row0, s, bq)[:, None]
            tile = mask_tile(cfg, mask_ref, rows, slice(None), (row0, j * bk), head)
            logits = tile_logits(cfg, q, k, i * bq, j * bk, tile, causal)
            p = probabilities(logits, m, log2_l)
            dv = dv + lax.dot_general(
                p.astype(go.dtype), go, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32
            )
            ds = _dlogits(p, go, v, delta).astype(q.dtype)
            dk = dk + lax.dot_general(
                ds, q, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32
            )
            if fused:
                dq = lax.dot_general(
                    ds, k, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
                )
                add_into(dq_ref, (rows, head, slice(None)), dq, span(row0, bq, s, dq.shape, 0))
            return dk, dv

        # the query blocks the diagonal crosses come first, then those under it
        split = first_full_query_block(cfg, j, s) if cfg.causal else None
        dk, dv = walk(cfg, body, first, steps(s, bq), (dk, dv), split, masked_first=True)
    store(dk_ref, None, dk * cfg.scale, span(j * bk, bk, cfg.t, dk.shape, 0))
    store(dv_ref, None, dv, span(j * bk, bk, cfg.t, dv.shape, 0))


def delta_of(go: Any, o: Any) -> Any:
    """``delta = sum(dO * O)`` per row, ``[B, H, S]`` like the statistics (float32)."""
    delta = jnp.sum(go.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
    return jnp.transpose(delta, (0, 2, 1))


def key_walk_specs(
    cfg: Config, s: int, d: int, dv: int, mask: Any
) -> tuple[list[Any], list[Any], Any]:
    """A kernel with grid ``(B, Hk, T / bk)`` that walks the queries of a key block's
    heads: the specs of ``q, k, v, [mask,] dO, m, log2 l, delta`` and of ``dK, dV``, and
    ``group_spec(n)``, a ``[S, H / Hk, n]`` block of the heads' rows."""
    g, (vb, vh, vs, vt) = cfg.group, cfg.varies
    group_spec = lambda n: pl.BlockSpec((None, s, g, n), lambda bi, gi, j: (bi, 0, gi, 0))
    key_spec = lambda n: pl.BlockSpec((None, cfg.bk, None, n), lambda bi, gi, j: (bi, j, gi, 0))
    stats_spec = pl.BlockSpec((None, g, s), lambda bi, gi, j: (bi, gi, 0))
    mask_k = [
        pl.BlockSpec(
            (None, g if vh else 1, s if vs else 1, cfg.bk if vt else 1),
            lambda bi, gi, j: (pick(bi, vb), pick(gi, vh), 0, pick(j, vt)),
        )
    ][: 0 if mask is None else 1]
    ins = [group_spec(d), key_spec(d), key_spec(dv), *mask_k, group_spec(dv)]
    ins += [stats_spec] * 2
    return [*ins, stats_spec], [key_spec(d), key_spec(dv)], group_spec


def kernel_grads(
    dq_cfg: Config, dkv_cfg: Config, q, k, v, mask, o, stats, go, want_dmask: bool
) -> tuple[Any, Any, Any, Any]:
    """``(dq, dk, dv, d logits or None)``; ``d logits`` is ``[B, H, S, T]``. ``stats``:
    the forward's ``(m, log2 l)``; with ``None`` the dQ kernel finds them itself (not
    with ``want_dmask``).
    The dQ and dK/dV kernels run with their own configs (blocks and stages); the
    statistics they pass on are whole arrays, so the blocks need not agree."""
    cfg = dq_cfg
    b, s, h, d = q.shape
    t, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    g, (vb, vh, vs, vt) = cfg.group, cfg.varies
    go = go.astype(q.dtype)
    delta = delta_of(go, o)
    rows_spec = lambda n: pl.BlockSpec((None, cfg.bq, None, n), lambda bi, hi, i: (bi, i, hi, 0))
    keys_spec = lambda n: pl.BlockSpec((None, t, None, n), lambda bi, hi, i: (bi, 0, hi // g, 0))
    stat_spec = pl.BlockSpec((None, None, cfg.bq), lambda bi, hi, i: (bi, hi, i))
    mask_in = [] if mask is None else [mask]
    mask_q = [
        pl.BlockSpec(
            (None, None, cfg.bq if vs else 1, t if vt else 1),
            lambda bi, hi, i: (pick(bi, vb), pick(hi, vh), pick(i, vs), 0),
        )
    ][: len(mask_in)]
    dmask_out = [
        (
            pl.BlockSpec((None, None, cfg.bq, t), lambda bi, hi, i: (bi, hi, i, 0)),
            Spec((b, h, s, t), mask.dtype if mask is not None else q.dtype),
        )
    ][: int(want_dmask)]
    # Given the statistics, dQ reads them (and may write the mask's gradient); without
    # them, the online kernel finds them and writes them out for the dK/dV kernel.
    online = stats is None
    assert not (online and want_dmask), "the mask's gradient needs the statistics first"
    if online:
        kernel, stats_in = functools.partial(_dq_online_kernel, cfg=cfg), [delta]
        extra_out = [(stat_spec, Spec((b, h, s), jnp.float32))] * 2
    else:
        kernel = functools.partial(_dq_kernel, cfg=cfg, want_dmask=want_dmask)
        stats_in = [*stats, delta]
        extra_out = dmask_out
    dq, *extra = launch(
        kernel,
        grid=(b, h, steps(s, cfg.bq)),
        in_specs=[rows_spec(d), keys_spec(d), keys_spec(dv), *mask_q, rows_spec(dv)]
        + [stat_spec] * len(stats_in),
        out_specs=[rows_spec(d)] + [o[0] for o in extra_out],
        out_shape=[Spec(q.shape, q.dtype)] + [o[1] for o in extra_out],
        name="fnnc_flash_attention_dq_online" if online else "fnnc_flash_attention_dq",
        warps=cfg.warps,
        stages=cfg.stages,
    )(q, k, v, *mask_in, go, *stats_in)
    stats, dmask = (tuple(extra), []) if online else (stats, extra)
    cfg = dkv_cfg
    in_specs, out_specs, _ = key_walk_specs(cfg, s, d, dv, mask)
    dk, dv_ = launch(
        functools.partial(dkv_kernel, cfg=cfg),
        grid=(b, hk, steps(t, cfg.bk)),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=[Spec(k.shape, k.dtype), Spec(v.shape, v.dtype)],
        name="fnnc_flash_attention_dkv",
        warps=cfg.warps,
        stages=cfg.stages,
    )(q, k, v, *mask_in, go, *stats, delta)
    return dq, dk, dv_, (dmask[0] if dmask else None)
