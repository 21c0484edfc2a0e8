"""Memory options of a cnnp model's training programs (NNC's ``ccv_cnnp_model_set_*``).

NNC applies these while it builds a model's training graph; fnnc applies them to the
graph with its backward, before ``simplify`` and ``compile``:

* gradient checkpointing (:meth:`fnnc.models.Model.set_gradient_checkpointing`, on
  any sub-model or the whole model): :func:`fnnc.graph.remat` with
  :func:`checkpoint_policy`, which does not save the nodes built inside a checkpointed
  sub-model except those making its outputs;
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

from fnnc.core.ir import Graph
from fnnc.graph.passes.memory_compression import memory_compression
from fnnc.graph.passes.memory_reduction import memory_reduction
from fnnc.graph.passes.remat import Policy, remat
from fnnc.models.layer import Checkpoint


def checkpoint_policy(checkpoints: Sequence[Checkpoint]) -> Policy:
    """A :func:`~fnnc.graph.remat` policy: a forward node is saved unless one of its
    outputs was made inside a checkpointed sub-model and is not among its outputs."""

    def inside(sid: int) -> bool:
        return any(c.first <= sid < c.last and sid not in c.outputs for c in checkpoints)

    def saved(graph: Graph, index: int) -> bool:
        symbols = graph.symbols
        return not any(inside(symbols[s].root) for s in graph.nodes[index].outputs)

    return saved


@dataclasses.dataclass(frozen=True)
class MemoryOptions:
    """What to apply to one build's training graph (see the module doc)."""

    checkpoints: tuple[Checkpoint, ...] = ()
    compression: bool = False
    reduction: bool = False

    @staticmethod
    def of(model: Any, checkpoints: Sequence[Checkpoint]) -> MemoryOptions:
        """The options of ``model`` (the outermost one) for a build that recorded
        ``checkpoints``."""
        return MemoryOptions(
            tuple(checkpoints),
            bool(getattr(model, "memory_compression", False)),
            bool(getattr(model, "memory_reduction", False)),
        )

    def __call__(self, graph: Graph) -> Graph:
        """``graph`` (forward + backward) with the options applied."""
        if self.checkpoints:
            graph = remat(graph, policy=checkpoint_policy(self.checkpoints))
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
    from fnnc.graph.passes.remat import backward_start

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
