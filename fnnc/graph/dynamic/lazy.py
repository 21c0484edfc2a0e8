"""Lazy mode: recorded commands run at a sync point as one compiled program.

``DynamicGraph(lazy=True)`` runs each command's shape rule at once (so mistakes show
where they are made) but not its forward. Reading a value, ``backward``,
``apply_gradients`` and ``minimize`` call :func:`flush`, which

1. picks the pending nodes whose results something needs: a live variable, or a
   node that stays recorded for gradients (dead pending work is dropped unrun);
2. extracts them as one canonical graph (inputs: the values they read; outputs: the
   versions needed), runs the graph's ``passes`` on it (``DynamicGraph(passes=)``),
   simplifies it (as ``Model.fit``'s programs are) and compiles it once per structure,
   cached like gradient programs;
3. runs it and stores the values, then prunes the record as in eager mode.

A training loop records the same commands every step, so each step after the first
runs one cached program for its forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fnnc.core.ir import Graph
from fnnc.errors import GraphError
from fnnc.graph.builder import GraphBuilder
from fnnc.graph.compile import compile
from fnnc.graph.inline import inline
from fnnc.graph.passes.pipeline import run_passes, simplify

from .extract import PROGRAMS, extract
from .record import Version, to_flush

if TYPE_CHECKING:
    from .graph import DynamicGraph


def flush(dg: DynamicGraph) -> None:
    """:meth:`DynamicGraph.flush`: runs every pending command whose result is needed."""
    if any(node.pending for node in dg._record.nodes.values()):
        run_with(dg, None, ())


def run_with(dg: DynamicGraph, tail: Graph | None, args: Sequence[Any]) -> Any:
    """Runs the pending work and then ``tail`` on ``args`` (versions or arrays) as one
    program; returns ``tail``'s outputs.

    ``backward`` passes its gradient graph as ``tail``: the forward and the backward
    of a lazy step compile to one XLA computation.
    """
    record = dg._record
    with record.hold():
        run, outs = to_flush(record)
        ex = extract(run, outputs=[(v, None) for v in outs])
        sym_of = {v.id: sid for sid, v in ex.versions.items()}
        spots, extra = [], []
        for a in args:
            if isinstance(a, Version) and a.id in sym_of:
                spots.append(sym_of[a.id])
            else:
                spots.append(-1 - len(extra))
                extra.append(a.value if isinstance(a, Version) else a)
        key = ("flush", ex.key, tail, tuple(spots), dg.passes)
        program, fresh = PROGRAMS.get(
            key, lambda: compile(simplify(_passes(dg, _compose(ex.graph, tail, spots))))
        )
        dg.num_compiled += fresh
        values = program(*(ex.versions[s].value for s in ex.inputs), *extra)
        values = values if isinstance(values, tuple) else (values,)
        for v, value in zip(outs, values):
            v.value = value
        ran = {node.id for node in run}
        dead = [n for n in record.nodes.values() if n.pending and n.id not in ran]
        record.drop(dead)
        for node in dead:
            del record.nodes[node.id]
        for node in run:
            node.pending = False
    if record.garbage > record.limit or len(record.nodes) > record.limit:
        dg.collect()
    rest = values[len(outs) :]
    return rest[0] if len(rest) == 1 else tuple(rest)


def _passes(dg: DynamicGraph, graph: Graph) -> Graph:
    """``graph`` after the user's passes, which must keep its inputs and outputs."""
    return passes_on(dg.passes, graph)


def passes_on(passes: tuple[Any, ...], graph: Graph) -> Graph:
    """``graph`` after ``passes`` (a graph's ``passes``), which must keep its inputs and
    outputs; a backward's forward gets them too (:func:`.autodiff._rewritten`)."""
    if not passes:
        return graph
    new = run_passes(graph, passes)
    if new.input_specs != graph.input_specs or new.output_specs != graph.output_specs:
        names = [getattr(p, "__name__", p) for p in passes]
        raise GraphError(
            f"DynamicGraph: passes {names} changed a lazy flush's inputs or outputs; a "
            "pass must keep them (their number, shapes and dtypes)"
        )
    return new


def _compose(forward: Graph, tail: Graph | None, spots: Sequence[int]) -> Graph:
    """``forward`` then ``tail`` inlined: tail input ``i`` is forward symbol ``spots[i]``
    or, when negative, a new input (in order); outputs: forward's, then tail's."""
    if tail is None:
        return forward
    b = GraphBuilder.from_graph(forward)
    ins = [
        forward.symbols[s] if s >= 0 else b.input(tail.spec(sid).shape, tail.spec(sid).dtype)
        for s, sid in zip(spots, tail.inputs)
    ]
    outs = inline(b, tail, ins)
    return b.build([*(forward.symbols[s] for s in forward.outputs), *outs])
