"""dce: dead-code elimination."""

from __future__ import annotations

import dataclasses

from fnnc.core.ir import Graph, require_graph
from fnnc.graph.passes._subgraphs import has_effects, map_subgraphs
from fnnc.graph.passes.compact import compact


def dce(graph: Graph) -> Graph:
    """Drops nodes whose outputs never reach ``graph.outputs``; effectful nodes stay.

    Liveness is tracked per *root* tensor, so it is alias-aware: a node writing any
    view of a live tensor is live, and a live node reading a view makes the whole
    viewed tensor live. A node is also kept when its command, or any command inside
    its sub-graphs, has effects (``Attributes.has_effects``). Graph inputs are kept
    even when unused (they are the graph's signature). Sub-graphs are cleaned too.

    Needs: a verified graph (def-before-use: every write to a tensor comes before any
    read of it, which a single reverse walk relies on).

    Guarantees: the same graph object when every node is live; otherwise the live
    nodes in their order, compacted (:func:`~fnnc.graph.passes.compact`).

    Before / after::

        graph(%0:f32[2] x) {                graph(%0:f32[2] x) {
          %1:f32[2] = ewexp(%0)               %1:f32[2] = relu(%0)
          %2:f32[2] = relu(%0)                return %1
          return %2                         }
        }

    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.input((2,))
    >>> _ = b.exec(ops.ewexp(), x)
    >>> print(dce(b.build([b.exec(ops.relu(), x)])))
    graph(%0:f32[2]) {
      %1:f32[2] = relu(%0)
      return %1
    }
    """
    graph = map_subgraphs(require_graph(graph, "dce"), dce)
    symbols = graph.symbols
    live = {symbols[s].root for s in graph.outputs}
    kept = []
    for node in reversed(graph.nodes):
        if all(symbols[s].root not in live for s in node.outputs) and not has_effects(node.cmd):
            continue
        kept.append(node)
        live.update(symbols[s].root for s in node.inputs)
    if len(kept) == len(graph.nodes):
        return graph
    return compact(dataclasses.replace(graph, nodes=tuple(reversed(kept))))
