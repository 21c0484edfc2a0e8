"""memory_reduction: redo widening datatype conversions in the backward.

NNC's ``ccv_nnc_symbolic_graph_memory_reduction``, on a graph with its backward
(:func:`~fnnc.graph.backward`): a forward ``datatype_conversion`` whose output is
*wider* than its input (float16 -> float32, as mixed precision makes when a layer
computes in float32 from half-precision activations or weights) and whose output the
backward reads would keep the wide copy alive from the forward to the backward. The
pass keeps the narrow input instead and converts it again right before the first
backward reader (with :func:`fnnc.graph.passes.remat.recompute`, behind an
``optimization_barrier`` so XLA cannot fold the two conversions together). Lossless:
converting the same value again gives the same bits, so gradients are unchanged.

Not rewritten (as NNC): conversions to a type as narrow or narrower, outputs that are
views or viewed, and outputs the backward does not read.
"""

from __future__ import annotations

import numpy as np

from fnnc.core.ir import Graph
from fnnc.graph.passes.remat import backward_start, candidates, recompute


def reducible(graph: Graph) -> list[int]:
    """Indices of the widening conversions :func:`memory_reduction` redoes."""
    start = backward_start(graph)
    if start is None:
        return []
    symbols = graph.symbols
    viewed = {s.root for s in symbols if s.is_alias}
    found = []
    for index in candidates(graph, start):
        node = graph.nodes[index]
        if node.cmd.name != "datatype_conversion":
            continue
        x, y = symbols[node.inputs[0]], symbols[node.outputs[0]]
        if y.id in viewed or np.dtype(y.dtype).itemsize <= np.dtype(x.dtype).itemsize:
            continue
        found.append(index)
    return found


def memory_reduction(graph: Graph) -> Graph:
    """``graph`` with widening conversions the backward reads redone in the backward.

    Returns ``graph`` itself when there is none.

    >>> import numpy as np
    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder, backward, memory_plan
    >>> from fnnc.graph.passes import memory_reduction
    >>> b = GraphBuilder()
    >>> x = b.input((256, 256), np.float16, name="x")
    >>> w = b.input((256, 256), name="w")
    >>> x32 = b.exec(ops.datatype_conversion(dtype=np.float32), x, name="up")
    >>> h = b.exec(ops.tanh(), b.exec(ops.gemm(), x32, w))
    >>> loss = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.gemm(), h, w))
    >>> g, _ = backward(b.build([loss]), loss, [w])
    >>> memory_plan(memory_reduction(g)).peak_bytes < memory_plan(g).peak_bytes
    True
    """
    chosen = reducible(graph)
    return recompute(graph, set(chosen)) if chosen else graph
