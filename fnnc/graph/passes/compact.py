"""compact: drop symbols nothing refers to and renumber the rest densely."""

from __future__ import annotations

import dataclasses

from fnnc.core.ir import AliasSymbol, Graph, require_graph
from fnnc.graph.passes._subgraphs import map_subgraphs


def compact(graph: Graph) -> Graph:
    """Drops symbols that no node, graph input or graph output refers to; renumbers ids.

    A symbol is kept when a node reads or writes it, when it is a graph input or
    output, or when a kept alias views it (its root). Kept symbols keep their order,
    so ids only move down. Sub-graphs are compacted too.

    Needs: a graph whose ids are positions (``symbols[i].id == i``).

    Guarantees: the same graph object when every symbol is referenced; otherwise an
    equivalent graph with ``symbols[i].id == i`` and no unreferenced symbol. Other
    passes call it last, so their results stay dense.

    Before / after (``%1`` was left behind by a pass that dropped its node)::

        graph(%0:f32[2] x) {                graph(%0:f32[2] x) {
          %2:f32[2] = relu(%0)                %1:f32[2] = relu(%0)
          return %2                           return %1
        }                                   }

    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.input((2,))
    >>> g = b.build([b.exec(ops.relu(), x)])
    >>> compact(g) is g
    True
    """
    graph = map_subgraphs(require_graph(graph, "compact"), compact)
    used = set(graph.inputs) | set(graph.outputs)
    for node in graph.nodes:
        used.update(node.inputs)
        used.update(node.outputs)
    used.update([graph.symbols[s].root for s in used])
    if len(used) == len(graph.symbols):
        return graph
    new_id = {sym.id: i for i, sym in enumerate(s for s in graph.symbols if s.id in used)}
    symbols = []
    for sym in graph.symbols:
        if sym.id not in used:
            continue
        if isinstance(sym, AliasSymbol):
            sym = dataclasses.replace(sym, id=new_id[sym.id], root=new_id[sym.root])
        else:
            sym = dataclasses.replace(sym, id=new_id[sym.id])
        symbols.append(sym)

    def ids(items: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(new_id[s] for s in items)

    nodes = tuple(
        dataclasses.replace(node, inputs=ids(node.inputs), outputs=ids(node.outputs))
        for node in graph.nodes
    )
    return dataclasses.replace(
        graph,
        symbols=tuple(symbols),
        nodes=nodes,
        inputs=ids(graph.inputs),
        outputs=ids(graph.outputs),
    )
