"""verify: the structural rules every graph obeys, checked with messages that point.

Rules: symbols are symbol records with ids equal to their positions, tuple shapes and
NumPy dtypes; node commands are :class:`~fnnc.core.command.Command` values; graph
inputs are plain tensors, each once; every node's command exists and its shape rule
reproduces the output specs; SSA (a tensor
is written once: as an input, by one node, or piecewise by disjoint alias writes);
def-before-use (a tensor, or any view of it, is read only after every write to it);
graph outputs are defined.
"""

from __future__ import annotations

from typing import NoReturn

import numpy as np

from fnnc.core.command import Command, output_specs
from fnnc.core.ir import AliasSymbol, Graph, TensorSymbol, require_graph
from fnnc.core.text import format_graph
from fnnc.errors import FnncError, GraphError


def _fail(graph: Graph, msg: str, node: int | None = None) -> NoReturn:
    try:
        listing = format_graph(graph, mark=node, window=3 if node is not None else None)
    except Exception:  # the very fault being reported may make the graph unprintable
        listing = "(no listing: the graph cannot be printed as it is)"
    raise GraphError(f"verify: {msg}\n{listing}")


def _user_of(graph: Graph, sid: int) -> int | None:
    """The first node that reads or writes ``sid``, to mark in a message."""
    return next((i for i, nd in enumerate(graph.nodes) if sid in nd.inputs + nd.outputs), None)


def verify(graph: Graph) -> Graph:
    """Checks ``graph`` and every sub-graph its commands hold (loop bodies, fused
    chains); returns it unchanged, or raises :class:`GraphError` naming the node.

    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder, verify
    >>> b = GraphBuilder()
    >>> x = b.input((3,), name="x")
    >>> g = verify(b.build([b.exec(ops.relu(), x)]))
    """
    from fnnc.graph.passes._subgraphs import holds_subgraphs, subgraphs

    _verify_one(require_graph(graph, "verify"))
    seen, stack = {id(graph)}, [graph]
    while stack:
        outer = stack.pop()
        for index, node in enumerate(outer.nodes):
            if not holds_subgraphs(node.cmd):
                continue
            for sub in subgraphs(node.cmd):
                if id(sub) in seen:
                    continue
                seen.add(id(sub))
                try:
                    _verify_one(sub)
                except GraphError as e:
                    raise GraphError(
                        f"verify: in a sub-graph held by node {index} ({node.cmd.name}):\n{e}"
                    ) from None
                stack.append(sub)
    return graph


def _verify_one(graph: Graph) -> None:
    """The rules of the module doc, for one graph (not its sub-graphs)."""
    symbols = graph.symbols
    n = len(symbols)
    for i, sym in enumerate(symbols):
        _check_symbol(graph, i, sym)
        if isinstance(sym, AliasSymbol):
            root = symbols[sym.root] if 0 <= sym.root < n else None
            if not isinstance(root, TensorSymbol):
                _fail(
                    graph,
                    f"alias {graph.label(i)} views %{sym.root}, which is not a tensor symbol",
                    _user_of(graph, i),
                )
            elif sym.outside(int(np.prod(root.shape, dtype=np.int64))):
                _fail(
                    graph,
                    f"alias {graph.label(i)} reaches outside its root "
                    f"{graph.label(sym.root)}: base {sym.base}, stride {list(sym.stride)}, "
                    f"elements {sym.first_index()} to {sym.last_index()} of "
                    f"{int(np.prod(root.shape))}",
                    _user_of(graph, i),
                )
    written: dict[int, int] = {}  # root id -> index of last node writing it (-1 = input)
    alias_writes: dict[int, list[AliasSymbol]] = {}
    for sid in graph.inputs:
        if not 0 <= sid < n or isinstance(symbols[sid], AliasSymbol):
            _fail(graph, f"graph input %{sid} is not a tensor symbol of the graph")
        if sid in written:
            _fail(graph, f"graph input {graph.label(sid)} is listed twice")
        written[sid] = -1
    first_read: dict[int, tuple[int, int]] = {}  # root -> (node, the symbol it read)
    for index, node in enumerate(graph.nodes):
        if not isinstance(node.cmd, Command):
            _fail(
                graph,
                f"node {index}{f' ({node.name})' if node.name else ''} has cmd {node.cmd!r} "
                f"of type {type(node.cmd).__name__}; expected a Command (e.g. ops.relu())",
                index,
            )
        for sid in node.inputs:
            if not 0 <= sid < n:
                _fail(graph, f"node {index} reads %{sid}, which is not in the graph", index)
            root = symbols[sid].root
            if root not in written:
                later = any(symbols[o].root == root for m in graph.nodes for o in m.outputs)
                why = (
                    "; write it before this node"
                    if later
                    else "; no node writes it: if callers feed it (NNC's tensor symbols that "
                    "no command writes), make it a graph input: GraphBuilder.input(...), "
                    "or add_input(it) for one made with tensor()"
                )
                _fail(
                    graph,
                    f"node {index} ({node.cmd.name}) reads {graph.label(sid)} before it is "
                    f"written{why}",
                    index,
                )
            first_read.setdefault(root, (index, sid))
        try:
            specs = output_specs(node.cmd, [symbols[s].spec for s in node.inputs])
        except FnncError as e:
            _fail(graph, f"node {index} ({node.name or node.cmd.name}): {e}", index)
        if len(specs) != len(node.outputs):
            _fail(
                graph,
                f"node {index} ({node.cmd.name}) has {len(node.outputs)} outputs, its "
                f"command produces {len(specs)}",
                index,
            )
        for sid, spec in zip(node.outputs, specs):
            if not 0 <= sid < n:
                _fail(graph, f"node {index} writes %{sid}, which is not in the graph", index)
            sym = symbols[sid]
            if sym.shape != tuple(spec.shape) or np.dtype(sym.dtype) != np.dtype(spec.dtype):
                _fail(
                    graph,
                    f"node {index} ({node.cmd}) declares {graph.label(sid)} as "
                    f"{np.dtype(sym.dtype).name}{list(sym.shape)}, its shape rule gives "
                    f"{np.dtype(spec.dtype).name}{list(spec.shape)}",
                    index,
                )
            _check_write(graph, index, sym, written, alias_writes, first_read)
    for sid in graph.outputs:
        if not 0 <= sid < n or symbols[sid].root not in written:
            label = graph.label(sid) if 0 <= sid < n else f"%{sid}"
            _fail(graph, f"graph output {label} is never written")
    for root, views in alias_writes.items():
        _check_disjoint(graph, root, views)


def _check_symbol(graph: Graph, i: int, sym: object) -> None:
    """Symbol ``i`` is a symbol record with id ``i``, a tuple shape and a dtype."""
    if not isinstance(sym, (TensorSymbol, AliasSymbol)):
        _fail(graph, f"symbol at position {i} is {sym!r}; expected a TensorSymbol or AliasSymbol")
    if sym.id != i:
        _fail(
            graph,
            f"symbol at position {i} has id {sym.id}; ids equal positions (rebuild the "
            "symbol with dataclasses.replace(sym, id=position), or build with GraphBuilder)",
        )
    shape = sym.shape
    if not isinstance(shape, tuple) or not all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        _fail(
            graph,
            f"symbol {graph.label(i)} has shape {shape!r} ({type(shape).__name__}); expected a "
            "tuple of non-negative ints, e.g. shape=(2, 3)",
            _user_of(graph, i),
        )
    try:
        np.dtype(sym.dtype)
    except TypeError:
        _fail(
            graph,
            f"symbol {graph.label(i)} has dtype {sym.dtype!r}; expected a NumPy dtype",
            _user_of(graph, i),
        )


def _check_write(graph, index, sym, written, alias_writes, first_read) -> None:
    root = sym.root
    if root in first_read and first_read[root][0] < index:
        reader, read = first_read[root]
        view = ""
        if read == root and read != sym.id:
            view = f" whole, as {graph.label(root)}"
        elif read != sym.id:
            view = f" through {graph.label(read)}, a view of the same tensor {graph.label(root)}"
        _fail(
            graph,
            f"node {index} writes {graph.label(sym.id)} after node {reader} already read "
            f"it{view} (def-before-use: write every part of a tensor before any node reads it)",
            index,
        )
    if isinstance(sym, AliasSymbol):
        if root in written and root not in alias_writes:
            _fail(
                graph,
                f"node {index} writes alias {graph.label(sym.id)} of "
                f"{graph.label(root)}, which is already written whole (SSA)",
                index,
            )
        if any(v.id == sym.id for v in alias_writes.get(root, ())):
            _fail(graph, f"node {index} writes alias {graph.label(sym.id)} a second time", index)
        alias_writes.setdefault(root, []).append(sym)
    elif root in written:
        how = "is a graph input" if written[root] == -1 else f"was written by node {written[root]}"
        _fail(
            graph,
            f"node {index} writes {graph.label(sym.id)}, which {how} (SSA: each "
            "symbol is written once; write a new symbol instead)",
            index,
        )
    written[root] = index


def _check_disjoint(graph: Graph, root: int, views: list[AliasSymbol]) -> None:
    if len(views) < 2:
        return
    seen = np.zeros(int(np.prod(graph.symbol(root).shape)), dtype=bool)
    for view in views:
        idx = view.flat_indices().reshape(-1)
        if seen[idx].any():
            _fail(
                graph,
                f"alias writes into {graph.label(root)} overlap at alias "
                f"{graph.label(view.id)} (disjoint alias writes only)",
                graph.producers.get(view.id),
            )
        seen[idx] = True
