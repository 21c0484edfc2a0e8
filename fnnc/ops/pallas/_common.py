"""What the Pallas kernels share: block choice, dtype checks, operand layouts, launching.

Blocks follow the Pallas Triton lowering's rules, so a kernel that runs in interpret
mode here also lowers on a GPU: every array a kernel loads or stores has a
power-of-two size, and matrix-product tiles are at least 16 on each side. Kernels do
not mask partial blocks; a support predicate therefore declines sizes that do not
split into such blocks, and the node falls back to the reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from fnnc.core.command import Spec

FLOATS = (np.dtype(np.float32), np.dtype(jnp.bfloat16), np.dtype(np.float16))
MIN_TILE = 16
"""Smallest block side along a kernel's fast axis (Triton's ``dot`` needs 16)."""


def pow2_block(n: int, cap: int) -> int:
    """The largest power of two ``<= cap`` that divides ``n`` (at least 1)."""
    b = 1
    while b * 2 <= cap and n % (b * 2) == 0:
        b *= 2
    return b


def lane_block(n: int, cap: int, floor: int = MIN_TILE) -> int | None:
    """A power-of-two block dividing ``n``: at least ``floor`` unless it is all of ``n``."""
    b = pow2_block(n, cap)
    return b if n > 0 and (b >= floor or b == n) else None


def lane_reason(what: str, n: int, floor: int = MIN_TILE) -> str:
    return (
        f"{what} {n} does not split into power-of-two blocks of at least {floor} "
        f"(needs a multiple of {floor}, or a power of two); the kernels do not mask ragged blocks"
    )


def row_block(rows: int, lanes: int, budget: int = 4096, cap: int = 16) -> int:
    """Rows per program: a power of two dividing ``rows`` with ``rows * lanes <= budget``."""
    return pow2_block(rows, max(1, min(cap, budget // max(lanes, 1))))


def float_reason(name: str, *specs: Spec | None) -> str | None:
    """Why these specs are not kernel dtypes (``None`` when they all are)."""
    for s in specs:
        if s is not None and np.dtype(s.dtype) not in FLOATS:
            return (
                f"{name}: dtype {np.dtype(s.dtype).name} is not one of float32, bfloat16, float16"
            )
    return None


def trailing(axes: Sequence[int], rank: int) -> bool:
    """Whether sorted non-negative ``axes`` are the last ``len(axes)`` axes."""
    return tuple(axes) == tuple(range(rank - len(axes), rank))


def platform() -> str:
    """The platform kernels are built for: JAX's default backend."""
    return jax.default_backend()


def interpret() -> bool:
    """Pallas runs compiled on GPU and TPU, interpreted anywhere else (CPU tests)."""
    return platform() not in ("gpu", "tpu")


def launch(
    kernel: Callable[..., None],
    *,
    grid: tuple[int, ...],
    in_specs: Sequence[Any],
    out_specs: Any,
    out_shape: Any,
    name: str,
    warps: int = 4,
    stages: int = 2,
) -> Callable[..., Any]:
    """``pl.pallas_call`` in interpret mode off-accelerator, with Triton settings on GPU."""
    params = None
    if platform() == "gpu":
        from jax.experimental.pallas import triton as plgpu

        params = plgpu.CompilerParams(num_warps=warps, num_stages=stages)
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=list(in_specs),
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=params,
        interpret=interpret(),
        name=name,
    )


# --- operands broadcast against a [rows, lanes] output ----------------------------------

FULL, ROW, COL, SCALAR = "full", "row", "col", "scalar"


def operand_kind(shape: Sequence[int], out: Sequence[int]) -> str | None:
    """How an operand broadcasting to ``out`` is blocked, ``None`` if it cannot be.

    ``full``: ``out`` itself; ``row``: varies along the last axis only (a bias);
    ``col``: the last axis is 1 and the rest is ``out``'s (per-row scales);
    ``scalar``: one value.
    """
    shape, out = tuple(shape), tuple(out)
    if shape == out:
        return FULL
    if math.prod(shape) == 1:
        return SCALAR
    lead = [1] * (len(out) - len(shape)) + list(shape)
    if len(lead) != len(out) or not out:
        return None
    if lead[-1] == out[-1] and math.prod(lead[:-1]) == 1:
        return ROW
    if lead[-1] == 1 and tuple(lead[:-1]) == out[:-1]:
        return COL
    return None


def as_operand(x: Any, kind: str, rows: int, lanes: int) -> Any:
    """``x`` reshaped to the 2-D layout of its kind (bools as int8 for the kernels)."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int8)
    shape = {FULL: (rows, lanes), ROW: (1, lanes), COL: (rows, 1), SCALAR: (1, 1)}[kind]
    return jnp.reshape(x, shape)


def operand_spec(kind: str, br: int, bl: int) -> pl.BlockSpec:
    """The block of an operand of ``kind`` for a program at (row block, lane block)."""
    if kind == FULL:
        return pl.BlockSpec((br, bl), lambda i, j: (i, j))
    if kind == ROW:
        return pl.BlockSpec((1, bl), lambda i, j: (0, j))
    if kind == COL:
        return pl.BlockSpec((br, 1), lambda i, j: (i, 0))
    return pl.BlockSpec((1, 1), lambda i, j: (0, 0))


def reduce_partials(partial: Any, kind: str, shape: Sequence[int], dtype: Any) -> Any:
    """Sums per-block partial gradients of a broadcast operand back to its ``shape``."""
    if kind == ROW:
        total = jnp.sum(partial, axis=0)
    elif kind == COL:
        total = jnp.sum(partial, axis=1)
    elif kind == SCALAR:
        total = jnp.sum(partial)
    else:
        total = partial
    return jnp.reshape(total, tuple(shape)).astype(dtype)
