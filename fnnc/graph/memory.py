"""memory_plan: NNC-style liveness of a graph's tensors, and where its peak is.

NNC plans a concrete graph's tensor arena from liveness over the execution order
(``ccv_nnc_symbolic_graph_compile``). :func:`memory_plan` is that view for an fnnc
graph, independent of XLA's scheduler (:meth:`fnnc.graph.Program.memory` is XLA's):

- a *root* tensor occupies its bytes from the node that first writes it (graph inputs:
  from the start) through the last node that reads it or any view of it (graph
  outputs: to the end); views (aliases) share their root's bytes;
- during node ``i`` the tensors it reads and the ones it writes are live together, so
  the bytes at node ``i`` are every root whose interval holds ``i``;
- a command's internal scratch (a loop body's temporaries, a fused chain's) is not
  counted: it belongs to the command, as in NNC;
- outputs of commands that hand their inputs through (:data:`PASS_THROUGH`, e.g.
  ``optimization_barrier``) share their input's bytes.

Gradient nodes read only the forward tensors their command's ``backward_uses`` names,
so on a graph with its backward the plan shows which activations are kept for the
backward, which is what :func:`fnnc.graph.remat` trades against recomputation.

>>> from fnnc import ops
>>> from fnnc.graph import GraphBuilder, memory_plan
>>> b = GraphBuilder()
>>> x = b.input((256,), name="x")
>>> y = b.exec(ops.relu(), b.exec(ops.ewexp(), x, name="e"), name="r")
>>> plan = memory_plan(b.build([y]))
>>> plan.peak_bytes, plan.peak_node  # x and exp(x) live together at node 0
(2048, 0)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from fnnc.core.ir import Graph
from fnnc.core.text import type_str


@dataclasses.dataclass(frozen=True)
class LiveTensor:
    """One root tensor live at the peak.

    Attributes:
        id: its symbol id.
        name: its name (``""`` when unnamed).
        shape: its shape.
        dtype: its dtype name.
        bytes: its size.
        producer: the index of the node that writes it, ``None`` for a graph input.
    """

    id: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    producer: int | None


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """A graph's liveness: bytes live at each node and what is live at the peak.

    Attributes:
        graph: the graph planned.
        live_bytes: per node, the bytes live while it runs.
        peak_bytes: the largest of ``live_bytes`` (the inputs' bytes for a graph
            without nodes).
        peak_node: the index of the first node where the peak happens (``None`` when
            the graph has no nodes).
        live_at_peak: the root tensors live there, largest first.
        intervals: per root tensor id, ``(first, last)`` node indices of its liveness
            (``-1`` = from the start, ``len(nodes)`` = to the end).
    """

    graph: Graph
    live_bytes: tuple[int, ...]
    peak_bytes: int
    peak_node: int | None
    live_at_peak: tuple[LiveTensor, ...]
    intervals: dict[int, tuple[int, int]]

    def table(self, limit: int = 20) -> str:
        """The tensors live at the peak as a text table (``limit`` rows)."""
        where = "no nodes" if self.peak_node is None else self._node_label(self.peak_node)
        lines = [f"peak {self.peak_bytes:,d} bytes at {where}"]
        lines.append(f"{'tensor':<28} {'type':<22} {'bytes':>14}  producer")
        for t in self.live_at_peak[:limit]:
            label = f"%{t.id}" + (f" ({t.name})" if t.name else "")
            producer = "input" if t.producer is None else self._node_label(t.producer)
            ty = f"{t.dtype}{list(t.shape)}"
            lines.append(f"{label:<28} {ty:<22} {t.bytes:>14,d}  {producer}")
        if len(self.live_at_peak) > limit:
            lines.append(f"... {len(self.live_at_peak) - limit} more")
        return "\n".join(lines)

    def _node_label(self, index: int) -> str:
        node = self.graph.nodes[index]
        return f"node {index} ({node.name or node.cmd})"

    def __str__(self) -> str:
        return self.table()


def tensor_bytes(shape: tuple[int, ...], dtype: object) -> int:
    """Bytes of a dense tensor."""
    return math.prod(shape) * np.dtype(dtype).itemsize


PASS_THROUGH = frozenset({"optimization_barrier"})
"""Commands whose output ``i`` is input ``i``'s buffer (XLA aliases them)."""


def storage(graph: Graph) -> dict[int, int]:
    """Root id -> the root whose bytes it uses (itself, or a pass-through's input)."""
    symbols = graph.symbols
    owner: dict[int, int] = {}
    for node in graph.nodes:
        if node.cmd.name in PASS_THROUGH:
            for i, o in zip(node.inputs, node.outputs):
                src = symbols[i].root
                owner[symbols[o].root] = owner.get(src, src)
    return owner


def liveness(graph: Graph) -> dict[int, tuple[int, int]]:
    """Per storage root id, the ``(first, last)`` node indices of its liveness."""
    symbols = graph.symbols
    owner = storage(graph)
    end = len(graph.nodes)

    def root_of(sid: int) -> int:
        root = symbols[sid].root
        return owner.get(root, root)

    first: dict[int, int] = {root_of(s): -1 for s in graph.inputs}
    last: dict[int, int] = dict.fromkeys(first, -1)
    for index, node in enumerate(graph.nodes):
        for sid in node.inputs:
            root = root_of(sid)
            first.setdefault(root, index)  # read before written: zeros made here
            last[root] = index
        for sid in node.outputs:
            root = root_of(sid)
            first.setdefault(root, index)
            last[root] = max(last.get(root, index), index)
    for sid in graph.outputs:
        root = root_of(sid)
        first.setdefault(root, end)
        last[root] = end
    return {root: (first[root], last[root]) for root in first}


def memory_plan(graph: Graph) -> MemoryPlan:
    """NNC-style liveness of ``graph`` over its node order (see the module doc).

    Args:
        graph: any verified graph (a forward, or one with its backward and updates).

    Returns:
        A :class:`MemoryPlan`; ``print(plan)`` shows the peak and what is live there.
    """
    symbols = graph.symbols
    intervals = liveness(graph)
    size = {r: tensor_bytes(symbols[r].shape, symbols[r].dtype) for r in intervals}
    n = len(graph.nodes)
    delta = [0] * (n + 3)  # a difference array over positions -1..n, shifted by one
    for root, (lo, hi) in intervals.items():
        delta[lo + 1] += size[root]
        delta[hi + 2] -= size[root]
    running, at = 0, []  # at[k]: bytes live at position k - 1
    for k in range(n + 2):
        running += delta[k]
        at.append(running)
    live_bytes = tuple(at[1 : n + 1])
    if n:
        peak_node = int(np.argmax(live_bytes))
        peak = live_bytes[peak_node]
    else:
        peak_node, peak = None, at[0]
    producers = graph.producers
    where = -1 if peak_node is None else peak_node
    live = [
        LiveTensor(
            root,
            symbols[root].name,
            tuple(symbols[root].shape),
            type_str(symbols[root]).split("[")[0],
            size[root],
            producers.get(root) if root not in graph.inputs else None,
        )
        for root, (lo, hi) in intervals.items()
        if lo <= where <= hi
    ]
    live.sort(key=lambda t: -t.bytes)
    return MemoryPlan(graph, live_bytes, peak, peak_node, tuple(live), intervals)
