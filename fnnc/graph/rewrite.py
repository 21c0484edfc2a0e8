"""Rewriter: edits over a frozen graph (insert, replace all uses, remove), then one new graph.

A :class:`~fnnc.graph.Graph` never changes; a :class:`Rewriter` collects edits against
it and :meth:`Rewriter.finish` builds the edited graph once, verified (when
``fnnc.config`` checks are on), dead nodes dropped, compacted, or the very same graph
object when nothing was edited. Inserting a fake-quantize after every gemm:

>>> import numpy as np
>>> from fnnc import ops
>>> from fnnc.graph import GraphBuilder, Rewriter
>>> b = GraphBuilder()
>>> x, w = b.input((2, 3), name="x"), b.input((4, 3), name="w")
>>> g = b.build([b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w, name="fc"))])
>>> r = Rewriter(g)
>>> for node in r.find("gemm"):
...     with r.inserting_after(node):
...         q = r.exec(ops.clamp(min=-1.0, max=1.0), r.symbol(node.outputs[0]))
...     r.replace_all_uses(node.outputs[0], q)
>>> print(r.finish())
graph(%0:f32[2,3] x, %1:f32[4,3] w) {
  %2:f32[2,4] = gemm[transpose_b=True](%0, %1)  # fc
  %4:f32[2,4] = clamp[min=-1.0, max=1.0](%2)  # fc
  %3:f32[2,4] = relu(%4)
  return %3
}

New symbols take the next free ids (``%4``); ids name symbols, the node order is the
execution order. ``replace_all_uses(old, new)`` rewires every read of ``old`` that comes
after ``new`` is written (so the node computing ``new`` from ``old`` keeps reading ``old``), the
graph outputs and the views of ``old``: a view used only after ``new`` is written is
re-rooted onto ``new``; one also read before keeps ``old`` for those reads, and the later
readers read a fresh view of ``new``. ``replace_all_uses_with`` is the same edit under
torch.fx's name.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from fnnc import config
from fnnc.core.command import output_specs
from fnnc.core.ir import AliasSymbol, Graph, Node, Symbol, TensorSymbol
from fnnc.errors import CommandError, FnncError, GraphError
from fnnc.graph.passes.compact import compact
from fnnc.graph.passes.dce import dce
from fnnc.graph.verify import verify
from fnnc.ops import Command

NodeRef = int | Node
"""A node of the rewriter's graph: its index, or the node itself."""


class Rewriter:
    """Edits against ``graph``; :meth:`finish` returns the edited graph.

    ``replace_all_uses_with`` is :meth:`replace_all_uses` under torch.fx's name
    (``Node.replace_all_uses_with``): every later read of ``old`` reads ``new``.

    Args:
        graph: the graph to edit (never changed itself).
        name: how errors name the edit (e.g. the pass doing it).
    """

    def __init__(self, graph: Graph, *, name: str = "Rewriter"):
        self.graph = graph
        self.name = name
        self._symbols: list[Symbol] = list(graph.symbols)
        self._before: dict[int, list[Node]] = {}
        self._after: dict[int, list[Node]] = {}
        self._replaced: dict[int, Node] = {}
        self._removed: set[int] = set()
        self._same: dict[int, int] = {}
        self._at: tuple[str, int] = ("before", len(graph.nodes))  # the end
        self._index: dict[int, int] | None = None  # id(node) -> position
        self._equal: dict[Node, int] = {}  # node -> its first position

    # -- reading ----------------------------------------------------------------
    def symbol(self, sid: int | Symbol) -> Symbol:
        """The symbol ``sid`` (new symbols included)."""
        return self._symbols[sid.id if isinstance(sid, (TensorSymbol, AliasSymbol)) else sid]

    def find(self, cmd: str) -> list[Node]:
        """The original nodes running command ``cmd``, in order."""
        return [n for n in self.graph.nodes if n.cmd.name == cmd]

    def producer(self, sid: int | Symbol) -> Node | None:
        """The original node writing ``sid`` (``None`` for graph inputs)."""
        index = self.graph.producers.get(self.symbol(sid).id)
        return None if index is None else self.graph.nodes[index]

    def users(self, sid: int | Symbol) -> list[Node]:
        """The original nodes reading ``sid``, in order."""
        return [self.graph.nodes[i] for i in self.graph.consumers.get(self.symbol(sid).id, ())]

    def index(self, node: NodeRef) -> int:
        """The position of an original node."""
        if isinstance(node, int):
            if not 0 <= node < len(self.graph.nodes):
                raise GraphError(f"{self.name}: node index {node} is not in the graph")
            return node
        if self._index is None:
            # by identity first: equal nodes (two debug prints of one value, no outputs)
            # are told apart by which object the caller holds; by equality, the first
            self._index = {id(n): i for i, n in enumerate(self.graph.nodes)}
            self._equal = {}
            for i, n in enumerate(self.graph.nodes):
                self._equal.setdefault(n, i)
        i = self._index.get(id(node))
        if i is not None and self.graph.nodes[i] is node:
            return i
        if node not in self._equal:
            raise GraphError(
                f"{self.name}: node {node.cmd.name} ({node.name or 'unnamed'}) is not an "
                "original node of the graph; insert relative to the graph's own nodes"
            )
        return self._equal[node]

    # -- editing ----------------------------------------------------------------
    @contextlib.contextmanager
    def inserting_before(self, node: NodeRef) -> Iterator[None]:
        """Within the block, :meth:`exec` inserts before ``node`` (in call order)."""
        previous, self._at = self._at, ("before", self.index(node))
        try:
            yield
        finally:
            self._at = previous

    @contextlib.contextmanager
    def inserting_after(self, node: NodeRef) -> Iterator[None]:
        """Within the block, :meth:`exec` inserts after ``node`` (in call order)."""
        previous, self._at = self._at, ("after", self.index(node))
        try:
            yield
        finally:
            self._at = previous

    def exec(self, cmd: Command, *inputs: int | Symbol, name: str = "") -> Any:
        """Inserts ``cmd(*inputs)`` at the insertion point (default: after the last
        node); returns its output symbol (a tuple for several)."""
        where = f"{self.name}: exec {getattr(cmd, 'name', cmd)}"
        if not isinstance(cmd, Command):
            raise CommandError(f"{where}: expected a Command (e.g. ops.relu()), got {cmd!r}")
        ids = tuple(self.symbol(s).id for s in inputs)
        try:
            specs = output_specs(cmd, [self._symbols[i].spec for i in ids])
        except FnncError as e:
            raise type(e)(f"{where}: {e}") from None
        outs = tuple(self._new(s) for s in specs)
        kind, at = self._at
        anchor = self.graph.nodes[at] if at < len(self.graph.nodes) else None
        name = name or (anchor.name if anchor is not None else "")
        node = Node(cmd, ids, tuple(s.id for s in outs), name)
        (self._before if kind == "before" else self._after).setdefault(at, []).append(node)
        return outs[0] if len(outs) == 1 else outs

    def constant(self, value: Any, dtype: Any = None, name: str = "") -> Symbol:
        """Inserts a ``constant`` node holding ``value`` at the insertion point."""
        from fnnc.ops.constant import constant

        return self.exec(constant(value, dtype), name=name)

    def call(self, fn: Callable[..., Any], *inputs: int | Symbol) -> Any:
        """Inserts the nodes of ``fn`` (a JAX function, which may call fnnc commands),
        traced on the inputs' shapes, at the insertion point; returns its output(s)."""
        from fnnc.graph.pattern_functions import call_function

        return call_function(self.exec, fn, [self.symbol(s) for s in inputs])

    def insert_before(self, node: NodeRef, cmd: Command, *inputs: int | Symbol) -> Any:
        """``cmd(*inputs)`` inserted before ``node``; its output symbol(s)."""
        with self.inserting_before(node):
            return self.exec(cmd, *inputs)

    def insert_after(self, node: NodeRef, cmd: Command, *inputs: int | Symbol) -> Any:
        """``cmd(*inputs)`` inserted after ``node``; its output symbol(s)."""
        with self.inserting_after(node):
            return self.exec(cmd, *inputs)

    def replace_all_uses(self, old: int | Symbol, new: int | Symbol) -> None:
        """Every later read of ``old`` reads ``new`` (see the module doc); the specs
        must be equal."""
        a, b = self.symbol(old), self.symbol(new)
        if a.shape != b.shape or np.dtype(a.dtype) != np.dtype(b.dtype):
            raise GraphError(
                f"{self.name}: replace_all_uses({_label(a)}, {_label(b)}): {_spec(a)} cannot "
                f"be replaced by {_spec(b)}; the shapes and dtypes must be equal"
            )
        if a.id == b.id:
            return
        chain, sid = [a.id, b.id], b.id
        while sid in self._same:  # b's own replacements: they must not lead back to a
            sid = self._same[sid]
            chain.append(sid)
            if sid == a.id:
                raise GraphError(
                    f"{self.name}: replace_all_uses({_label(a)}, {_label(b)}) closes a cycle "
                    f"of replacements ({' -> '.join(f'%{s}' for s in chain)}); an earlier "
                    f"edit already replaces {_label(b)} by way of {_label(a)}, so no symbol "
                    "would be read; replace each symbol once, by its final value"
                )
        self._same[a.id] = b.id

    replace_all_uses_with = replace_all_uses  # torch.fx's name (see the class docstring)

    def replace_node(
        self,
        node: NodeRef,
        cmd: Command,
        *inputs: int | Symbol,
        outputs: Sequence[int | Symbol] | None = None,
    ) -> None:
        """``node`` runs ``cmd(*inputs)`` instead, writing the same outputs, or
        ``outputs`` (existing symbols whose writers are removed: a fusion writes the
        intermediate it absorbed); the specs are checked."""
        i = self.index(node)
        old = self.graph.nodes[i]
        if outputs is not None:
            old = dataclasses.replace(old, outputs=tuple(self.symbol(s).id for s in outputs))
        ids = tuple(self.symbol(s).id for s in inputs)
        where = f"{self.name}: replace_node {i} ({old.cmd.name}) by {cmd.name}"
        try:
            specs = output_specs(cmd, [self._symbols[s].spec for s in ids])
        except FnncError as e:
            raise type(e)(f"{where}: {e}") from None
        have = [self._symbols[o].spec for o in old.outputs]
        if [(tuple(s.shape), np.dtype(s.dtype)) for s in specs] != [
            (tuple(s.shape), np.dtype(s.dtype)) for s in have
        ]:
            raise GraphError(
                f"{where}: it would write {[_spec_of(s) for s in specs]}, the node writes "
                f"{[_spec_of(s) for s in have]}"
            )
        self._replaced[i] = dataclasses.replace(old, cmd=cmd, inputs=ids)

    def remove(self, node: NodeRef) -> None:
        """Drops ``node``; its outputs must have no reader left at :meth:`finish`."""
        self._removed.add(self.index(node))

    # -- result -----------------------------------------------------------------
    @property
    def changed(self) -> bool:
        """Whether any edit was made."""
        return bool(self._before or self._after or self._replaced or self._removed or self._same)

    def finish(self, *, dead_code: bool = True, check: bool | None = None) -> Graph:
        """The edited graph: verified (``check``; default when ``fnnc.config`` checks
        are on), dead nodes dropped (``dead_code``), compacted; ``graph`` itself when
        nothing was edited.

        Raises:
            GraphError: the edits break the graph (a removed node still read, a node
                reading a symbol written after it), with the listing at that node.
        """
        if not self.changed:
            return self.graph
        order: list[Node] = []
        for i, node in enumerate(self.graph.nodes):
            order.extend(self._before.get(i, ()))
            if i not in self._removed:
                order.append(self._replaced.get(i, node))
            order.extend(self._after.get(i, ()))
        order.extend(self._before.get(len(self.graph.nodes), ()))
        symbols, nodes, outputs = self._rewired(order)
        g = self.graph
        new = Graph(tuple(symbols), tuple(nodes), g.inputs, outputs, g.out_tree, g.in_paths)
        if config.get().checks if check is None else check:
            try:
                verify(new)
            except GraphError as e:
                raise GraphError(f"{self.name}: the edits break the graph:\n{e}") from None
        return compact(dce(new) if dead_code else new)

    def _rewired(self, order: list[Node]) -> tuple[list[Symbol], list[Node], tuple[int, ...]]:
        """Applies replace_all_uses: a read of ``old`` becomes ``new`` where ``new`` is
        written before the reader (following chains of replacements)."""
        symbols = list(self._symbols)
        written: dict[int, int] = {}  # root -> position of its last write
        for pos, node in enumerate(order):
            for o in node.outputs:
                written[symbols[o].root] = pos

        def ready(sid: int, pos: int) -> bool:
            return written.get(symbols[sid].root, -1) < pos

        def resolve(sid: int, pos: int) -> int:
            while sid in self._same and ready(self._same[sid], pos):
                sid = self._same[sid]
            return sid

        nodes = []
        for pos, node in enumerate(order):
            inputs = tuple(resolve(s, pos) for s in node.inputs)
            nodes.append(
                node if inputs == node.inputs else dataclasses.replace(node, inputs=inputs)
            )
        end = len(order)
        outputs = [resolve(s, end) for s in self.graph.outputs]
        for sym in list(symbols):
            if isinstance(sym, AliasSymbol) and sym.root in self._same:
                _move_view(sym, lambda pos, r=sym.root: resolve(r, pos), symbols, nodes, outputs)
        return symbols, nodes, tuple(outputs)

    def _new(self, spec: Any) -> TensorSymbol:
        sym = TensorSymbol(len(self._symbols), tuple(spec.shape), np.dtype(spec.dtype))
        self._symbols.append(sym)
        return sym


def _move_view(
    view: AliasSymbol,
    root_at: Callable[[int], int],
    symbols: list[Symbol],
    nodes: list[Node],
    outputs: list[int],
) -> None:
    """Re-roots ``view`` (of a replaced symbol) for its uses: ``root_at(pos)`` is the root
    a use at node ``pos`` sees (``len(nodes)``: the graph outputs). When every use (read,
    write, graph output) sees one new root, the view moves onto it; otherwise it stays
    on the old root and the uses that see a new one use a fresh view of it (a view read
    before ``new`` is written must keep reading ``old``)."""
    end = len(nodes)
    uses = [p for p, n in enumerate(nodes) if view.id in n.inputs or view.id in n.outputs]
    uses += [end] * (view.id in outputs or not uses)
    roots = {p: root_at(p) for p in uses}
    targets = {r: None for r in roots.values() if not symbols[r].is_alias}
    if len(targets) == 1 and len(set(roots.values())) == 1:
        symbols[view.id] = dataclasses.replace(view, root=next(iter(targets)))
        return
    fresh: dict[int, int] = {}
    for r in targets:
        if r != view.root:
            fresh[r] = len(symbols)
            symbols.append(dataclasses.replace(view, id=len(symbols), root=r))
    for p, r in roots.items():
        if r not in fresh:
            continue
        if p == end:
            outputs[:] = [fresh[r] if s == view.id else s for s in outputs]
            continue
        swap = {view.id: fresh[r]}
        n = nodes[p]
        nodes[p] = dataclasses.replace(
            n,
            inputs=tuple(swap.get(s, s) for s in n.inputs),
            outputs=tuple(swap.get(s, s) for s in n.outputs),
        )


def _label(sym: Symbol) -> str:
    return f"%{sym.id} ({sym.name})" if sym.name else f"%{sym.id}"


def _spec(sym: Symbol) -> str:
    return f"{np.dtype(sym.dtype).name}{list(sym.shape)}"


def _spec_of(spec: Any) -> str:
    return f"{np.dtype(spec.dtype).name}{list(spec.shape)}"
