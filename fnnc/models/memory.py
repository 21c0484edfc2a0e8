"""Memory options of a cnnp model's training programs (NNC's ``ccv_cnnp_model_set_*``).

NNC applies these while it builds a model's training graph; fnnc applies them to the
graph with its backward, before ``simplify`` and ``compile``:

* gradient checkpointing (:meth:`fnnc.models.Model.set_gradient_checkpointing`, on
  any sub-model or the whole model): :func:`fnnc.graph.remat` with
  :func:`checkpoint_policy`, which does not save the nodes built inside a checkpointed
  sub-model except those making its outputs (found again by their nodes after
  ``precision=`` and forward passes, which give them new ids);
* memory reduction (:meth:`~fnnc.models.Model.set_memory_reduction`, whole model):
  :func:`fnnc.graph.passes.memory_reduction`;
* memory compression (:meth:`~fnnc.models.Model.set_memory_compression`, whole
  model): :func:`fnnc.graph.passes.memory_compression`.

Which sub-models are checkpointed is read when a program is built, so
:func:`memory_key` (part of the engine's program cache key) changes when a flag does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from fnnc.core.ir import Graph, Node
from fnnc.graph.passes.memory_compression import memory_compression
from fnnc.graph.passes.memory_reduction import memory_reduction
from fnnc.graph.passes.remat import Policy, backward_start, remat
from fnnc.models.layer import BuildContext, Checkpoint


def checkpoint_policy(checkpoints: Sequence[Checkpoint], made: Sequence[Node] = ()) -> Policy:
    """A :func:`~fnnc.graph.remat` policy: a forward node is saved unless one of its
    outputs was made inside a checkpointed sub-model and is not among its outputs.

    ``made`` are the nodes the build made (``BuildContext.nodes()``), with the ids the
    checkpoints count. Passes before ``backward`` (``precision=``'s ``cast_precision``,
    the user's forward passes) give nodes new output ids, so the regions are carried to
    the graph the policy sees by its nodes, in order: the ``k``-th node named ``n``
    running command ``c`` there is the ``k``-th one the build made (when both have as
    many; else a name inside or outside every region alike says which), and a node the
    build did not make (a conversion, a fused chain) is inside when it reads a tensor
    made inside. Without ``made``, ids are taken as the build made them."""

    def inside(sid: int) -> bool:
        return any(c.first <= sid < c.last and sid not in c.outputs for c in checkpoints)

    if not made:

        def saved_by_id(graph: Graph, index: int) -> bool:
            symbols = graph.symbols
            return not any(inside(symbols[s].root) for s in graph.nodes[index].outputs)

        return saved_by_id

    built: dict[tuple[str, str], list[bool]] = {}
    for node in made:
        built.setdefault(_key(node), []).append(any(map(inside, node.outputs)))
    marks: dict[int, tuple[Graph, list[bool]]] = {}  # id(graph) -> (graph, inside per node)

    def saved(graph: Graph, index: int) -> bool:
        if id(graph) not in marks or marks[id(graph)][0] is not graph:
            marks[id(graph)] = (graph, _carry(built, graph))
        return not marks[id(graph)][1][index]

    return saved


def _key(node: Node) -> tuple[str, str]:
    return node.name, node.cmd.name


def _carry(built: dict[tuple[str, str], list[bool]], graph: Graph) -> list[bool]:
    """Whether each forward node of ``graph`` is inside a region (see
    :func:`checkpoint_policy`); backward nodes are not counted."""
    start = backward_start(graph)
    forward = graph.nodes[:start] if start is not None else graph.nodes
    counts: dict[tuple[str, str], int] = {}
    for node in forward:
        counts[_key(node)] = counts.get(_key(node), 0) + 1
    seen: dict[tuple[str, str], int] = {}
    made_inside: set[int] = set()
    result = []
    for node in forward:
        key = _key(node)
        k = seen[key] = seen.get(key, -1) + 1
        old = built.get(key, ())
        if len(old) == counts[key]:
            here = old[k]
        elif old and len(set(old)) == 1:
            here = old[0]
        else:
            here = any(graph.symbols[s].root in made_inside for s in node.inputs)
        if here:
            made_inside.update(node.outputs)
        result.append(here)
    return result + [False] * (len(graph.nodes) - len(forward))


@dataclasses.dataclass(frozen=True)
class MemoryOptions:
    """What to apply to one build's training graph (see the module doc)."""

    checkpoints: tuple[Checkpoint, ...] = ()
    compression: bool = False
    reduction: bool = False
    made: tuple[Node, ...] = ()  # the build's nodes, to find the regions after passes

    @staticmethod
    def of(model: Any, ctx: BuildContext) -> MemoryOptions:
        """The options of ``model`` (the outermost one) for the build ``ctx``: the
        checkpoints it recorded, found by its nodes (:func:`checkpoint_policy`)."""
        return MemoryOptions(
            tuple(ctx.checkpoints),
            bool(getattr(model, "memory_compression", False)),
            bool(getattr(model, "memory_reduction", False)),
            ctx.nodes() if ctx.checkpoints else (),
        )

    def __call__(self, graph: Graph) -> Graph:
        """``graph`` (forward + backward) with the options applied."""
        if self.checkpoints:
            graph = remat(graph, policy=checkpoint_policy(self.checkpoints, self.made))
        if self.reduction:
            graph = memory_reduction(graph)
        if self.compression:
            graph = memory_compression(graph)
        return graph


def memory_key(model: Any) -> tuple[Any, ...]:
    """The memory flags of ``model`` and every sub-model in it, for program caching."""
    flags: list[Any] = [
        bool(getattr(model, "memory_compression", False)),
        bool(getattr(model, "memory_reduction", False)),
    ]
    seen: set[int] = set()
    stack = [model]
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        if getattr(m, "gradient_checkpointing", False):
            flags.append(id(m))
        stack.extend(io.layer for io in getattr(m, "_order", ()) if io.layer is not None)
    return tuple(flags)


def saved_activation_bytes(graph: Graph) -> int:
    """Bytes a forward node writes and the backward still holds: every root made before
    the first ``gradient`` node and live after it (graph inputs, i.e. parameters and the
    batch, are not counted). What checkpointing, compression and reduction shrink."""
    from fnnc.graph.memory import liveness, storage, tensor_bytes

    start = backward_start(graph)
    if start is None:
        return 0
    symbols, owner = graph.symbols, storage(graph)
    inputs = {owner.get(symbols[s].root, symbols[s].root) for s in graph.inputs}
    return sum(
        tensor_bytes(symbols[root].shape, symbols[root].dtype)
        for root, (first, last) in liveness(graph).items()
        if root not in inputs and 0 <= first < start <= last
    )
