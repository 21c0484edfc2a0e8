"""cse: common-subexpression elimination."""

from __future__ import annotations

import dataclasses

from fnnc.core.ir import AliasSymbol, Graph, Node, require_graph
from fnnc.graph.passes._subgraphs import is_pure, map_subgraphs
from fnnc.graph.passes.compact import compact
from fnnc.ops import Command


def canonical_inputs(cmd: Command, inputs: tuple[int, ...]) -> tuple[int, ...]:
    """The input order that identifies a computation: sorted for commutative commands
    (the command attribute, e.g. ``ewsum``; ``add`` only when ``p == q``), else as given."""
    if cmd.definition.attributes.is_commutative(cmd):
        return tuple(sorted(inputs))
    return inputs


def cse(graph: Graph) -> Graph:
    """Merges nodes that compute the same thing: equal command, equal inputs.

    Nodes are visited in order; a node whose command and (canonically ordered) inputs
    match an earlier node's is dropped and its outputs are replaced by the earlier
    node's outputs everywhere: in later nodes' inputs, in the graph outputs, and as the
    root of any view of them. Commutative commands (the ``commutative`` attribute) match in
    any input order. Equal views of one tensor (same root, offset, strides, shape)
    are read as one symbol. Never merged: commands that are random or have effects
    (or hold such commands in sub-graphs), and nodes that write views (aliases).
    Sub-graphs are simplified too.

    Needs: a verified graph.

    Guarantees: the same graph object when nothing merged; otherwise fewer nodes,
    compacted, with the same outputs. ``cse(cse(g)) is cse(g)``.

    Before / after (NNC's ``(x + y) * (x + y)``)::

        graph(%0:f32[] x, %1:f32[] y) {     graph(%0:f32[] x, %1:f32[] y) {
          %2:f32[] = add(%0, %1)              %2:f32[] = add(%0, %1)
          %3:f32[] = add(%1, %0)              %3:f32[] = mul(%2, %2)
          %4:f32[] = mul(%2, %3)              return %3
          return %4                         }
        }

    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x, y = b.input(()), b.input(())
    >>> z = b.exec(ops.mul(), b.exec(ops.add(), x, y), b.exec(ops.add(), y, x))
    >>> len(cse(b.build([z])).nodes)
    2
    """
    graph = map_subgraphs(require_graph(graph, "cse"), cse)
    symbols = graph.symbols
    same: dict[int, int] = {}  # symbol id -> the symbol that replaces it
    views: dict[tuple, int] = {}

    def resolve(sid: int) -> int:
        sym = symbols[sid]
        if isinstance(sym, AliasSymbol):
            key = (same.get(sym.root, sym.root), sym.shape, sym.dtype, sym.base, sym.stride)
            return views.setdefault(key, sid)
        return same.get(sid, sid)

    seen: dict[tuple[Command, tuple[int, ...]], Node] = {}
    nodes = []
    for node in graph.nodes:
        inputs = tuple(resolve(s) for s in node.inputs)
        if inputs != node.inputs:
            node = dataclasses.replace(node, inputs=inputs)
        if not is_pure(node.cmd) or any(symbols[s].is_alias for s in node.outputs):
            nodes.append(node)
            continue
        first = seen.setdefault((node.cmd, canonical_inputs(node.cmd, inputs)), node)
        if first is node:
            nodes.append(node)
        else:
            same.update(zip(node.outputs, first.outputs))
    outputs = tuple(resolve(s) for s in graph.outputs)
    unchanged = len(nodes) == len(graph.nodes) and outputs == graph.outputs
    if unchanged and all(new is old for new, old in zip(nodes, graph.nodes)):
        return graph
    return compact(_rewired(graph, tuple(nodes), outputs, same))


def _rewired(
    graph: Graph, nodes: tuple[Node, ...], outputs: tuple[int, ...], same: dict[int, int]
) -> Graph:
    """``graph`` with new nodes and outputs, views of merged tensors re-rooted."""
    symbols = tuple(
        dataclasses.replace(s, root=same[s.root])
        if isinstance(s, AliasSymbol) and s.root in same
        else s
        for s in graph.symbols
    )
    return dataclasses.replace(graph, symbols=symbols, nodes=nodes, outputs=outputs)
