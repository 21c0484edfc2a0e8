"""Argument checks of :class:`~fnnc.graph.GraphBuilder`: shapes, dtypes, lists of
symbols and optional inputs, each a :class:`~fnnc.errors.FnncError` that says what to
pass instead. One idea apart from the builder's bookkeeping, and shared by its methods."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from fnnc.core.ir import AliasSymbol, Symbol, TensorSymbol, contiguous_strides
from fnnc.errors import CommandError, DTypeError, GraphError

# Commands whose NNC form takes a nil input as a value: (command, position) -> what to pass.
_NIL_AS = {
    ("ewdiv", 0): "a tensor of ones as input 0 (NNC's nil numerator, 1 / b, is "
    "ewdiv(ones, b)); a scalar constant np.float32(1) broadcasts",
}


def without_trailing_none(inputs: Sequence[Any], where: str, command: str = "") -> Sequence[Any]:
    """``inputs`` without trailing ``None`` (optional inputs left out); a ``None``
    before a given input is an error that says what to pass instead (for ``command``'s
    NNC nil inputs, such as ewdiv's numerator, the value NNC takes). The builder's
    ``exec`` and the dynamic graph's share it."""
    n = len(inputs)
    while n and inputs[n - 1] is None:
        n -= 1
    gap = next((k for k in range(n) if inputs[k] is None), None)
    if gap is not None and (command, gap) in _NIL_AS:
        raise CommandError(
            f"{where}: input {gap} is None but input {n - 1} is given; a graph node can leave "
            f"out trailing inputs only. Pass {_NIL_AS[command, gap]}"
        )
    if gap is not None:
        raise CommandError(
            f"{where}: input {gap} is None but input {n - 1} is given; a graph node can leave "
            "out trailing inputs only (NNC's NO_TENSOR_SYMBOL in between has no graph form). "
            "Pass the input's neutral value instead, e.g. a zero additive mask "
            "(a constant np.zeros((1, 1, 1, 1), np.float32)) for attention"
        )
    return inputs[:n]


def _shape(shape: Any, where: str, auto: bool = True) -> tuple[int, ...]:
    """A shape as a tuple of non-negative ints; a :class:`GraphError` for anything else."""
    try:
        dims = tuple(operator.index(n) for n in shape)
    except TypeError:
        dims = None
    if dims is None or any(n < 0 for n in dims):
        also = ", or None for NNC's auto shape (filled by the node that writes the tensor)"
        raise GraphError(
            f"{where}: shape {shape!r} is not a sequence of non-negative ints; give e.g. "
            f"(2, 3) or () for a scalar{also if auto else ''}"
        )
    return dims


def _ints(values: Any, what: str, where: str) -> tuple[int, ...]:
    """``values`` as a tuple of ints; a :class:`GraphError` naming ``what`` otherwise."""
    try:
        return tuple(operator.index(v) for v in values)
    except TypeError:
        raise GraphError(f"{where}: {what} {values!r} is not a sequence of ints") from None


def _listed(items: Any, where: str, what: str) -> list[Any]:
    """``items`` as a list; a :class:`GraphError` for a bare symbol (the usual slip) or
    anything else that is not a sequence of symbols."""
    if not isinstance(items, (TensorSymbol, AliasSymbol)):
        try:
            return list(items)
        except TypeError:
            pass
    hint = f"; wrap the one symbol: [{items.name or 'sym'}]" if hasattr(items, "id") else ""
    raise GraphError(f"{where}: {what} takes a list of symbols, got {type(items).__name__}{hint}")


def _dtype(dtype: Any, where: str) -> np.dtype:
    try:
        return jax.dtypes.canonicalize_dtype(np.dtype(dtype))
    except TypeError:
        raise DTypeError(
            f"{where}: dtype {dtype!r} is not a dtype; give e.g. np.float32 or 'int32'"
        ) from None


def _is_contiguous(sym: AliasSymbol) -> bool:
    """Whether the view covers consecutive root elements in row-major order."""
    want = contiguous_strides(sym.shape)
    return all(s == w for n, s, w in zip(sym.shape, sym.stride, want) if n != 1)


def _spec(sym: Symbol) -> str:
    return f"{np.dtype(sym.dtype).name}{list(sym.shape)}"
