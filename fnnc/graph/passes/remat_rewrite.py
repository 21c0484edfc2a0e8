"""The rewrite :func:`fnnc.graph.passes.remat.recompute` runs: the forward as it is, and
each recomputed segment duplicated right before the first backward node that reads it,
behind an optimisation barrier (so XLA does not merge it back into the forward)."""

from __future__ import annotations

import dataclasses
from typing import Any

from fnnc.core.ir import AliasSymbol, Graph, Node, TensorSymbol
from fnnc.ops import optimization_barrier

BARRIER = "remat.barrier"
SUFFIX = "@remat"
"""The names of the barrier before a recomputed segment and the suffix of its nodes."""


class Rewriter:
    """Builds the rematerialised graph: forward as is, segments duplicated on demand."""

    def __init__(self, graph: Graph, start: int, unsaved: set[int]):
        self.graph, self.start, self.unsaved = graph, start, unsaved
        self.symbols: list[Any] = list(graph.symbols)
        self.nodes: list[Node] = list(graph.nodes[:start])
        self.copy: dict[int, int] = {}  # forward root id -> its recomputed root id
        self.views: dict[int, int] = {}  # forward view id -> the same view of the copy

    def run(self) -> Graph:
        producers = self.graph.producers
        for node in self.graph.nodes[self.start :]:
            need = [
                self.symbols[s].root
                for s in node.inputs
                if self._needs_copy(self.symbols[s].root, producers)
            ]
            if need:
                self._emit_segment(list(dict.fromkeys(need)), node)
            self.nodes.append(dataclasses.replace(node, inputs=self._remap(node.inputs)))
        return dataclasses.replace(self.graph, symbols=tuple(self.symbols), nodes=tuple(self.nodes))

    def _needs_copy(self, root: int, producers: dict[int, int]) -> bool:
        producer = producers.get(root)
        return (
            producer is not None
            and producer < self.start
            and producer in self.unsaved
            and root not in self.copy
        )

    def _emit_segment(self, roots: list[int], reader: Node) -> None:
        """Duplicates the unsaved forward nodes that ``roots`` need, behind a barrier."""
        producers, graph = self.graph.producers, self.graph
        todo: set[int] = set()
        stack = [producers[r] for r in roots]
        while stack:
            index = stack.pop()
            if index in todo:
                continue
            todo.add(index)
            for s in graph.nodes[index].inputs:
                root = self.symbols[s].root
                p = producers.get(root)
                if p is not None and p < self.start and p in self.unsaved and root not in self.copy:
                    stack.append(p)
        order = sorted(todo)
        made = {o for i in order for o in (self.symbols[s].root for s in graph.nodes[i].outputs)}
        leaves = list(
            dict.fromkeys(
                s
                for i in order
                for s in graph.nodes[i].inputs
                if self.symbols[s].root not in made and self.symbols[s].root not in self.copy
            )
        )
        late = [s for s in reader.inputs if self._is_late(s)]
        fenced: dict[int, int] = {}
        if leaves:
            ins = (*leaves, *late[:1])
            outs = tuple(self._new_tensor(self.symbols[s]) for s in ins)
            self.nodes.append(Node(optimization_barrier(), ins, outs, BARRIER))
            fenced = dict(zip(leaves, outs))
        for index in order:
            node = graph.nodes[index]
            inputs = tuple(fenced[s] if s in fenced else self._remap((s,))[0] for s in node.inputs)
            outs = []
            for s in node.outputs:
                # a recomputation is named apart (``h@remat``; a barrier's copies have no
                # name): copies of the forward's names made "h" name two symbols, which
                # backward(graph, "h", ...) then refused
                like = self.symbols[s]
                new = self._new_tensor(like, f"{like.name}{SUFFIX}" if like.name else "")
                self.copy[self.symbols[s].root] = new
                outs.append(new)
            name = f"{node.name or node.cmd.name}{SUFFIX}"
            self.nodes.append(Node(node.cmd, inputs, tuple(outs), name))

    def _is_late(self, sid: int) -> bool:
        producer = self.graph.producers.get(self.symbols[sid].root)
        return producer is not None and producer >= self.start

    def _remap(
        self, sids: tuple[int, ...], fenced: dict[int, int] | None = None
    ) -> tuple[int, ...]:
        out = []
        for s in sids:
            if fenced and s in fenced:
                out.append(s)  # replaced by the caller with the barrier's output
                continue
            sym = self.symbols[s]
            new_root = self.copy.get(sym.root)
            if new_root is None:
                out.append(s)
            elif isinstance(sym, AliasSymbol):
                if s not in self.views:  # one view of the copy per view, named apart
                    name = f"{sym.name}{SUFFIX}" if sym.name else ""
                    view = dataclasses.replace(sym, id=len(self.symbols), root=new_root, name=name)
                    self.symbols.append(view)
                    self.views[s] = view.id
                out.append(self.views[s])
            else:
                out.append(new_root)
        return tuple(out)

    def _new_tensor(self, like: Any, name: str = "") -> int:
        sym = TensorSymbol(len(self.symbols), tuple(like.shape), like.dtype, name)
        self.symbols.append(sym)
        return sym.id
