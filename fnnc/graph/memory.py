"""memory_plan: NNC-style liveness of a graph's tensors, and where its peak is.

NNC plans a concrete graph's tensor arena from liveness over the execution order
(``ccv_nnc_symbolic_graph_compile``). :func:`memory_plan` is that view for an fnnc
graph, independent of XLA's scheduler (:meth:`fnnc.graph.Program.memory` is XLA's):

- a *root* tensor occupies its bytes from the node that first writes it through the
  last node that reads it or any view of it (graph outputs: to the end); views
  (aliases) share their root's bytes;
- graph inputs belong to the caller, who holds them for the whole call: they are live
  from the start to the end, unless *donated* (``donate=``, as
  :func:`~fnnc.graph.compile` takes it): then, as XLA's input/output aliasing does,
  each output takes the first donated input of its shape and dtype, and when the
  output is written after that input's last read (NNC's in-place reuse) the two share
  one buffer. So a training step whose parameters and optimizer state are donated
  holds one copy of them, not two;
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
>>> plan.peak_bytes, plan.peak_node  # x (the caller's), exp(x) and relu at node 1
(3072, 1)
>>> memory_plan(b.build([y]), donate=["x"]).peak_bytes  # relu writes into x's buffer
2048
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from fnnc.core.ir import Graph, TensorSymbol, require_graph
from fnnc.core.text import type_str
from fnnc.errors import GraphInputError


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
        donated: ``(input id, output id)`` pairs that share one buffer (donation).
    """

    graph: Graph
    live_bytes: tuple[int, ...]
    peak_bytes: int
    peak_node: int | None
    live_at_peak: tuple[LiveTensor, ...]
    intervals: dict[int, tuple[int, int]]
    donated: tuple[tuple[int, int], ...] = ()

    def table(self, limit: int = 20) -> str:
        """The tensors live at the peak as a text table (``limit`` rows)."""
        where = "no nodes" if self.peak_node is None else self._node_label(self.peak_node)
        lines = [f"peak {self.peak_bytes:,d} bytes at {where}"]
        if self.donated:
            pairs = ", ".join(f"%{o} in %{i}" for i, o in self.donated)
            lines.append(f"written in place (donated): {pairs}")
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

Donate = int | str | TensorSymbol | Sequence[int | str | TensorSymbol]
"""Graph inputs whose buffers the program may reuse: positions, names or symbols (one, or a
list)."""


def donated_positions(graph: Graph, donate: Donate, where: str = "memory_plan") -> tuple[int, ...]:
    """``donate`` as sorted input positions (names are the inputs' symbol names, symbols
    the builder's input symbols; a lone position, name or symbol is one input)."""
    names = {graph.symbols[s].name: i for i, s in enumerate(graph.inputs)}
    ids = {s: i for i, s in enumerate(graph.inputs)}
    if isinstance(donate, (str, int, np.integer, TensorSymbol)):
        donate = (donate,)
    elif not isinstance(donate, Iterable):
        raise GraphInputError(
            f"{where}: donate is {type(donate).__name__} {donate!r}; give graph input "
            "positions, names or symbols: one (donate=0, donate='x') or a list (donate=[0, 'w'])"
        )
    out = set()
    for d in donate:
        if isinstance(d, TensorSymbol):
            if d.id not in ids or graph.symbols[d.id].name != d.name:
                raise GraphInputError(
                    f"{where}: donate names symbol %{d.id} ({d.name}), which is not an "
                    f"input of this graph (its inputs are {list(names)}); pass this "
                    "graph's input symbols, names or positions"
                )
            out.add(ids[d.id])
        elif isinstance(d, str):
            if d not in names:
                raise GraphInputError(
                    f"{where}: donate names input {d!r}, but the graph inputs are "
                    f"{list(names)}; pass input names or positions"
                )
            out.add(names[d])
        elif (
            isinstance(d, (int, np.integer))
            and not isinstance(d, bool)
            and (0 <= d < len(graph.inputs))
        ):
            out.add(int(d))
        else:
            raise GraphInputError(
                f"{where}: donate index {d!r} is not a graph input position "
                f"(the graph has {len(graph.inputs)} inputs: positions 0 to "
                f"{len(graph.inputs) - 1}, or their names {list(names)})"
            )
    return tuple(sorted(out))


def donation_pairs(graph: Graph, donate: Donate) -> tuple[tuple[int, int], ...]:
    """``(input position, output position)`` pairs that share a buffer when ``donate``
    is donated: JAX's rule (each output, in order, takes the first unpaired donated
    input of its shape and dtype)."""
    free: dict[tuple[Any, ...], list[int]] = {}
    for i in donated_positions(graph, donate):
        free.setdefault(_key(graph, graph.inputs[i]), []).append(i)
    pairs = []
    for j, sid in enumerate(graph.outputs):
        waiting = free.get(_key(graph, sid))
        if waiting:
            pairs.append((waiting.pop(0), j))
    return tuple(pairs)


def _key(graph: Graph, sid: int) -> tuple[Any, ...]:
    sym = graph.symbols[sid]
    return tuple(sym.shape), np.dtype(sym.dtype)


def storage(graph: Graph, donate: Donate = ()) -> dict[int, int]:
    """Root id -> the root whose bytes it uses (a pass-through's input, or the donated
    input an output is written into in place); roots using their own are absent."""
    symbols = graph.symbols
    owner: dict[int, int] = {}
    for node in graph.nodes:
        if node.cmd.name in PASS_THROUGH:
            for i, o in zip(node.inputs, node.outputs):
                src = symbols[i].root
                owner[symbols[o].root] = owner.get(src, src)
    donated = donated_positions(graph, donate)  # ``donate=0`` is input 0, not nothing
    if donated:
        owner.update(_in_place(graph, donated, owner))
    return owner


def _in_place(graph: Graph, donate: Donate, owner: dict[int, int]) -> dict[int, int]:
    """Outputs that reuse a donated input's buffer: paired by :func:`donation_pairs`
    and first written no earlier than the input's last read (else XLA copies)."""
    spans = _spans(graph, owner)
    inputs = {owner.get(r, r) for r in (graph.symbols[s].root for s in graph.inputs)}
    returned = {owner.get(r, r) for r in (graph.symbols[s].root for s in graph.outputs)}
    shared: dict[int, int] = {}
    for i, j in donation_pairs(graph, donate):
        src = graph.symbols[graph.inputs[i]].root
        out = graph.symbols[graph.outputs[j]].root
        out = owner.get(out, out)
        if out in inputs or out in shared or src in shared.values():
            continue  # an input returned as is, or a buffer already given away
        if owner.get(src, src) in returned:
            continue  # the input (or a view of it) is returned too: it holds to the end
        if spans[out][0] >= spans[src][1]:
            shared[out] = src
    return shared


def _spans(graph: Graph, owner: dict[int, int]) -> dict[int, tuple[int, int]]:
    """Per storage root, ``(first write or read, last read or write)`` over the nodes
    (graph inputs start at -1; nothing is extended to the end here)."""
    symbols = graph.symbols
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for sid in graph.inputs:
        root = owner.get(symbols[sid].root, symbols[sid].root)
        first[root], last[root] = -1, -1
    for index, node in enumerate(graph.nodes):
        for sid in (*node.inputs, *node.outputs):
            root = owner.get(symbols[sid].root, symbols[sid].root)
            first.setdefault(root, index)  # read before written: zeros made here
            last[root] = index
    return {root: (first[root], last[root]) for root in first}


def liveness(
    graph: Graph, donate: Donate = (), owner: dict[int, int] | None = None
) -> dict[int, tuple[int, int]]:
    """Per storage root id, the ``(first, last)`` node indices of its liveness
    (``-1``: from the start; ``len(graph.nodes)``: to the end); ``owner``:
    :func:`storage` of ``graph`` and ``donate`` where the caller has it."""
    symbols = graph.symbols
    owner = storage(graph, donate) if owner is None else owner
    end = len(graph.nodes)
    spans = _spans(graph, owner)
    for sid in (*graph.inputs, *graph.outputs):  # the caller's buffers, and the results
        root = owner.get(symbols[sid].root, symbols[sid].root)
        spans[root] = (spans.get(root, (end, end))[0], end)
    return spans


def memory_plan(graph: Graph, *, donate: Donate = ()) -> MemoryPlan:
    """NNC-style liveness of ``graph`` over its node order (see the module doc).

    Args:
        graph: any verified graph (a forward, or one with its backward and updates).
        donate: graph inputs (positions, names or symbols, one or a list) the program
            donates, as given to :func:`~fnnc.graph.compile` (:attr:`Program.donate` of a
            compiled one):
            outputs written after such an input's last read reuse its bytes.

    Returns:
        A :class:`MemoryPlan`; ``print(plan)`` shows the peak and what is live there.
    """
    symbols = require_graph(graph, "memory_plan").symbols
    donate = donated_positions(graph, donate)
    owner = storage(graph, donate)
    intervals = liveness(graph, donate, owner)
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
    producers = dict(graph.producers)
    for index, node in enumerate(graph.nodes):  # a tensor written only through its views
        for sid in node.outputs:
            producers.setdefault(symbols[sid].root, index)
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
    shared = tuple(
        (graph.inputs[i], graph.outputs[j])
        for i, j in donation_pairs(graph, donate)
        if owner.get(symbols[graph.outputs[j]].root) == symbols[graph.inputs[i]].root
    )
    return MemoryPlan(graph, live_bytes, peak, peak_node, tuple(live), intervals, shared)
