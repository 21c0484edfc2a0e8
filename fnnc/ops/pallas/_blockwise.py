"""Running a function of tiles over a ``[rows, lanes]`` grid, and its VJP, as kernels.

:mod:`~fnnc.ops.pallas.fused_elementwise` generates its kernels with these: the
function is the fused body traced over one tile of every operand (full, row, column or
scalar tiles, see :func:`~fnnc.ops.pallas._common.operand_kind`), and the backward
kernel traces a :data:`Pull` of the same tiles (the body's members' own backwards). A
broadcast operand's gradient is summed within a tile by the pull (its broadcast is in
the traced body); each program writes that partial sum to its own slot, and XLA adds
the slots up.

Rows split evenly (the row block divides them); lanes are walked in ``cdiv(L, bl)``
power-of-two blocks and a ragged last block is masked: tiles read 0 past ``L``,
nothing is stored there, and in the backward a column or scalar operand is widened to
the full tile before the VJP so that its sum over lanes can leave the missing lanes
out (their values are junk, e.g. ``log(0)``, and must not reach the sum as ``0 * inf``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
from jax.experimental import pallas as pl

from fnnc.core.command import Spec
from fnnc.ops.pallas._common import (
    COL,
    FULL,
    ROW,
    SCALAR,
    launch,
    load,
    operand_spec,
    reduce_partials,
    span,
    steps,
    store,
)
from fnnc.ops.pallas._triton import lowerable

Operands = Sequence[tuple[Any, str]]
"""``(array in its 2-D layout, kind)`` pairs."""


Pull = Callable[[list[Any], Sequence[Any]], list[Any]]
"""``pull(tiles, cts)``: the tiles' gradients for output gradients ``cts``, in float32
(``None`` for non-float tiles); :func:`vjp_call` sums the partials in float32 and
rounds each gradient to its operand's type once."""


def _lane_mask(ref: Any, bl: int, lanes: int) -> Any:
    """Lanes of this program's tile of ``ref`` that lie before ``L`` (``None``: all do)."""
    if ref.shape[1] != bl:  # a column or scalar tile: no lane axis
        return None
    return span(pl.program_id(1) * bl, bl, lanes, ref.shape, 1)


def _store(*refs: Any, fn: Callable[..., Any], n_in: int, bl: int, lanes: int) -> None:
    """Stores ``fn`` of the first ``n_in`` refs' tiles into the remaining (output) refs."""
    tiles = (load(r, None, _lane_mask(r, bl, lanes)) for r in refs[:n_in])
    # Rules apply to what the kernel runs, after the VJP is taken (exact derivatives).
    outs = [o for o in lowerable(fn)(*tiles) if o is not None]
    for ref, value in zip(refs[n_in:], outs):
        store(ref, None, value, _lane_mask(ref, bl, lanes))


def _masked_vjp(pull: Pull, kinds: Sequence[str], bl: int, lanes: int) -> Any:
    """``pull`` whose column/scalar gradients leave out lanes past ``L``."""
    n = len(kinds)

    def grad_fn(*tiles_and_cts: Any) -> list[Any]:
        tiles, cts = list(tiles_and_cts[:n]), tiles_and_cts[n:]
        wide = cts[0].shape
        keep = span(pl.program_id(1) * bl, bl, lanes, wide, 1)
        if keep is None:
            return pull(tiles, cts)
        narrow = [
            k in (COL, SCALAR) and jnp.issubdtype(t.dtype, jnp.floating)
            for t, k in zip(tiles, kinds)
        ]
        tiles = [jnp.broadcast_to(t, wide) if w else t for t, w in zip(tiles, narrow)]
        grads = pull(tiles, cts)
        for i, (g, k) in enumerate(zip(grads, kinds)):
            if narrow[i]:
                g = jnp.sum(jnp.where(keep, g, 0.0), axis=1, keepdims=True)
                grads[i] = jnp.sum(g, axis=0, keepdims=True) if k == SCALAR else g
        return grads

    return grad_fn


def call(
    fn: Callable[..., Any],
    operands: Operands,
    shape: tuple[int, int],
    blocks: tuple[int, int],
    dtypes: Sequence[Any],
) -> tuple[Any, ...]:
    """``fn`` over the tiles of ``operands``: one ``shape`` array per output of ``fn``."""
    (rows, lanes), (br, bl) = shape, blocks
    return tuple(
        launch(
            lambda *refs: _store(*refs, fn=fn, n_in=len(operands), bl=bl, lanes=lanes),
            grid=(rows // br, steps(lanes, bl)),
            in_specs=[operand_spec(k, br, bl) for _, k in operands],
            out_specs=[operand_spec(FULL, br, bl)] * len(dtypes),
            out_shape=[Spec(shape, d) for d in dtypes],
            name="fnnc_fused_elementwise",
        )(*(x for x, _ in operands))
    )


def _partial(kind: str, shape: tuple[int, int], blocks: tuple[int, int]) -> tuple[Any, Spec]:
    """Block and array of the per-program partial gradients of an operand of ``kind``."""
    (rows, lanes), (br, bl) = shape, blocks
    grid = (rows // br, steps(lanes, bl))
    block = {FULL: (br, bl), ROW: (1, bl), COL: (br, 1), SCALAR: (1, 1)}[kind]
    size = {FULL: shape, ROW: (grid[0], lanes), COL: (rows, grid[1]), SCALAR: grid}[kind]
    return pl.BlockSpec(block, lambda i, j: (i, j)), Spec(size, jnp.float32)


def vjp_call(
    pull: Pull,
    operands: Operands,
    shape: tuple[int, int],
    blocks: tuple[int, int],
    cts: Sequence[Any],
) -> list[Any]:
    """Gradients of the operands (``None`` for non-float operands) for output gradients
    ``cts``, ``pull`` run on each program's tiles (see :data:`Pull`)."""
    (rows, lanes), (br, bl) = shape, blocks
    n = len(operands)
    diff = [(x, k) for x, k in operands if jnp.issubdtype(x.dtype, jnp.floating)]
    parts = [_partial(k, shape, blocks) for _, k in diff]
    grad_fn = _masked_vjp(pull, [k for _, k in operands], bl, lanes)
    partials = launch(
        lambda *refs: _store(*refs, fn=grad_fn, n_in=n + len(cts), bl=bl, lanes=lanes),
        grid=(rows // br, steps(lanes, bl)),
        in_specs=[operand_spec(k, br, bl) for _, k in operands]
        + [operand_spec(FULL, br, bl)] * len(cts),
        out_specs=[spec for spec, _ in parts],
        out_shape=[size for _, size in parts],
        name="fnnc_fused_elementwise_backward",
    )(*(x for x, _ in operands), *cts)
    got = iter(reduce_partials(g, k, x.shape, x.dtype) for g, (x, k) in zip(partials, diff))
    return [next(got) if jnp.issubdtype(x.dtype, jnp.floating) else None for x, _ in operands]
