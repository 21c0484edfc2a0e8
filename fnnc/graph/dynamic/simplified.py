"""``simplify`` for the dynamic graph's gradient programs, then the recorded forward cut.

``Model.fit`` compiles ``simplify(backward(forward))``, so fused losses and kernels
apply; the dynamic graph runs the same pipeline. A fusion such as softmax +
categorical_crossentropy needs the forward pair *and* its gradient nodes in view, so
:func:`simplify_trim` simplifies the whole forward-and-gradient graph first, and only
then removes the nodes whose results are already recorded (every output a forward
symbol): the fused ``softmax_crossentropy`` forward goes, its single gradient node
(``softmax - target``) stays and reads the recorded softmax.

Forward symbols and the extra inputs (seeds, accumulated gradients, optimizer state)
are found again after the passes by a tag in their name, since passes renumber
symbols but keep names; the tags are cleared before returning.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from fnnc.core.ir import Graph, TensorSymbol
from fnnc.graph.passes.compact import compact
from fnnc.graph.passes.dce import dce
from fnnc.graph.passes.pipeline import simplify

_FORWARD = "\x00fwd:"
_EXTRA = "\x00in:"


def _tagged(graph: Graph, n_symbols: int, extra: Sequence[int]) -> Graph:
    order = {sid: k for k, sid in enumerate(extra)}
    symbols = []
    for s in graph.symbols:
        if isinstance(s, TensorSymbol) and s.id < n_symbols:
            s = dataclasses.replace(s, name=f"{_FORWARD}{s.id}")
        elif isinstance(s, TensorSymbol) and s.id in order:
            s = dataclasses.replace(s, name=f"{_EXTRA}{order[s.id]}")
        symbols.append(s)
    return dataclasses.replace(graph, symbols=tuple(symbols))


def tag_forward(graph: Graph) -> Graph:
    """``graph`` with each tensor symbol tagged as the forward symbol of its id (for a
    forward that passes rewrite before :func:`simplify_trim`, given ``n_symbols=0``)."""
    return _tagged(graph, len(graph.symbols), ())


def _tag(graph: Graph, sid: int, prefix: str) -> int | None:
    name = getattr(graph.symbols[sid], "name", "")
    return int(name[len(prefix) :]) if name.startswith(prefix) else None


def simplify_trim(
    graph: Graph, n_symbols: int, extra: Sequence[int]
) -> tuple[Graph, tuple[int, ...]]:
    """``simplify(graph)`` without the nodes whose values are recorded.

    Args:
        graph: the forward graph (its first ``n_symbols`` symbols) with the gradient
            nodes appended; its outputs are what the program returns.
        n_symbols: how many symbols the forward graph has (0: they are tagged
            already, :func:`tag_forward`).
        extra: ids of the inputs added after the forward graph, in feeding order.

    Returns:
        The program's graph, whose inputs are the recorded forward roots it reads
        (ascending forward ids) followed by ``extra``'s; and those forward ids, as
        :func:`~.extract.trim` returns them.
    """
    simple = simplify(_tagged(graph, n_symbols, extra))
    forward = {
        i
        for i, node in enumerate(simple.nodes)
        if all(_tag(simple, simple.symbols[o].root, _FORWARD) is not None for o in node.outputs)
    }
    nodes = tuple(n for i, n in enumerate(simple.nodes) if i not in forward)
    used = {simple.symbols[s].root for n in nodes for s in n.inputs}
    used |= {simple.symbols[s].root for s in simple.outputs}
    roots = sorted((tag, sid) for sid in used if (tag := _tag(simple, sid, _FORWARD)) is not None)
    extras: dict[int, int] = {}
    for sid in simple.inputs:
        tag = _tag(simple, sid, _EXTRA)
        if tag is not None:
            extras[tag] = sid
    symbols = list(simple.symbols)
    for k in range(len(extra)):  # an extra input the passes dropped: feed it anyway
        if k not in extras:
            spec = graph.spec(extra[k])
            extras[k] = len(symbols)
            symbols.append(TensorSymbol(len(symbols), tuple(spec.shape), spec.dtype))
    cleared = tuple(
        dataclasses.replace(s, name="")
        if isinstance(s, TensorSymbol) and s.name.startswith("\x00")
        else s
        for s in symbols
    )
    inputs = (*(sid for _, sid in roots), *(extras[k] for k in range(len(extra))))
    trimmed = dataclasses.replace(simple, symbols=cleared, nodes=nodes, inputs=inputs)
    return compact(dce(trimmed)), tuple(tag for tag, _ in roots)
