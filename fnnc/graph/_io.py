"""Checking what callers feed a graph, and shaping what it returns."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.core.ir import Graph
from fnnc.errors import DTypeError, GraphInputError, ShapeError


def flatten_inputs(graph: Graph, args: Sequence[Any], where: str) -> list[Any]:
    """The leaves of ``args``, checked against ``graph.inputs`` (count, shape, dtype)."""
    leaves = jax.tree.leaves(list(args))
    if len(leaves) != len(graph.inputs):
        names = ", ".join(graph.label(i) for i in graph.inputs)
        raise GraphInputError(
            f"{where}: the graph takes {len(graph.inputs)} array(s) ({names}), "
            f"got {len(leaves)}; pass one array per graph input, in order"
        )
    out = []
    for sid, leaf in zip(graph.inputs, leaves):
        sym = graph.symbol(sid)
        arr = leaf if isinstance(leaf, jax.Array) else jnp.asarray(leaf)
        want = f"{np.dtype(sym.dtype).name}{list(sym.shape)}"
        got = f"{np.dtype(arr.dtype).name}{list(arr.shape)}"
        if tuple(arr.shape) != sym.shape:
            raise ShapeError(f"{where}: input {graph.label(sid)} expects {want}, got {got}")
        if jax.dtypes.canonicalize_dtype(arr.dtype) != np.dtype(sym.dtype):
            raise DTypeError(
                f"{where}: input {graph.label(sid)} expects {want}, got {got}; "
                f"convert with .astype({np.dtype(sym.dtype).name})"
            )
        out.append(arr)
    return out


def unflatten_outputs(graph: Graph, values: Sequence[Any]) -> Any:
    """Outputs shaped by ``graph.out_tree``, else bare (one) or a tuple (several)."""
    if graph.out_tree is not None:
        return jax.tree.unflatten(graph.out_tree, list(values))
    return values[0] if len(values) == 1 else tuple(values)
