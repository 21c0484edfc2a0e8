"""Flash attention's fused backward: one kernel, FlashAttention-2's, where the split
backward (:mod:`fnnc.ops.pallas._attention_grads`) runs two.

The dK/dV kernel's walk (grid ``(B, Hk, T / bk)``: a key/value block stays put while
the query blocks of its heads stream past) also makes each tile's share of dQ,
``dS K * scale``, and adds it into a float32 dQ with atomic adds. A tile pair then
costs five products (``Q Kᵀ``, ``dO Vᵀ``, ``Pᵀ dO``, ``dSᵀ Q``, ``dS K``) where the split
backward's two kernels cost seven (the dQ kernel recomputes ``Q Kᵀ`` and ``dO Vᵀ``).
That is the layout of FlashAttention-2's and cuDNN's backwards: on the H100 (2026-11-27)
cuDNN's took 1.22 ms a step of the LM, fnnc's split kernels 0.88 + 1.20 ms.

What it costs instead: float32 atomic adds of a ``[bq, D]`` tile per tile pair (about
140 million a step of that LM at 64 x 64 blocks), and a dQ whose float32 sums run in
the order the programs finish, so it is not bit-for-bit repeatable from run to run
(the split backward is; XLA's own scatter-adds on a GPU are not either). So it is a
candidate only (``"pallas_fused"``, priority 0): measurement makes it a default or not.

It needs ``lse`` before its first tile: given by the forward under ``jax.grad``. A
graph's backward has ``O``, not ``lse``: it calls the forward kernel again, the call
the forward node made, with the same operands and settings, so that XLA's common
subexpression elimination can merge the two in one program and ``lse`` costs nothing
(where it does not, the call costs a forward: two products a tile; a kept profile
shows which, by the forward kernels it counts). A float mask whose gradient is wanted
runs the split kernels, which write the logits' gradient tile by tile.
"""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from fnnc.core.command import Spec
from fnnc.ops.pallas._attention_grads import _dlogits, delta_of, key_walk_specs
from fnnc.ops.pallas._attention_tiles import (
    LOG2E,
    Config,
    first_full_query_block,
    mask_tile,
    tile_logits,
    tile_rows,
    walk,
)
from fnnc.ops.pallas._common import interpret, launch, load, span, steps, store


def _add_into(ref: Any, idx: tuple[Any, ...], value: Any, mask: Any) -> None:
    """``ref[idx] += value`` where ``mask`` holds: an atomic add on a GPU, where programs
    run at once (indexed in one step: the Triton lowering takes one indexer, not a
    view's). Interpreted, programs run one after another, so a masked read, add and
    write is the same sum (and Pallas interprets no masked atomic add)."""
    if interpret():
        store(ref, idx, load(ref, idx, mask) + value, mask)
    else:
        plgpu.atomic_add(ref, idx, value, mask=mask)


def _fused_kernel(q_ref, k_ref, v_ref, *refs, cfg: Config):
    mask_ref = refs[0] if cfg.mask else None
    go_ref, lse_ref, delta_ref, _, dk_ref, dv_ref, dq_ref = refs[1:] if cfg.mask else refs
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
            lse = tile_rows(lse_ref, (head, rows), row0, s, bq)
            lse = jnp.where(lse == -jnp.inf, 0.0, lse * LOG2E)[:, None]  # base 2
            delta = tile_rows(delta_ref, (head, rows), row0, s, bq)[:, None]
            tile = mask_tile(cfg, mask_ref, rows, slice(None), (row0, j * bk), head)
            p = jnp.exp2(tile_logits(cfg, q, k, row0, j * bk, tile, causal) - lse)
            dv = dv + lax.dot_general(
                p.astype(go.dtype), go, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32
            )
            ds = _dlogits(p, go, v, delta).astype(q.dtype)
            dk = dk + lax.dot_general(
                ds, q, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32
            )
            dq = lax.dot_general(
                ds, k, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
            )
            _add_into(dq_ref, (rows, head, slice(None)), dq, span(row0, bq, s, dq.shape, 0))
            return dk, dv

        # the query blocks the diagonal crosses come first, then those under it
        split = first_full_query_block(cfg, j, s) if cfg.causal else None
        dk, dv = walk(cfg, body, first, steps(s, bq), (dk, dv), split, masked_first=True)
    store(dk_ref, None, dk * cfg.scale, span(j * bk, bk, cfg.t, dk.shape, 0))
    store(dv_ref, None, dv, span(j * bk, bk, cfg.t, dv.shape, 0))


def fused_grads(cfg: Config, q, k, v, mask, o, lse, go) -> tuple[Any, Any, Any]:
    """``(dq, dk, dv)`` from one kernel (see the module doc); ``lse`` is ``[B, H, S]``."""
    b, s, _, d = q.shape
    t, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    go = go.astype(q.dtype)
    group_spec, key_spec, stats_spec, mask_k = key_walk_specs(cfg, s, mask)
    mask_in = [] if mask is None else [mask]
    dq_spec = group_spec(d)
    inputs = (q, k, v, *mask_in, go, lse, delta_of(go, o), jnp.zeros(q.shape, jnp.float32))
    dk, dv_, dq = launch(
        functools.partial(_fused_kernel, cfg=cfg),
        grid=(b, hk, steps(t, cfg.bk)),
        in_specs=[
            group_spec(d),
            key_spec(d),
            key_spec(dv),
            *mask_k,
            group_spec(dv),
            stats_spec,
            stats_spec,
            dq_spec,
        ],
        out_specs=[key_spec(d), key_spec(dv), dq_spec],
        out_shape=[Spec(k.shape, k.dtype), Spec(v.shape, v.dtype), Spec(q.shape, jnp.float32)],
        name="fnnc_flash_attention_fused_backward",
        warps=cfg.warps,
        stages=cfg.stages,
        aliases={len(inputs) - 1: 2},  # dQ accumulates into the zeros given
    )(*inputs)
    return (dq * cfg.scale).astype(q.dtype), dk, dv_
