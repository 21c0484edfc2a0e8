"""Higher-order gradients: ``backward(..., create_graph=True)`` records the gradient.

The gradient program :func:`~.autodiff.backward` compiles is a graph of the recorded
forward's values (the activations it reads, the seeds); instead of running it aside,
``create_graph`` records it in the dynamic graph as one ``call[graph]`` node on those
versions. Its outputs are then ordinary recorded variables: a second ``backward``
differentiates through the ``call`` node (its backward applies each gradient
command's own backward rule, as the static graph's second order does) and on through
the forward nodes that made the activations, so the total derivative comes out.

Like ``torch.autograd.grad(create_graph=True)``, the recorded gradients are returned
and not accumulated into :meth:`~.DynamicGraph.grad`: a second ``backward`` with
respect to the same variables starts from zero (accumulate into them explicitly, or
use a plain ``backward``, when that is wanted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fnnc.core.ir import Graph
from fnnc.ops.call import call

from .execute import run_reads
from .record import Read, Version
from .variable import Slot, Variable

if TYPE_CHECKING:
    from .graph import DynamicGraph


def record(dg: DynamicGraph, graph: Graph, args: Sequence[Any]) -> list[Version]:
    """Records ``graph`` on ``args`` (versions, reads of a variable such as a ``df``
    seed, or arrays taken as constants) as one ``call`` node; returns its output
    versions."""
    reads = [_read(dg, a) for a in args]
    return list(run_reads(dg, call(graph=graph), reads, "backward(create_graph)"))


def _read(dg: DynamicGraph, a: Any) -> Read:
    if isinstance(a, Version):
        return a, None
    if isinstance(a, tuple):  # already a read (version, view)
        return a
    return dg._leaf(a, grad=False), None


def variables(outs: Sequence[Version], ws: Sequence[Variable], dg: DynamicGraph) -> list[Variable]:
    """Variables holding the recorded gradients, named ``grad(w)``; differentiable."""
    made = []
    for v, w in zip(outs, ws):
        name = f"grad({w.name})" if w.name else ""
        v.name = v.name or name
        made.append(Variable(dg, Slot(v, name, True), None, name))
    return made
