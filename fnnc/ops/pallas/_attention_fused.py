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

It needs the softmax statistics (``m``, ``log2 l``) before its first tile: given by the
forward under ``jax.grad``. A graph's backward has ``O``, not them: it calls the forward
kernel again, the call the forward node made, with the same operands and settings, so
that XLA's common subexpression elimination can merge the two in one program and the
statistics cost nothing
(where it does not, the call costs a forward: two products a tile; a kept profile
shows which, by the forward kernels it counts). A float mask whose gradient is wanted
runs the split kernels, which write the logits' gradient tile by tile.

Its tiles need more shared memory than either split kernel's (:func:`shared_bytes`):
float32 at ``D = Dv = 128`` does not fit a Hopper SM, so ``supports`` declines it.
"""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp

from fnnc.core.command import Spec
from fnnc.ops.pallas._attention_grads import delta_of, dkv_kernel, key_walk_specs
from fnnc.ops.pallas._attention_tiles import Config
from fnnc.ops.pallas._common import launch, steps

SHARED_BYTES = 227 * 1024
"""Shared memory a Triton program may use on a Hopper SM (H100, H200): 232448 bytes,
XLA's "available" when a kernel asks for more."""


def shared_bytes(bq: int, bk: int, stages: int, d: int, dv: int, itemsize: int) -> int:
    """Shared memory the fused kernel needs at query / key blocks ``bq`` x ``bk`` (as it
    runs them: the lengths padded to a power of two, capped), ``stages`` pipelining
    stages, head sizes ``d``, ``dv`` and inputs of ``itemsize`` bytes: the K and V tiles
    it keeps, ``stages`` tiles each of the Q and dO it streams (and of the float32 rows
    of ``m``, ``log2 l`` and ``delta``), the float32 ``[bq, D]`` dQ tile it adds out, and
    one ``[bq, bk]`` tile of P / dS as a product's operand in the inputs' dtype.

    Calibrated on an H200 (2026-11-28), where float32 at 64 x 64 blocks, 2 stages,
    ``D = Dv = 128`` asked for 246784 bytes, this sum exactly with one row of
    statistics (a logsumexp then; two rows now: ``stages * bq * 4`` more); 16-bit inputs at
    ``D = 128`` (137 KiB here) and float32 at ``D = 64`` (129 KiB) ran."""
    kept = bk * (d + dv) * itemsize
    streamed = stages * (bq * (d + dv) * itemsize + 3 * bq * 4)
    return kept + streamed + bq * d * 4 + bq * bk * itemsize


def fused_grads(cfg: Config, q, k, v, mask, o, stats, go) -> tuple[Any, Any, Any]:
    """``(dq, dk, dv)`` from one kernel (see the module doc); ``stats`` are the forward's
    ``(m, log2 l)``, each ``[B, H, S]``."""
    b, s, _, d = q.shape
    t, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    go = go.astype(q.dtype)
    in_specs, out_specs, group_spec = key_walk_specs(cfg, s, d, dv, mask)
    mask_in = [] if mask is None else [mask]
    inputs = (q, k, v, *mask_in, go, *stats, delta_of(go, o), jnp.zeros(q.shape, jnp.float32))
    dk, dv_, dq = launch(
        functools.partial(dkv_kernel, cfg=cfg, fused=True),
        grid=(b, hk, steps(t, cfg.bk)),
        in_specs=[*in_specs, group_spec(d)],
        out_specs=[*out_specs, group_spec(d)],
        out_shape=[Spec(k.shape, k.dtype), Spec(v.shape, v.dtype), Spec(q.shape, jnp.float32)],
        name="fnnc_flash_attention_fused_backward",
        warps=cfg.warps,
        stages=cfg.stages,
        aliases={len(inputs) - 1: 2},  # dQ accumulates into the zeros given
    )(*inputs)
    return (dq * cfg.scale).astype(q.dtype), dk, dv_
