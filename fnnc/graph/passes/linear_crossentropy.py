"""fuse_linear_crossentropy: a dense layer feeding the softmax cross-entropy loss becomes
one ``linear_softmax_crossentropy`` node, so the ``[N, V]`` logits are never kept."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from fnnc import ops
from fnnc.core.dtypes import is_floating
from fnnc.core.ir import AliasSymbol, Graph, Node, TensorSymbol
from fnnc.graph.passes._subgraphs import is_pure
from fnnc.ops.linear_crossentropy import CLASS_CHUNK, ROW_CHUNK, result_dtype

MIN_LOGITS = 2**22
"""Fewest logits (elements of ``[..., V]``) for which the rewrite pays: below it XLA's
fused product and softmax are as fast and their memory is small (16 MiB in float32)."""


def _private(graph: Graph, sid: int, reader: int, viewed: set[int]) -> bool:
    """``sid`` is a whole tensor, read by node ``reader`` alone and not a graph output."""
    return (
        not graph.symbol(sid).is_alias
        and sid not in viewed
        and sid not in graph.outputs
        and list(graph.consumers.get(sid, ())) == [reader]
    )


def _dense_head(graph: Graph, index: int, viewed: set[int]) -> tuple[int, ...] | None:
    """Indices of the ``gemm`` (and the ``datatype_conversion`` of its result) that the
    ``softmax_crossentropy`` node ``index`` reads as logits, or ``None``."""
    node = graph.nodes[index]
    logits, label = node.inputs
    if len(node.outputs) != 2 or graph.consumers.get(node.outputs[1]):
        return None  # the softmax is read (or is an output): it must be materialised
    if node.outputs[1] in graph.outputs or node.outputs[1] in viewed:
        return None
    lab, spec = graph.spec(label), graph.spec(logits)
    if is_floating(lab.dtype) and lab.shape == spec.shape:
        return None  # per-class targets are [N, V] themselves
    chain, sid, reader = [], logits, index
    while True:
        producer = graph.producers.get(sid)
        if producer is None or not _private(graph, sid, reader, viewed):
            return None
        cmd = graph.nodes[producer].cmd
        if not is_pure(cmd):
            return None
        chain.append(producer)
        if cmd.name == "gemm":
            break
        if cmd.name != "datatype_conversion" or len(chain) > 1:
            return None
        sid, reader = graph.nodes[producer].inputs[0], producer
    gemm = graph.nodes[chain[-1]]
    x, w, *bias = (graph.spec(s) for s in gemm.inputs)
    params = gemm.cmd.kwargs
    if params["transpose_a"] or not params["transpose_b"] or w.ndim != 2 or x.ndim < 1:
        return None
    if bias and tuple(bias[0].shape) != (w.shape[0],):
        return None
    return tuple(chain)


def spliced(
    graph: Graph, symbols: list[TensorSymbol], replaced: dict[int, list[Node]], drop: set[int]
) -> Graph:
    """``graph`` with ``symbols``, node ``i`` replaced by ``replaced[i]`` and the nodes in
    ``drop`` left out (the same object where nothing was replaced)."""
    if not replaced:
        return graph
    nodes = [
        new for i, n in enumerate(graph.nodes) if i not in drop for new in replaced.get(i, [n])
    ]
    return dataclasses.replace(graph, symbols=tuple(symbols), nodes=tuple(nodes))


def fuse_linear_crossentropy(
    graph: Graph,
    *,
    min_logits: int | None = None,
    row_chunk: int = ROW_CHUNK,
    class_chunk: int = CLASS_CHUNK,
) -> Graph:
    """Rewrites ``softmax_crossentropy(gemm[transpose_b](x, w, bias), label)`` whose
    softmax nobody reads into ``linear_softmax_crossentropy(x, w, label, bias)``.

    The logits may pass through one ``datatype_conversion`` (mixed precision computes
    the product in bfloat16 and the loss in float32): the fused command rounds each
    block's logits to the product's dtype and keeps float32 statistics, so it computes
    what the pair did. It matches when the logits (and their conversion) are read by
    the next node alone, are no graph output and are no view, when the labels are
    class indices, and when the logits have at least ``min_logits`` elements.

    Needs: a forward graph (run it before ``backward``/``minimize``, so the gradient
    comes from the fused command's blockwise backward and the softmax is never needed).

    Guarantees: the same graph object when nothing matched; otherwise the same inputs,
    outputs and loss values, and every kept symbol keeps its id (so symbols of the
    parameters still name them). The loss node writes the old loss symbol; the old
    softmax symbol becomes its ``[..., 1]`` logsumexp; the logits' symbols are left
    unreferenced (:func:`~fnnc.graph.passes.compact` drops them).

    Before / after (``min_logits=0``)::

        graph(%0:f32[4,8] x, %1:f32[50,8] w, %2:i32[4] label) {
          %3:f32[4,50] = gemm[transpose_b=True](%0, %1)
          %4:f32[4,1], %5:f32[4,50] = softmax_crossentropy(%3, %2)
          return %4
        }
        graph(%0:f32[4,8] x, %1:f32[50,8] w, %2:i32[4] label) {
          tensor %3:f32[4,50]
          %4:f32[4,1], %5:f32[4,1] = linear_softmax_crossentropy(%0, %1, %2)
          return %4
        }

    Args:
        graph: the graph.
        min_logits: fewest logits for which the rewrite is made; default
            :data:`MIN_LOGITS` (read at each call).
        row_chunk, class_chunk: the fused command's blocks.
    """
    min_logits = MIN_LOGITS if min_logits is None else min_logits
    viewed = {s.root for s in graph.symbols if isinstance(s, AliasSymbol)}
    symbols, replaced, drop = list(graph.symbols), {}, set()
    for index, node in enumerate(graph.nodes):
        if node.cmd.name != "softmax_crossentropy":
            continue
        logits = graph.spec(node.inputs[0])
        chain = _dense_head(graph, index, viewed)
        if chain is None or math.prod(logits.shape) < min_logits:
            continue
        gemm, (loss, lse) = graph.nodes[chain[-1]], node.outputs
        cmd = ops.linear_softmax_crossentropy(
            trim0=node.cmd.param("trim0"),
            trim1=node.cmd.param("trim1"),
            row_chunk=row_chunk,
            class_chunk=class_chunk,
        )
        x, w, *bias = gemm.inputs
        dtype = result_dtype(graph.spec(x).dtype)
        shape = graph.spec(loss).shape
        symbols[lse] = TensorSymbol(lse, shape, dtype, graph.symbol(lse).name)
        nodes = [Node(cmd, (x, w, node.inputs[1], *bias), (loss, lse), node.name)]
        if np.dtype(graph.spec(loss).dtype) != dtype:  # the pair computed the loss in 16 bits
            wide = TensorSymbol(len(symbols), shape, dtype, "")
            symbols.append(wide)
            nodes[0] = dataclasses.replace(nodes[0], outputs=(wide.id, lse))
            convert = ops.datatype_conversion(dtype=np.dtype(graph.spec(loss).dtype).name)
            nodes.append(Node(convert, (wide.id,), (loss,), node.name))
        replaced[index] = nodes
        drop.update(chain)
    return spliced(graph, symbols, replaced, drop)
