"""Pallas ``scaled_dot_product_attention``: flash attention, forward and backward kernels.

Semantics are the command's exactly (see :mod:`fnnc.ops.attention`): layout
``[B, S, H, D]``, grouped key/value heads (query head ``h`` reads ``h // (H // Hk)``),
``scale=None`` meaning ``1 / sqrt(D)``, a bool mask (True keeps) or a float mask
(added) broadcasting to ``[B, H, S, T]``, causal masking aligned bottom-right
(query ``i`` sees keys ``j <= i + T - S``) and zeros for a query that sees no key.

- forward, grid ``(B, H, S / bq)``: one query block stays put while key/value blocks
  of ``bk`` stream past; an online softmax keeps the running max ``m`` and sum ``l``
  (masked logits are ``-inf``; a row whose max is still ``-inf`` contributes nothing).
  It writes the backward's residual, the row statistics ``m`` and ``log2(l)`` (base 2;
  0 for a row that sees no key), two numbers because one logsumexp loses ``log2(l)`` at
  a huge ``m`` (a row masked wholly with float32's lowest number: p = 1, not 1 / T).
  Causal programs stop at their last visible key block, and build the causal mask
  only for the tiles the diagonal crosses (:func:`walk`).
- backward: ``delta = sum(dO * O)`` per row (XLA, a cheap reduction); a dK/dV kernel
  with grid ``(B, Hk, T / bk)`` walks the query blocks of the ``H / Hk`` heads that
  share its key/value head (causal programs start at their first visible query block),
  and a dQ kernel with grid ``(B, H, S / bq)`` walks the key blocks. With a float
  mask the dQ kernel also writes the logits' gradient, which is the mask's gradient
  before it is summed back to the mask's broadcast shape.

The graph's ``gradient`` node gets ``O`` but not the statistics. Its kernel backward
runs the dQ kernel in online mode: the softmax statistics accumulate as in the forward,
dQ is rescaled as the running max grows and divided by the row sum at the end, and the
kernel writes the statistics for the dK/dV kernel, so no product is spent on recovering
them. Only where the float mask's gradient is wanted (written tile by tile, so it needs
the statistics first) does the forward kernel run in statistics-only mode beforehand.

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
three stages), for 16-bit tiles that fit shared memory; ``"pallas_split"`` runs that
forward with backward kernels blocked apart (:data:`SPLIT`); ``"pallas_fused"`` runs
FlashAttention-2's one-kernel backward (:data:`FUSED`,
:mod:`fnnc.ops.pallas._attention_fused`: five products a tile pair where the split
kernels run seven, dQ summed with float32 atomic adds, so not bit-for-bit repeatable).
None has a priority: each becomes a default only where
``python -m fnnc.ops.measure_defaults`` timed it faster. The backward kernels pass
the statistics and ``delta`` as whole arrays, so each kernel may have its own blocks.
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

from fnnc.core.command import Command, Spec
from fnnc.core.selection import selection_precision
from fnnc.ops.attention import scaled_dot_product_attention as _command
from fnnc.ops.pallas import _derivatives
from fnnc.ops.pallas._attention_fused import SHARED_BYTES as FUSED_SHARED_BYTES
from fnnc.ops.pallas._attention_fused import fused_grads
from fnnc.ops.pallas._attention_fused import shared_bytes as fused_shared_bytes
from fnnc.ops.pallas._attention_grads import kernel_grads
from fnnc.ops.pallas._attention_tiles import (
    Config,
    full_key_blocks,
    key_blocks,
    mask_tile,
    pick,
    tile_logits,
    tile_rows,
    walk,
)
from fnnc.ops.pallas._common import (
    MIN_TILE,
    float_reason,
    lane_block,
    launch,
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
    software-pipelining stages; the backward kernels may have blocks and stages of
    their own (``None``: the forward's)."""

    q: int | None = None
    k: int | None = None
    warps: int | None = None
    stages: int = 2
    shared_bytes: int | None = None
    """Where set, inputs whose pipelined tiles would pass it are declined: each kernel
    keeps its stationary block and ``stages`` streamed blocks of two operands (K and V,
    or Q and dO) in shared memory, ``(stationary + stages * streamed) * (D + Dv) *
    itemsize`` bytes (a Hopper SM has 227 KiB); the fused backward's tiles are counted
    in full (:func:`fnnc.ops.pallas._attention_fused.shared_bytes`)."""
    dq: tuple[int, int] | None = None
    """The dQ kernel's largest query and key blocks (it keeps a query block, streams keys)."""
    dkv: tuple[int, int] | None = None
    """The dK/dV kernel's largest query and key blocks (it keeps a key block, streams
    queries)."""
    backward_stages: int | None = None
    """The backward kernels' pipelining stages (``None``: :attr:`stages`)."""
    fused: bool = False
    """One backward kernel (:mod:`fnnc.ops.pallas._attention_fused`: the dK/dV walk adds
    dQ in with atomics) at the dK/dV kernel's blocks, where the mask's gradient is not
    wanted."""

    def kernels(self) -> dict[str, tuple[int, int, int]]:
        """Each kernel's ``(query block, key block, stages)`` caps."""
        fwd = (self.q or BLOCK_Q, self.k or BLOCK_K)
        back = self.stages if self.backward_stages is None else self.backward_stages
        return {
            "forward": (*fwd, self.stages),
            "dQ": (*(self.dq or fwd), back),
            "dK/dV": (*(self.dkv or fwd), back),
        }

    def overflow(self, q: Spec, k: Spec, v: Spec) -> str | None:
        """Why these inputs' tiles do not fit :attr:`shared_bytes`; ``None`` if they do."""
        if self.shared_bytes is None:
            return None
        d, dv, itemsize = q.shape[3], v.shape[3], q.dtype.itemsize
        for kernel, (bq, bk, stages) in self.kernels().items():
            if self.fused and kernel == "dK/dV":  # the fused backward runs at its blocks
                kernel = "fused backward"
                bq, bk = _lanes(q.shape[1], k.shape[1], bq, bk)
                size = fused_shared_bytes(bq, bk, stages, d, dv, itemsize)
            else:
                kept, streamed = (bk, bq) if kernel == "dK/dV" else (bq, bk)
                size = (kept + stages * streamed) * (d + dv) * itemsize
            if size > self.shared_bytes:
                return (
                    f"{NAME}: the {kernel} kernel's {bq} x {bk} blocks in {stages} stages "
                    f"need {size // 1024} KiB of shared memory at D={q.shape[3]}, "
                    f"Dv={v.shape[3]}, {q.dtype}; {self.shared_bytes // 1024} KiB are allowed"
                )
        return None


WIDE = Blocks(q=128, k=64, warps=4, stages=3, shared_bytes=160 * 1024)
"""The ``"pallas_bq128"`` backend's settings: the query block and pipelining depth of
Triton's flash-attention tutorial for Hopper at ``D = 64``. Never a default by
priority: it is one more candidate that ``python -m fnnc.ops.measure_defaults`` (or
``Model.autotune``) times against the 64 x 64 kernel and XLA."""

SPLIT = Blocks(
    q=128, k=64, warps=4, stages=3, shared_bytes=160 * 1024,
    dq=(128, 32), dkv=(32, 128), backward_stages=4,
)  # fmt: skip
"""The ``"pallas_split"`` backend's settings: :data:`WIDE`'s forward, and backward
kernels whose stationary block is wide and streamed block narrow (dQ keeps 128 queries
and streams 32 keys, dK/dV keeps 128 keys and streams 32 queries), as the backward of
Triton's flash-attention tutorial blocks them. Also a candidate only: chosen where timed
faster."""

FUSED = Blocks(fused=True, shared_bytes=FUSED_SHARED_BYTES)
"""The ``"pallas_fused"`` backend's settings: the default blocks, and FlashAttention-2's
one-kernel backward (five products a tile pair, not seven; dQ summed with float32
atomic adds, so not bit-for-bit repeatable). A candidate only, chosen where timed
faster. Its backward keeps more tiles than the split kernels, all counted, so it
declines what passes a Hopper SM's 227 KiB (float32 at ``D = Dv = 128``)."""

scaled_dot_product_attention_reference = _command.definition.forward
"""The command's reference forward (the ``"xla"`` backend), which the kernel matches."""


def wins(cmd: Command, specs: Sequence[Spec]) -> bool:
    """Where flash attention wins by construction (its priority): where its products run
    on tensor cores, that is 16-bit inputs, or float32 under a matmul policy below full
    float32. At full float32 precision Triton multiplies without them: on an H200 the
    kernel took 1.37 ms where XLA took 0.078 ms ([2, 512, 8, 64]), so there it is the
    default only where measured faster (the H200's large float32 class). The precision
    is the program's (``compile(matmul_precision=...)``), else the configured one."""
    if specs[0].dtype.itemsize <= 2:
        return True
    return selection_precision() != "float32"


def supports(cmd: Command, specs: Sequence[Spec], blocks: Blocks = Blocks()) -> str | None:
    """``None`` when the kernels run these inputs, else the reason (see module doc)."""
    q, k, v, *rest = specs
    too_big = blocks.overflow(q, k, v)
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


def _lanes(s: int, t: int, bq: int, bk: int) -> tuple[int, int]:
    """The query and key blocks the kernels run for lengths ``s``, ``t`` under the caps
    ``bq``, ``bk``: each length padded to a power of two, within ``[MIN_TILE, cap]``."""
    return lane_block(s, bq, MIN_TILE), lane_block(t, bk, MIN_TILE)


def _config(
    q: Any, k: Any, mask: Any, scale: Any, causal: bool, blocks: Blocks = Blocks()
) -> Config:
    (_, s, h, d), t = q.shape, k.shape[1]
    kind, varies = "", (False,) * 4
    if mask is not None:
        kind = "bool" if mask.dtype == jnp.bool_ else "float"
        varies = tuple(n != 1 for n in (1,) * (4 - mask.ndim) + tuple(mask.shape))
    bq, bk = _lanes(s, t, blocks.q or BLOCK_Q, blocks.k or BLOCK_K)
    scale = 1 / math.sqrt(d) if scale is None else scale
    group = h // k.shape[2]
    warps = blocks.warps or (4 if d <= 64 else 8)
    return Config(
        float(scale), bool(causal), t - s, kind, varies, group, bq, bk, s, t, warps, blocks.stages
    )


def _backward_configs(cfg: Config, blocks: Blocks) -> tuple[Config, Config]:
    """The dQ and dK/dV kernels' configs: the forward's, with their own blocks and stages."""
    caps = blocks.kernels()

    def of(bq: int, bk: int, stages: int) -> Config:
        bq, bk = _lanes(cfg.s, cfg.t, bq, bk)
        return dataclasses.replace(cfg, bq=bq, bk=bk, stages=stages)

    return of(*caps["dQ"]), of(*caps["dK/dV"])


def _forward_kernel(q_ref, k_ref, v_ref, *refs, cfg: Config, stats_only: bool):
    mask_ref = refs[0] if cfg.mask else None
    *o_ref, m_ref, l_ref = refs[1:] if cfg.mask else refs
    i, bq, bk, t = pl.program_id(2), cfg.bq, cfg.bk, k_ref.shape[0]
    q = tile_rows(q_ref, None, i * bq, cfg.s, bq)

    def body(j, carry, causal):
        acc, m, total = carry
        cols = pl.ds(j * bk, bk)
        tile = mask_tile(cfg, mask_ref, slice(None), cols, (i * bq, j * bk))
        k = tile_rows(k_ref, (cols, slice(None)), j * bk, t, bk)
        s = tile_logits(cfg, q, k, i * bq, j * bk, tile, causal)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        p = jnp.exp2(s - m_safe[:, None])  # base 2: see tile_logits
        alpha = jnp.exp2(m - m_safe)
        total = alpha * total + jnp.sum(p, axis=1)
        if not stats_only:
            v = tile_rows(v_ref, (cols, slice(None)), j * bk, t, bk)
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
    split = full_key_blocks(cfg, i, t) if cfg.causal else None
    acc, m, total = walk(cfg, body, 0, key_blocks(cfg, i, t), init, split)
    empty = total == 0
    rows = span(i * bq, bq, cfg.s, (bq,), 0)
    store(m_ref, None, jnp.where(empty, 0.0, m), rows)
    store(l_ref, None, jnp.log2(jnp.where(empty, 1.0, total)), rows)
    if not stats_only:
        o = acc / jnp.where(empty, 1.0, total)[:, None]
        store(o_ref[0], None, o, span(i * bq, bq, cfg.s, o.shape, 0))


def _forward(cfg: Config, q, k, v, mask, *, stats_only=False):
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
                lambda bi, hi, i: (pick(bi, vb), pick(hi, vh), pick(i, vs), 0),
            )
        )
    stat_spec = pl.BlockSpec((None, None, cfg.bq), lambda bi, hi, i: (bi, hi, i))
    out_spec = pl.BlockSpec((None, cfg.bq, None, dv), lambda bi, hi, i: (bi, i, hi, 0))
    stat, out = Spec((b, h, s), jnp.float32), Spec((b, s, h, dv), q.dtype)
    results = launch(
        functools.partial(_forward_kernel, cfg=cfg, stats_only=stats_only),
        grid=(b, h, steps(s, cfg.bq)),
        in_specs=specs,
        out_specs=[out_spec][: not stats_only] + [stat_spec] * 2,
        out_shape=[out][: not stats_only] + [stat] * 2,
        name="fnnc_flash_attention_stats" if stats_only else "fnnc_flash_attention",
        warps=cfg.warps,
        stages=cfg.stages,
    )(*(x for x in (q, k, v, mask) if x is not None))
    # (o, (m, log2 l)), or the statistics alone
    return tuple(results) if stats_only else (results[0], tuple(results[1:]))


def _unbroadcast(g: Any, shape: Sequence[int]) -> Any:
    axes = tuple(a for a, n in enumerate(shape) if n == 1 and g.shape[a] != 1)
    return jnp.sum(g, axis=axes, keepdims=True) if axes else g


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfgs: tuple[Config, Config, Config, bool], q, k, v, mask):
    """Attention with the forward, dQ and dK/dV kernels' configs ``cfgs`` (and whether
    the backward is the fused kernel)."""
    return _forward(cfgs[0], q, k, v, mask)[0]


def _attention_fwd(cfgs, q, k, v, mask):
    o, stats = _forward(cfgs[0], q, k, v, mask)
    return o, (q, k, v, mask, o, stats)


def _attention_bwd(cfgs, residuals, go):
    q, k, v, mask, o, stats = residuals
    want = cfgs[0].mask == "float"
    if cfgs[3] and not want:
        return (*fused_grads(cfgs[2], q, k, v, mask, o, stats, go), None)
    dq, dk, dv, dlogits = kernel_grads(*cfgs[1:3], q, k, v, mask, o, stats, go, want)
    return dq, dk, dv, (_unbroadcast(dlogits, mask.shape) if want else None)


def _attention_reference(cfgs, q, k, v, mask):
    """The reference attention on the kernels' operands (a bool mask came as int8)."""
    if mask is not None and cfgs[0].mask == "bool":
        mask = mask.astype(jnp.bool_)
    cfg = cfgs[0]
    return _command.definition.forward(q, k, v, mask, scale=cfg.scale, is_causal=cfg.causal)


_derivatives.defvjp(_attention, _attention_fwd, _attention_bwd, _attention_reference)


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
    cfgs = (cfg, *_backward_configs(cfg, blocks), blocks.fused)
    return _attention(cfgs, q, k, v, _mask4(mask))


def backward(
    grads, inputs, outputs, wants, *, scale, is_causal, blocks: Blocks = Blocks()
) -> tuple[Any, ...]:
    """The command's backward (NNC convention) as kernels; the dQ kernel finds the
    softmax statistics."""
    (go,), (q, k, v, *mask), (o,) = grads, inputs, outputs
    m = mask[0] if mask else None
    cfg = _config(q, k, m, scale, is_causal, blocks)
    m4 = _mask4(m)
    want = cfg.mask == "float" and 3 in wants
    if blocks.fused and not want:
        # It needs the statistics before its first tile: from the forward kernel's own
        # call, the one the forward node ran, with the same operands and settings, which
        # XLA's common subexpression elimination merges with it in one program
        stats = _forward(cfg, q, k, v, m4)[1]
        dq, dk, dv = fused_grads(_backward_configs(cfg, blocks)[1], q, k, v, m4, o, stats, go)
        return (dq, dk, dv) if m is None else (dq, dk, dv, None)
    # the mask's gradient is written tile by tile, so it needs the statistics first: a
    # statistics-only forward pass; otherwise the dQ kernel finds them online
    stats = _forward(cfg, q, k, v, m4, stats_only=True) if want else None
    dq, dk, dv, dlogits = kernel_grads(
        *_backward_configs(cfg, blocks), q, k, v, m4, o, stats, go, want
    )
    if m is None:
        return dq, dk, dv
    return dq, dk, dv, (jnp.reshape(_unbroadcast(dlogits, m4.shape), m.shape) if want else None)
