"""From recorded nodes to graphs: canonical extraction, trimming, and the program cache.

:func:`extract` turns a list of recorded nodes into a :class:`~fnnc.graph.Graph`
whose symbols are numbered in order of first appearance and carry no names, so the
same computation recorded again (the next training step, on new arrays) gives an
*equal* graph. That graph keys :data:`PROGRAMS`: a step after the first finds its
compiled program there and compiles nothing.

:func:`trim` removes the forward nodes from a graph produced by the ``backward`` pass
when their values are already known (eager mode): the symbols the gradient nodes read
become inputs, so the program computes gradients from the recorded activations
instead of recomputing the forward.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from fnnc.core import dispatch
from fnnc.core.ir import AliasSymbol, Graph, Node, Symbol, TensorSymbol
from fnnc.graph.passes.compact import compact
from fnnc.graph.passes.dce import dce

from .record import Node as Recorded
from .record import Read, Version


class Extracted:
    """A graph of recorded nodes, as a structural key first and a graph on demand.

    Attributes:
        key: the graph's structure as plain tuples (symbol specs, alias placements,
            nodes' commands and symbol ids, inputs, outputs); equal keys give equal
            graphs, and comparing them costs less than comparing graphs.
        versions: per symbol id of a root, the version it stands for.
        inputs: the graph's input symbol ids.
        reads: the symbol ids of the ``reads`` asked for, in order.
    """

    __slots__ = ("_graph", "_names", "inputs", "key", "reads", "versions")

    def __init__(self, key: Any, versions: dict[int, Version], reads: Any, names: Any):
        self.key = key
        self.versions = versions
        self.inputs: tuple[int, ...] = key[2]
        self.reads: tuple[int, ...] = reads
        self._names = names
        self._graph: Graph | None = None

    @property
    def graph(self) -> Graph:
        """The graph (canonical unless names were asked for), built once."""
        if self._graph is None:
            symbols, nodes, inputs, outputs = self.key
            sym_names, node_names = self._names or ((), ())
            built: list[Symbol] = []
            for sid, sym in enumerate(symbols):
                if sym[0] == "t":
                    built.append(
                        TensorSymbol(sid, sym[1], sym[2], sym_names[sid] if sym_names else "")
                    )
                else:
                    built.append(AliasSymbol(sid, *sym[1:]))
            made = tuple(
                Node(cmd, ins, outs, node_names[i] if node_names else "")
                for i, (cmd, ins, outs) in enumerate(nodes)
            )
            self._graph = Graph(tuple(built), made, inputs, outputs)
        return self._graph


def extract(
    nodes: Sequence[Recorded],
    reads: Sequence[Read] = (),
    *,
    names: bool = False,
    outputs: Sequence[Read] | None = None,
    first: Sequence[Read] = (),
) -> Extracted:
    """The graph of ``nodes`` (in order); versions they read but do not write are inputs.

    Args:
        nodes: recorded nodes in execution order.
        reads: versions (or views) to give symbols to after the nodes, e.g. ``f``.
        names: keep version and node names (for listings); off, the graph is canonical.
        outputs: the graph outputs (default: none).
        first: versions to number before anything else (listings put leaves first).
    """
    written = {o.id for node in nodes for o in node.outputs}
    symbols: list[tuple[Any, ...]] = []
    sym_names: list[str] = []
    inputs: list[int] = []
    sym_of: dict[int, int] = {}
    alias_of: dict[tuple[int, Any], int] = {}
    versions: dict[int, Version] = {}

    def root(v: Version) -> int:
        sid = sym_of.get(v.id)
        if sid is None:
            sid = sym_of[v.id] = len(symbols)
            symbols.append(("t", v.shape, v.dtype))
            sym_names.append(v.name)
            versions[sid] = v
            if v.id not in written:
                inputs.append(sid)
        return sid

    def read(r: Read) -> int:
        v, view = r
        rid = root(v)
        if view is None:
            return rid
        key = (v.id, view)
        sid = alias_of.get(key)
        if sid is None:
            sid = alias_of[key] = len(symbols)
            symbols.append(("a", rid, view.shape, v.dtype, view.base, view.stride))
            sym_names.append("")
        return sid

    for r in first:
        read(r)
    out_nodes = [
        (node.cmd, tuple([read(r) for r in node.inputs]), tuple([root(o) for o in node.outputs]))
        for node in nodes
    ]
    read_ids = tuple(read(r) for r in reads)
    out_ids = tuple(read(r) for r in outputs or ())
    key = (tuple(symbols), tuple(out_nodes), tuple(inputs), out_ids)
    shown = (tuple(sym_names), tuple(node.name for node in nodes)) if names else None
    return Extracted(key, versions, read_ids, shown)


def trim(
    graph: Graph, n_forward: int, n_symbols: int, extra: Sequence[int]
) -> tuple[Graph, tuple[int, ...]]:
    """``graph`` without its first ``n_forward`` nodes, whose values are known.

    The roots among the first ``n_symbols`` symbols (the forward graph's) that the
    remaining nodes or the outputs read become inputs, in id order, followed by
    ``extra`` (symbol ids of inputs added after the forward graph). Returns the new
    graph and those roots.
    """
    nodes = graph.nodes[n_forward:]
    used = {s for node in nodes for s in node.inputs} | set(graph.outputs)
    roots = sorted({graph.symbols[s].root for s in used if graph.symbols[s].root < n_symbols})
    trimmed = dataclasses.replace(graph, nodes=nodes, inputs=(*roots, *extra))
    return compact(dce(trimmed)), tuple(roots)


class ProgramCache:
    """Compiled programs by structural key, least recently used dropped past ``size``."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._items: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self.misses = 0

    def get(self, key: Hashable, build: Callable[[], Any]) -> tuple[Any, bool]:
        """The entry for ``key``, built on a miss; and whether it was built now.

        The dispatch state (backend registry, autotune table, backend and numerics
        settings) is part of every key, as in every other program cache."""
        key = (key, dispatch.state())
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
            return item, False
        item = self._items[key] = build()
        self.misses += 1
        if len(self._items) > self.size:
            self._items.popitem(last=False)
        return item, True

    def __len__(self) -> int:
        return len(self._items)


PROGRAMS = ProgramCache()
"""The programs of every dynamic graph (gradients, optimizer steps, lazy flushes)."""
