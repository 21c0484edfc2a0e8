"""Pallas ``scaled_dot_product_attention``: flash attention, forward and backward kernels.

Semantics are the command's exactly (see :mod:`fnnc.ops.attention`): layout
``[B, S, H, D]``, grouped key/value heads (query head ``h`` reads ``h // (H // Hk)``),
``scale=None`` meaning ``1 / sqrt(D)``, a bool mask (True keeps) or a float mask
(added) broadcasting to ``[B, H, S, T]``, causal masking aligned bottom-right
(query ``i`` sees keys ``j <= i + T - S``) and zeros for a query that sees no key.

- forward, grid ``(B, H, S / bq)``: one query block stays put while key/value blocks
  of ``bk`` stream past; an online softmax keeps the running max ``m`` and sum ``l``
  (masked logits are ``-inf``; a row whose max is still ``-inf`` contributes nothing).
  It also writes the row logsumexp ``lse`` (``-inf`` for a row that sees no key), the
  residual of the backward. Causal programs stop at their last visible key block.
- backward: ``delta = sum(dO * O)`` per row (XLA, a cheap reduction); a dK/dV kernel
  with grid ``(B, Hk, T / bk)`` walks the query blocks of the ``H / Hk`` heads that
  share its key/value head (causal programs start at their first visible query block),
  and a dQ kernel with grid ``(B, H, S / bq)`` walks the key blocks. With a float
  mask the dQ kernel also writes the logits' gradient, which is the mask's gradient
  before it is summed back to the mask's broadcast shape.

The graph's ``gradient`` node gets ``O`` but not ``lse``; its kernel backward first
runs the forward kernel in statistics-only mode (no ``V`` work) to recover ``lse``.

Ragged lengths (67 queries, 45 keys): the grids are ``cdiv(S, bq)`` / ``cdiv(T, bk)``
and the walks ``cdiv`` too, with power-of-two blocks of at least 16. A query row or
key column past the end is masked out of the logits (``-inf``, so it carries no
probability), its loads read 0 and nothing is stored there. Scores, softmax
statistics and accumulators are float32 for 16-bit inputs too.

Supported: float32/bfloat16/float16; head sizes ``D``, ``Dv`` powers of two in
[16, 256]; any non-empty ``S`` and ``T``; no fused output projection (``weights``,
``bias``: NNC's unify head). Anything else falls back to the reference.

Triton settings (:class:`Blocks`): the ``"pallas"`` backend runs 64 x 64 blocks in two
stages; ``"pallas_bq128"`` runs the same kernels with :data:`WIDE` (128-query blocks,
three stages), for 16-bit tiles that fit shared memory. It has no priority: it becomes
a default only where ``python -m fnnc.ops.measure_defaults`` timed it faster.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from fnnc import config
from fnnc.core.command import Command, Spec
from fnnc.ops.attention import scaled_dot_product_attention as _command
from fnnc.ops.pallas._common import (
    MIN_TILE,
    both,
    float_reason,
    lane_block,
    launch,
    load,
    ref_at,
    span,
    steps,
    store,
)

NAME = "scaled_dot_product_attention"
BLOCK_Q = 64
BLOCK_K = 64
"""Largest query / key block (the actual block is S / T padded to a power of two, >= 16)."""


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Triton settings of the three kernels: largest query and key blocks (``None``:
    :data:`BLOCK_Q` / :data:`BLOCK_K`), warps (``None``: 4 for ``D <= 64``, else 8) and
    software-pipelining stages."""

    q: int | None = None
    k: int | None = None
    warps: int | None = None
    stages: int = 2
    shared_bytes: int | None = None
    """Where set, inputs whose pipelined tiles would pass it are declined: the dK/dV
    kernel keeps a key block and ``stages`` query blocks of Q and dO in shared memory,
    ``(stages * q + k) * (D + Dv) * itemsize`` bytes (a Hopper SM has 227 KiB)."""

    def overflow(self, q: Spec, v: Spec) -> str | None:
        """Why these inputs' tiles do not fit :attr:`shared_bytes`; ``None`` if they do."""
        if self.shared_bytes is None:
            return None
        bq, bk = self.q or BLOCK_Q, self.k or BLOCK_K
        size = (self.stages * bq + bk) * (q.shape[3] + v.shape[3]) * q.dtype.itemsize
        if size <= self.shared_bytes:
            return None
        return (
            f"{NAME}: {bq}-query blocks in {self.stages} stages need {size // 1024} KiB of "
            f"shared memory at D={q.shape[3]}, Dv={v.shape[3]}, {q.dtype}; "
            f"{self.shared_bytes // 1024} KiB are allowed"
        )


WIDE = Blocks(q=128, k=64, warps=4, stages=3, shared_bytes=160 * 1024)
"""The ``"pallas_bq128"`` backend's settings: the query block and pipelining depth of
Triton's flash-attention tutorial for Hopper at ``D = 64``. Never a default by
priority: it is one more candidate that ``python -m fnnc.ops.measure_defaults`` (or
``Model.autotune``) times against the 64 x 64 kernel and XLA."""

scaled_dot_product_attention_reference = _command.definition.forward
"""The command's reference forward (the ``"xla"`` backend), which the kernel matches."""


def wins(cmd: Command, specs: Sequence[Spec]) -> bool:
    """Where flash attention wins by construction (its priority): where its products run
    on tensor cores, that is 16-bit inputs, or float32 under a matmul policy below full
    float32. At full float32 precision Triton multiplies without them: on an H200 the
    kernel took 1.37 ms where XLA took 0.078 ms ([2, 512, 8, 64]), so there it is the
    default only where measured faster (the H200's large float32 class)."""
    if specs[0].dtype.itemsize <= 2:
        return True
    return config.get().matmul_precision != "float32"


def supports(cmd: Command, specs: Sequence[Spec], blocks: Blocks = Blocks()) -> str | None:
    """``None`` when the kernels run these inputs, else the reason (see module doc)."""
    q, k, v, *rest = specs
    too_big = blocks.overflow(q, v)
    if too_big is not None:
        return too_big
    if any(s is not None for s in rest[1:]):
        return f"{NAME}: the fused output projection (weights, bias) runs in the reference only"
    why = float_reason(NAME, q, k, v)
    if why is not None:
        return why
    for what, n in (("head size D", q.shape[3]), ("value head size Dv", v.shape[3])):
        if n < MIN_TILE or n > 256 or n & (n - 1):
            return f"{NAME}: {what} {n} is not a power of two in [16, 256]"
    if q.shape[1] == 0 or k.shape[1] == 0:
        return f"{NAME}: query length S {q.shape[1]} or key length T {k.shape[1]} is 0"
    return None


@dataclasses.dataclass(frozen=True)
class _Config:
    scale: float
    causal: bool
    offset: int  # T - S: causal alignment
    mask: str  # "", "bool" or "float"
    varies: tuple[bool, bool, bool, bool]  # which of the mask's [B, H, S, T] axes are not 1
    group: int  # query heads per key/value head
    bq: int
    bk: int
    s: int  # query length
    t: int  # key length
    warps: int
    stages: int


def _config(
    q: Any, k: Any, mask: Any, scale: Any, causal: bool, blocks: Blocks = Blocks()
) -> _Config:
    (_, s, h, d), t = q.shape, k.shape[1]
    kind, varies = "", (False,) * 4
    if mask is not None:
        kind = "bool" if mask.dtype == jnp.bool_ else "float"
        varies = tuple(n != 1 for n in (1,) * (4 - mask.ndim) + tuple(mask.shape))
    bq = lane_block(s, blocks.q or BLOCK_Q, MIN_TILE)
    bk = lane_block(t, blocks.k or BLOCK_K, MIN_TILE)
    scale = 1 / math.sqrt(d) if scale is None else scale
    group = h // k.shape[2]
    warps = blocks.warps or (4 if d <= 64 else 8)
    return _Config(
        float(scale), bool(causal), t - s, kind, varies, group, bq, bk, s, t, warps, blocks.stages
    )


def _logits(cfg: _Config, q: Any, k: Any, row0: Any, col0: Any, m: Any) -> Any:
    """Masked, scaled ``q kᵀ`` of one tile in float32 (dropped keys are ``-inf``)."""
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    s = s * cfg.scale
    keep = None
    if cfg.mask == "float":
        s = s + m.astype(jnp.float32)
    elif cfg.mask == "bool":
        keep = jnp.broadcast_to(m != 0, s.shape)
    if cfg.causal:
        rows = row0 + lax.broadcasted_iota(jnp.int32, s.shape, 0)
        cols = col0 + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        visible = cols <= rows + cfg.offset
        keep = visible if keep is None else keep & visible
    inside = both(span(row0, cfg.bq, cfg.s, s.shape, 0), span(col0, cfg.bk, cfg.t, s.shape, 1))
    keep = both(keep, inside)  # ragged blocks: rows / keys past S / T see nothing
    return s if keep is None else jnp.where(keep, s, -jnp.inf)


def _rows(ref: Any, idx: Any, row0: Any, n: int, size: int) -> Any:
    """``ref[idx]``, a tile whose axis 0 is rows ``row0...`` of ``n`` (0 past ``n``)."""
    view = ref_at(ref, idx)
    return load(view, None, span(row0, size, n, view.shape, 0))


def _mask_tile(cfg: _Config, ref: Any, rows: Any, cols: Any, rc0: Any, head: Any = None) -> Any:
    """The mask tile for (rows, cols) of a 2-D ``[S|1, T|1]`` block (3-D with heads).

    ``rc0`` are the tile's first query row and key column; past ``S`` / ``T`` it reads 0.
    """
    if ref is None:
        return None
    _, _, vs, vt = cfg.varies
    index = (rows if vs else slice(None), cols if vt else slice(None))
    if head is not None:
        index = (head if cfg.varies[1] else 0, *index)
    shape = (cfg.bq if vs else 1, cfg.bk if vt else 1)
    in_s = span(rc0[0], cfg.bq, cfg.s, shape, 0) if vs else None
    in_t = span(rc0[1], cfg.bk, cfg.t, shape, 1) if vt else None
    return load(ref, index, both(in_s, in_t))


def _key_blocks(cfg: _Config, i: Any, t: int) -> Any:
    """Key blocks query block ``i`` needs: all, or up to its last visible key (causal)."""
    if not cfg.causal:
        return steps(t, cfg.bk)
    last = (i + 1) * cfg.bq + cfg.offset  # one past the last visible key
    return jnp.clip(lax.div(jnp.maximum(last, 0) + cfg.bk - 1, cfg.bk), 0, steps(t, cfg.bk))


def _forward_kernel(q_ref, k_ref, v_ref, *refs, cfg: _Config, stats_only: bool):
    mask_ref = refs[0] if cfg.mask else None
    *o_ref, lse_ref = refs[1:] if cfg.mask else refs
    i, bq, bk, t = pl.program_id(2), cfg.bq, cfg.bk, k_ref.shape[0]
    q = _rows(q_ref, None, i * bq, cfg.s, bq)

    def body(j, carry):
        acc, m, total = carry
        cols = pl.ds(j * bk, bk)
        tile = _mask_tile(cfg, mask_ref, slice(None), cols, (i * bq, j * bk))
        k = _rows(k_ref, (cols, slice(None)), j * bk, t, bk)
        s = _logits(cfg, q, k, i * bq, j * bk, tile)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        p = jnp.exp(s - m_safe[:, None])
        alpha = jnp.exp(m - m_safe)
        total = alpha * total + jnp.sum(p, axis=1)
        if not stats_only:
            v = _rows(v_ref, (cols, slice(None)), j * bk, t, bk)
            pv = lax.dot_general(
                p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
            )
            acc = acc * alpha[:, None] + pv
        return acc, m_new, total

    width = 1 if stats_only else v_ref.shape[1]
    init = (
        jnp.zeros((bq, width), jnp.float32),
        jnp.full((bq,), -jnp.inf, jnp.float32),
        jnp.zeros((bq,), jnp.float32),
    )
    acc, m, total = lax.fori_loop(0, _key_blocks(cfg, i, t), body, init)
    empty = total == 0
    lse = jnp.where(empty, -jnp.inf, m + jnp.log(jnp.where(empty, 1.0, total)))
    store(lse_ref, None, lse, span(i * bq, bq, cfg.s, (bq,), 0))
    if not stats_only:
        o = acc / jnp.where(empty, 1.0, total)[:, None]
        store(o_ref[0], None, o, span(i * bq, bq, cfg.s, o.shape, 0))


def _pick(pid: Any, varies: bool) -> Any:
    return pid if varies else 0


def _forward(cfg: _Config, q, k, v, mask, *, stats_only=False):
    b, s, h, d = q.shape
    t, dv = k.shape[1], v.shape[3]
    g, (vb, vh, vs, vt) = cfg.group, cfg.varies
    specs = [
        pl.BlockSpec((None, cfg.bq, None, d), lambda bi, hi, i: (bi, i, hi, 0)),
        pl.BlockSpec((None, t, None, d), lambda bi, hi, i: (bi, 0, hi // g, 0)),
        pl.BlockSpec((None, t, None, dv), lambda bi, hi, i: (bi, 0, hi // g, 0)),
    ]
    if mask is not None:
        specs.append(
            pl.BlockSpec(
                (None, None, cfg.bq if vs else 1, t if vt else 1),
                lambda bi, hi, i: (_pick(bi, vb), _pick(hi, vh), _pick(i, vs), 0),
            )
        )
    lse_spec = pl.BlockSpec((None, None, cfg.bq), lambda bi, hi, i: (bi, hi, i))
    out_spec = pl.BlockSpec((None, cfg.bq, None, dv), lambda bi, hi, i: (bi, i, hi, 0))
    lse, out = Spec((b, h, s), jnp.float32), Spec((b, s, h, dv), q.dtype)
    results = launch(
        functools.partial(_forward_kernel, cfg=cfg, stats_only=stats_only),
        grid=(b, h, steps(s, cfg.bq)),
        in_specs=specs,
        out_specs=[lse_spec] if stats_only else [out_spec, lse_spec],
        out_shape=[lse] if stats_only else [out, lse],
        name="fnnc_flash_attention_stats" if stats_only else "fnnc_flash_attention",
        warps=cfg.warps,
        stages=cfg.stages,
    )(*(x for x in (q, k, v, mask) if x is not None))
    return results[0] if stats_only else tuple(results)


def _dq_kernel(q_ref, k_ref, v_ref, *refs, cfg: _Config, want_dmask: bool):
    mask_ref = refs[0] if cfg.mask else None
    go_ref, lse_ref, delta_ref, dq_ref, *dmask_ref = refs[1:] if cfg.mask else refs
    i, bq, bk, t = pl.program_id(2), cfg.bq, cfg.bk, k_ref.shape[0]
    row0 = i * bq
    q, go = _rows(q_ref, None, row0, cfg.s, bq), _rows(go_ref, None, row0, cfg.s, bq)
    lse = _rows(lse_ref, None, row0, cfg.s, bq)
    lse = jnp.where(lse == -jnp.inf, 0.0, lse)[:, None]  # rows that see nothing: p = 0
    delta = _rows(delta_ref, None, row0, cfg.s, bq)[:, None]

    def body(j, dq):
        cols = pl.ds(j * bk, bk)
        k = _rows(k_ref, (cols, slice(None)), j * bk, t, bk)
        v = _rows(v_ref, (cols, slice(None)), j * bk, t, bk)
        tile = _mask_tile(cfg, mask_ref, slice(None), cols, (row0, j * bk))
        p = jnp.exp(_logits(cfg, q, k, row0, j * bk, tile) - lse)
        dp = lax.dot_general(go, v, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        ds = p * (dp - delta)
        if want_dmask:
            inside = both(span(row0, bq, cfg.s, ds.shape, 0), span(j * bk, bk, t, ds.shape, 1))
            store(dmask_ref[0], (slice(None), cols), ds, inside)
        return dq + lax.dot_general(
            ds.astype(k.dtype), k, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )

    # The mask's gradient needs every tile written, so no causal early exit then.
    walk = steps(t, bk) if want_dmask else _key_blocks(cfg, i, t)
    dq = lax.fori_loop(0, walk, body, jnp.zeros(q.shape, jnp.float32))
    store(dq_ref, None, dq * cfg.scale, span(row0, bq, cfg.s, dq.shape, 0))


def _dkv_kernel(q_ref, k_ref, v_ref, *refs, cfg: _Config):
    mask_ref = refs[0] if cfg.mask else None
    go_ref, lse_ref, delta_ref, dk_ref, dv_ref = refs[1:] if cfg.mask else refs
    j, bq, bk, s = pl.program_id(2), cfg.bq, cfg.bk, q_ref.shape[0]
    k, v = _rows(k_ref, None, j * bk, cfg.t, bk), _rows(v_ref, None, j * bk, cfg.t, bk)
    first = 0
    if cfg.causal:  # the first query row that sees key j * bk is j * bk - offset
        first = jnp.minimum(lax.div(jnp.maximum(j * bk - cfg.offset, 0), bq), steps(s, bq))
    dk = jnp.zeros(k.shape, jnp.float32)
    dv = jnp.zeros(v.shape, jnp.float32)
    for head in range(cfg.group):  # the query heads that share this key/value head

        def body(i, carry, head=head):
            dk, dv = carry
            rows, row0 = pl.ds(i * bq, bq), i * bq
            q = _rows(q_ref, (rows, head, slice(None)), row0, s, bq)
            go = _rows(go_ref, (rows, head, slice(None)), row0, s, bq)
            lse = _rows(lse_ref, (head, rows), row0, s, bq)
            lse = jnp.where(lse == -jnp.inf, 0.0, lse)[:, None]
            delta = _rows(delta_ref, (head, rows), row0, s, bq)[:, None]
            tile = _mask_tile(cfg, mask_ref, rows, slice(None), (row0, j * bk), head)
            p = jnp.exp(_logits(cfg, q, k, i * bq, j * bk, tile) - lse)
            dv = dv + lax.dot_general(
                p.astype(go.dtype), go, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32
            )
            dp = lax.dot_general(
                go, v, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
            )
            ds = p * (dp - delta)
            dk = dk + lax.dot_general(
                ds.astype(q.dtype), q, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32
            )
            return dk, dv

        dk, dv = lax.fori_loop(first, steps(s, bq), body, (dk, dv))
    store(dk_ref, None, dk * cfg.scale, span(j * bk, bk, cfg.t, dk.shape, 0))
    store(dv_ref, None, dv, span(j * bk, bk, cfg.t, dv.shape, 0))


def _grads(cfg: _Config, q, k, v, mask, o, lse, go, want_dmask: bool):
    """``(dq, dk, dv, d logits or None)``; ``d logits`` is ``[B, H, S, T]``."""
    b, s, h, d = q.shape
    t, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    g, (vb, vh, vs, vt) = cfg.group, cfg.varies
    go = go.astype(q.dtype)
    delta = jnp.sum(go.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
    delta = jnp.transpose(delta, (0, 2, 1))  # [B, H, S], like lse
    rows_spec = lambda n: pl.BlockSpec((None, cfg.bq, None, n), lambda bi, hi, i: (bi, i, hi, 0))
    keys_spec = lambda n: pl.BlockSpec((None, t, None, n), lambda bi, hi, i: (bi, 0, hi // g, 0))
    stat_spec = pl.BlockSpec((None, None, cfg.bq), lambda bi, hi, i: (bi, hi, i))
    mask_in = [] if mask is None else [mask]
    mask_q = [
        pl.BlockSpec(
            (None, None, cfg.bq if vs else 1, t if vt else 1),
            lambda bi, hi, i: (_pick(bi, vb), _pick(hi, vh), _pick(i, vs), 0),
        )
    ][: len(mask_in)]
    dmask_out = [
        (
            pl.BlockSpec((None, None, cfg.bq, t), lambda bi, hi, i: (bi, hi, i, 0)),
            Spec((b, h, s, t), mask.dtype if mask is not None else q.dtype),
        )
    ][: int(want_dmask)]
    dq, *dmask = launch(
        functools.partial(_dq_kernel, cfg=cfg, want_dmask=want_dmask),
        grid=(b, h, steps(s, cfg.bq)),
        in_specs=[
            rows_spec(d),
            keys_spec(d),
            keys_spec(dv),
            *mask_q,
            rows_spec(dv),
            stat_spec,
            stat_spec,
        ],
        out_specs=[rows_spec(d)] + [o[0] for o in dmask_out],
        out_shape=[Spec(q.shape, q.dtype)] + [o[1] for o in dmask_out],
        name="fnnc_flash_attention_dq",
        warps=cfg.warps,
        stages=cfg.stages,
    )(q, k, v, *mask_in, go, lse, delta)
    group_spec = lambda n: pl.BlockSpec((None, s, g, n), lambda bi, gi, j: (bi, 0, gi, 0))
    key_spec = lambda n: pl.BlockSpec((None, cfg.bk, None, n), lambda bi, gi, j: (bi, j, gi, 0))
    stats_spec = pl.BlockSpec((None, g, s), lambda bi, gi, j: (bi, gi, 0))
    mask_k = [
        pl.BlockSpec(
            (None, g if vh else 1, s if vs else 1, cfg.bk if vt else 1),
            lambda bi, gi, j: (_pick(bi, vb), _pick(gi, vh), 0, _pick(j, vt)),
        )
    ][: len(mask_in)]
    dk, dv_ = launch(
        functools.partial(_dkv_kernel, cfg=cfg),
        grid=(b, hk, steps(t, cfg.bk)),
        in_specs=[
            group_spec(d),
            key_spec(d),
            key_spec(dv),
            *mask_k,
            group_spec(dv),
            stats_spec,
            stats_spec,
        ],
        out_specs=[key_spec(d), key_spec(dv)],
        out_shape=[Spec(k.shape, k.dtype), Spec(v.shape, v.dtype)],
        name="fnnc_flash_attention_dkv",
        warps=cfg.warps,
        stages=cfg.stages,
    )(q, k, v, *mask_in, go, lse, delta)
    return dq, dk, dv_, (dmask[0] if dmask else None)


def _unbroadcast(g: Any, shape: Sequence[int]) -> Any:
    axes = tuple(a for a, n in enumerate(shape) if n == 1 and g.shape[a] != 1)
    return jnp.sum(g, axis=axes, keepdims=True) if axes else g


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfg: _Config, q, k, v, mask):
    return _forward(cfg, q, k, v, mask)[0]


def _attention_fwd(cfg, q, k, v, mask):
    o, lse = _forward(cfg, q, k, v, mask)
    return o, (q, k, v, mask, o, lse)


def _attention_bwd(cfg, residuals, go):
    q, k, v, mask, o, lse = residuals
    want = cfg.mask == "float"
    dq, dk, dv, dlogits = _grads(cfg, q, k, v, mask, o, lse, go, want)
    return dq, dk, dv, (_unbroadcast(dlogits, mask.shape) if want else None)


_attention.defvjp(_attention_fwd, _attention_bwd)


def _mask4(mask: Any) -> Any:
    """The mask as ``[B|1, H|1, S|1, T|1]`` (bools as int8, which every lowering loads)."""
    if mask is None:
        return None
    mask = jnp.reshape(mask, (1,) * (4 - mask.ndim) + tuple(mask.shape))
    return mask.astype(jnp.int8) if mask.dtype == jnp.bool_ else mask


def scaled_dot_product_attention(
    q, k, v, mask=None, *, scale=None, is_causal=False, blocks: Blocks = Blocks()
):
    """The kernel backend: same signature and results as the reference."""
    cfg = _config(q, k, mask, scale, is_causal, blocks)
    return _attention(cfg, q, k, v, _mask4(mask))


def backward(
    grads, inputs, outputs, wants, *, scale, is_causal, blocks: Blocks = Blocks()
) -> tuple[Any, ...]:
    """The command's backward (NNC convention) as kernels; recovers ``lse`` first."""
    (go,), (q, k, v, *mask), (o,) = grads, inputs, outputs
    m = mask[0] if mask else None
    cfg = _config(q, k, m, scale, is_causal, blocks)
    m4 = _mask4(m)
    lse = _forward(cfg, q, k, v, m4, stats_only=True)
    want = cfg.mask == "float" and 3 in wants
    dq, dk, dv, dlogits = _grads(cfg, q, k, v, m4, o, lse, go, want)
    if m is None:
        return dq, dk, dv
    return dq, dk, dv, (jnp.reshape(_unbroadcast(dlogits, m4.shape), m.shape) if want else None)
