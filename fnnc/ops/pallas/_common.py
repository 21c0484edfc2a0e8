"""What the Pallas kernels share: block choice, dtype checks, operand layouts, launching.

Blocks follow the Pallas Triton lowering's rules, so a kernel that runs in interpret
mode here also lowers on a GPU: every array a kernel loads or stores has a
power-of-two size, and matrix-product tiles are at least 16 on each side. A size that
is not a multiple of its block is walked in ``cdiv(n, block)`` blocks and the ragged
last one is *masked*: :func:`load` fills the lanes past the end with a neutral value
(``-inf`` for a max or logsumexp, 0 for a sum or a product's operand) and
:func:`store` leaves them alone. Masks are built from ``iota`` only where a size is
ragged, so evenly blocked shapes lower exactly as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

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


def next_pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    return 1 << max(0, int(n) - 1).bit_length()


def lane_block(n: int, cap: int, floor: int = 1) -> int:
    """A power-of-two block for ``n`` elements: ``n`` padded up, within ``[floor, cap]``.

    ``n`` need not be a multiple: the last of ``cdiv(n, block)`` blocks is masked.
    """
    return max(floor, min(cap, next_pow2(n)))


def steps(n: int, block: int) -> int:
    """Blocks of ``block`` that cover ``n`` (the last one ragged if ``n % block``)."""
    return pl.cdiv(n, block)


def span(start: Any, size: int, n: int, shape: Sequence[int], axis: int) -> Any:
    """``start + iota < n`` along ``axis`` of a ``shape`` tile; ``None`` when never ragged.

    ``size`` is the block along ``axis``; a size ``n`` that is a multiple of it needs
    no mask (every block is full), so none is built.
    """
    if n % size == 0:
        return None
    return start + lax.broadcasted_iota(jnp.int32, tuple(shape), axis) < n


def both(a: Any, b: Any) -> Any:
    """The conjunction of two masks, either of which may be ``None`` (all true)."""
    if a is None or b is None:
        return b if a is None else a
    return a & b


def ref_at(ref: Any, idx: Any) -> Any:
    """``ref.at[idx]``; integer indices as int32 scalars (interpret mode needs arrays)."""
    if idx is None:
        return ref
    idx = idx if isinstance(idx, tuple) else (idx,)
    return ref.at[tuple(jnp.int32(i) if isinstance(i, int) else i for i in idx)]


def load(ref: Any, idx: Any = None, mask: Any = None, other: Any = 0) -> Any:
    """``ref[idx]``, with lanes where ``mask`` is false read as ``other`` (not read at all)."""
    view = ref_at(ref, idx)
    if mask is None:
        return view[...]
    return plgpu.load(view, mask=mask, other=jnp.asarray(other, view.dtype))


def store(ref: Any, idx: Any, value: Any, mask: Any = None) -> None:
    """``ref[idx] = value`` (cast to the ref's dtype), skipping lanes where ``mask`` is false."""
    view = ref_at(ref, idx)
    value = value.astype(view.dtype)
    if mask is None:
        view[...] = value
        return
    plgpu.store(view, value, mask=mask)


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
    aliases: dict[int, int] | None = None,
) -> Callable[..., Any]:
    """``pl.pallas_call`` in interpret mode off-accelerator, with Triton settings on GPU;
    ``aliases`` maps an input's index to the output that reuses (and starts from) it."""
    params = None
    if platform() == "gpu":
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
        input_output_aliases=aliases or {},
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
