"""Flash attention's tiles, shared by its forward and backward kernels: the settings a
program is built for (:class:`Config`), the masked scaled logits of one tile, rows
loaded with a ragged end, mask tiles, and the key blocks a causal query block needs.
See :mod:`fnnc.ops.pallas.scaled_dot_product_attention`."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax.numpy as jnp
from jax import lax

from fnnc.ops.pallas._common import both, load, ref_at, span, steps

LOG2E = 1.0 / math.log(2.0)
"""``log2(e)``: the kernels' logits are in base 2 (see :func:`tile_logits`)."""


@dataclasses.dataclass(frozen=True)
class Config:
    """What one attention program is built for: its hyper-parameters, mask layout, head
    grouping, blocks, lengths and Triton settings (hashable: a ``custom_vjp`` static)."""

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


def tile_logits(
    cfg: Config, q: Any, k: Any, row0: Any, col0: Any, m: Any, causal: bool | None = None
) -> Any:
    """Masked, scaled ``q kᵀ`` of one tile in float32 and in base 2, that is times
    ``log2(e)`` (dropped keys are ``-inf``). ``causal=False`` skips the causal mask of a
    causal program: for a tile that lies wholly on or under the diagonal (see
    :func:`walk`).

    Base 2 because the softmax's exponentials are then ``exp2``: Pallas lowers float32
    ``jnp.exp`` on NVIDIA GPUs to libdevice's ``__nv_expf`` (range reduction around the
    hardware's ``ex2``), ``jnp.exp2`` to ``__nv_exp2f`` (the ``ex2`` alone), and the
    scale folds into the one multiply every tile already had, as Triton's and
    FlashAttention's kernels do. The exponentials and the scale are most of a tile's
    non-tensor-core instructions, which bound a 16-bit tile at ``D = 64`` on a Hopper
    GPU as much as its two products do. The row statistics are in base 2 too (the max
    ``m`` and ``log2`` of the sum)."""
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    s = s * (cfg.scale * LOG2E)
    keep = None
    if cfg.mask == "float":
        s = s + _base2(m.astype(jnp.float32))
    elif cfg.mask == "bool":
        keep = jnp.broadcast_to(m != 0, s.shape)
    if cfg.causal if causal is None else causal:
        rows = row0 + lax.broadcasted_iota(jnp.int32, s.shape, 0)
        cols = col0 + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        visible = cols <= rows + cfg.offset
        keep = visible if keep is None else keep & visible
    inside = both(span(row0, cfg.bq, cfg.s, s.shape, 0), span(col0, cfg.bk, cfg.t, s.shape, 1))
    keep = both(keep, inside)  # ragged blocks: rows / keys past S / T see nothing
    return s if keep is None else jnp.where(keep, s, -jnp.inf)


def _base2(m: Any) -> Any:
    """A float mask tile times ``log2(e)``, kept finite where it was: a mask at float32's
    lowest (``finfo.min``, the usual "masked" value) overflowed to ``-inf``, so a row
    masked wholly with it attended nothing (zeros) where the reference's softmax of equal
    logits is uniform (the mean of ``v``). ``-inf`` stays ``-inf``, as in the reference.
    Every mask value below ``lowest / log2(e)`` (about -2.36e38) becomes ``lowest``, so
    such values are equal here where the reference still tells them apart: a mask uses
    one "masked" number, which is exact."""
    lowest = jnp.finfo(jnp.float32).min
    return jnp.where(m == -jnp.inf, m, jnp.maximum(m * LOG2E, lowest))


def tile_rows(ref: Any, idx: Any, row0: Any, n: int, size: int) -> Any:
    """``ref[idx]``, a tile whose axis 0 is rows ``row0...`` of ``n`` (0 past ``n``)."""
    view = ref_at(ref, idx)
    return load(view, None, span(row0, size, n, view.shape, 0))


def mask_tile(cfg: Config, ref: Any, rows: Any, cols: Any, rc0: Any, head: Any = None) -> Any:
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


def key_blocks(cfg: Config, i: Any, t: int) -> Any:
    """Key blocks query block ``i`` needs: all, or up to its last visible key (causal)."""
    if not cfg.causal:
        return steps(t, cfg.bk)
    last = (i + 1) * cfg.bq + cfg.offset  # one past the last visible key
    return jnp.clip(lax.div(jnp.maximum(last, 0) + cfg.bk - 1, cfg.bk), 0, steps(t, cfg.bk))


def full_key_blocks(cfg: Config, i: Any, t: int) -> Any:
    """Causal: how many key blocks query block ``i`` sees whole (its first row, the one
    that sees least, sees their last key): ``j + 1 <= (i bq + offset + 1) / bk``."""
    n = lax.div(jnp.maximum(i * cfg.bq + cfg.offset + 1, 0), cfg.bk)
    return jnp.minimum(n, steps(t, cfg.bk))


def first_full_query_block(cfg: Config, j: Any, s: int) -> Any:
    """Causal: the first query block that sees key block ``j`` whole (and so do all
    after it): ``i bq + offset >= (j + 1) bk - 1``."""
    need = jnp.maximum((j + 1) * cfg.bk - 1 - cfg.offset, 0)
    return jnp.minimum(lax.div(need + cfg.bq - 1, cfg.bq), steps(s, cfg.bq))


def walk(
    cfg: Config, body: Any, lo: Any, hi: Any, init: Any, split: Any = None, masked_first=False
) -> Any:
    """``fori_loop`` of ``body(index, carry, causal=...)`` over ``[lo, hi)``.

    A causal program's walk is split at ``split``: the tiles before it (after it, with
    ``masked_first``) lie wholly on or under the diagonal, so their logits skip the
    causal mask, which is built only for the tiles the diagonal crosses, as
    the Triton flash-attention tutorial's two stages do (``S / bq`` of the ``S / bq
    (S / bq + 1) / 2`` tiles of a square causal program)."""
    if not cfg.causal or split is None:
        return lax.fori_loop(lo, hi, functools.partial(body, causal=cfg.causal), init)
    split = jnp.clip(split, lo, hi)
    first, second = masked_first, not masked_first
    carry = lax.fori_loop(lo, split, functools.partial(body, causal=first), init)
    return lax.fori_loop(split, hi, functools.partial(body, causal=second), carry)


def pick(pid: Any, varies: bool) -> Any:
    return pid if varies else 0
