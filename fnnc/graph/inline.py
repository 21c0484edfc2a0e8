"""inline: copy one graph into a builder, feeding its inputs with symbols of the builder.

Models built from parts (a traced Flax module inside a cnnp model, a loss function
traced on its own) are assembled by inlining: every symbol and node of the inner graph
is recreated in the outer builder, so passes see one flat graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fnnc.core.ir import AliasSymbol, Graph, Symbol, TensorSymbol, require_graph
from fnnc.errors import GraphInputError, ShapeError
from fnnc.graph.builder import GraphBuilder


def inline(
    builder: GraphBuilder, graph: Graph, args: Sequence[Symbol], *, prefix: str = ""
) -> list[Symbol]:
    """Recreates ``graph`` inside ``builder`` with ``args`` as its inputs; returns its outputs.

    Args:
        builder: the outer builder.
        graph: the graph to copy.
        args: one outer symbol per graph input, with matching specs.
        prefix: prepended to inner node names (e.g. the layer name).

    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder
    >>> inner = GraphBuilder()
    >>> x = inner.input((2,))
    >>> g = inner.build([inner.exec(ops.relu(), x)])
    >>> b = GraphBuilder()
    >>> y = b.input((2,), name="y")
    >>> (out,) = inline(b, g, [y])
    >>> print(b.build([out]).nodes[0].cmd)
    relu
    """
    require_graph(graph, "inline")
    if isinstance(args, (TensorSymbol, AliasSymbol)) or not isinstance(args, Sequence):
        raise GraphInputError(
            f"inline: args is one symbol per graph input, a list; got {type(args).__name__}"
            f" (for one input, pass [symbol])"
        )
    if len(args) != len(graph.inputs):
        raise GraphInputError(
            f"inline: the graph takes {len(graph.inputs)} inputs, got {len(args)} symbols"
        )
    mapping: dict[int, Symbol] = {}
    for sid, arg in zip(graph.inputs, args):
        sym = graph.symbols[sid]
        if not isinstance(arg, (TensorSymbol, AliasSymbol)):
            raise GraphInputError(
                f"inline: input {graph.label(sid)} is fed {type(arg).__name__} {arg!r:.40}; "
                "feed symbols of the builder (builder.input(...), a node's output, or "
                "builder.constant(value) for a value)"
            )
        if tuple(arg.shape) != sym.shape or arg.dtype != sym.dtype:
            raise GraphInputError(
                f"inline: input {graph.label(sid)} is {sym.dtype}{list(sym.shape)}, the symbol "
                f"given for it is {arg.dtype}{list(arg.shape)}"
            )
        mapping[sid] = arg

    def outer(sid: int) -> Symbol:
        if sid in mapping:
            return mapping[sid]
        sym = graph.symbols[sid]
        if isinstance(sym, AliasSymbol):
            root = outer(sym.root)
            base, stride = sym.base, sym.stride
            if isinstance(root, AliasSymbol):  # the input was fed a view: view the view
                base, stride = _within(root, sym, graph.label(sid))
            new: Any = builder.alias(root, sym.shape, stride=stride, base=base, name=sym.name)
        else:
            new = builder.tensor(sym.shape, sym.dtype, name=sym.name)
        mapping[sid] = new
        return new

    for node in graph.nodes:
        name = f"{prefix}/{node.name}" if prefix and node.name else (node.name or "")
        builder.exec(
            node.cmd,
            *(outer(s) for s in node.inputs),
            outputs=[outer(s) for s in node.outputs],
            name=name,
        )
    return [outer(s) for s in graph.outputs]


def _within(arg: AliasSymbol, view: AliasSymbol, label: str) -> tuple[int, tuple[int, ...]]:
    """``view`` (placed in the flat buffer of the inner input that ``arg`` feeds) placed
    in the buffer of ``arg``'s root instead: its base and strides there. The inner input
    is contiguous, so its element ``k`` is ``arg``'s element ``k`` in row-major order."""
    at = arg.flat_indices().reshape(-1)[view.flat_indices()]
    if not at.size:
        return arg.base, view.stride
    base = int(at.flat[0])
    stride = tuple(
        int(at[(0,) * d + (1,) + (0,) * (at.ndim - d - 1)]) - base if n > 1 else s
        for d, (n, s) in enumerate(zip(at.shape, view.stride))
    )
    placed = AliasSymbol(-1, arg.root, view.shape, view.dtype, base, stride)
    if not np.array_equal(placed.flat_indices(), at):
        raise ShapeError(
            f"inline: the graph views its input as {label} {list(view.shape)} (base "
            f"{view.base}, stride {list(view.stride)}), and the symbol given for that input is "
            f"itself a strided view {list(arg.shape)} (stride {list(arg.stride)}); the two do "
            "not make one strided view: pass a contiguous tensor (copy the view first)"
        )
    return base, stride
