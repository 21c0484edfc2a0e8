"""fuse_linear_crossentropy_mean: a fused dense + cross-entropy loss that a mean over
all rows reduces becomes one ``linear_softmax_crossentropy_mean`` node, which makes its
gradient in the forward and so saves the backward's recomputed logits (a training
graph's pass: see :mod:`fnnc.ops.linear_crossentropy_mean`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from fnnc import ops
from fnnc.core.ir import AliasSymbol, Graph, Node, TensorSymbol
from fnnc.graph.passes.linear_crossentropy import _private, spliced
from fnnc.ops.linear_crossentropy import result_dtype

BLOCK_BYTES = 2**28
"""Bytes of one row block's logits, in the dtype the product emits them (the head's
inputs'): 256 MiB, so a block is ``[2048, 32768]`` in float32 and ``[4096, 32768]`` in
bfloat16. The rows of a block are this over the vocabulary, so its ``[rows, V]``
product stays large enough to fill a GPU.

By bytes, not by logits: every block adds its ``[V, D]`` share of the weight's
gradient into a float32 accumulator (128 MiB at the LM of issue 24), so fewer blocks
are less traffic, and a 16-bit block of twice the rows holds what a float32 one did.
"""

BLOCK_LOGITS = BLOCK_BYTES // 4
"""A float32 block's logits (``2**26``): the default of sessions before 16-bit blocks."""

MIN_BLOCKS = 4
"""Fewest row blocks (where there are that many rows): however small the head, the
full logits never exist at once, a quarter of them in float32 at most (half the bytes
of the unfused pair's bfloat16 logits, which its backward keeps besides)."""

IN_FIT = True
"""Whether ``Model.fit`` runs this pass on its training step (read at each compile).
Off, the step keeps the blockwise command, whose backward recomputes the logits: for
benchmarks that time the two (``benchmarks/lm_step.py``'s ``fnnc-blockwise``)."""


def _mean_chain(graph: Graph, index: int, viewed: set[int]) -> tuple[int, ...] | None:
    """Indices of the optional ``datatype_conversion`` and the ``reduce_mean`` over
    every axis that reduce the loss of ``linear_softmax_crossentropy`` node ``index``."""
    node = graph.nodes[index]
    loss, lse = node.outputs
    if graph.consumers.get(lse) or lse in graph.outputs or lse in viewed:
        return None  # the logsumexp is read: keep the command that writes it
    chain, sid, reader = [], loss, None
    while True:
        readers = list(graph.consumers.get(sid, ()))
        if len(readers) != 1 or not _private(graph, sid, readers[0], viewed):
            return None
        reader = readers[0]
        cmd = graph.nodes[reader].cmd
        chain.append(reader)
        if cmd.name == "reduce_mean":
            break
        if cmd.name != "datatype_conversion" or len(chain) > 1:
            return None
        sid = graph.nodes[reader].outputs[0]
    mean = graph.nodes[reader]
    rank = len(graph.spec(sid).shape)
    axes = sorted(int(a) % rank for a in mean.cmd.param("axes")) if rank else []
    out = graph.spec(mean.outputs[0])
    if axes != list(range(rank)) or tuple(out.shape) != (1,) * rank:
        return None
    return tuple(chain)


def fuse_linear_crossentropy_mean(graph: Graph, *, block_logits: int | None = None) -> Graph:
    """Rewrites ``reduce_mean(linear_softmax_crossentropy(x, w, label, bias)[0])`` (all
    axes, through at most one ``datatype_conversion``), whose logsumexp nobody reads,
    into ``linear_softmax_crossentropy_mean(x, w, label, bias)``.

    The fused command computes the mean's gradient with respect to ``x``, ``w`` and
    ``bias`` in its forward, while each row block's logits exist, and its backward
    only scales them: three ``N x D x V`` products per step instead of four. That is a
    saving only where a backward follows, so run it on training graphs, after
    :func:`~fnnc.graph.passes.fuse_linear_crossentropy` and before ``backward`` /
    ``minimize`` (``Model.fit`` does).

    float16 heads are left alone: the command would multiply their gradient in float32
    (``(softmax - t) / N`` underflows float16), which costs what it saves.

    Guarantees: the same graph object when nothing matched; otherwise the same inputs,
    outputs and values (the mean is taken in float32, as the fused command keeps its
    losses), and every kept symbol keeps its id. The ``reduce_mean``'s output symbol is
    written by the new node (through a ``datatype_conversion`` where it was 16-bit);
    the per-row losses and logsumexp are left unreferenced.

    Before / after::

        %4:f32[4,1], %5:f32[4,1] = linear_softmax_crossentropy(%0, %1, %2)
        %6:f32[1,1] = reduce_mean[axes=(0, 1)](%4)
        ...
        %6:f32[1,1], %7:f32[4,8], %8:f32[50,8], %9:f32[50] =
            linear_softmax_crossentropy_mean[row_chunk=1](%0, %1, %2)

    Args:
        graph: the graph.
        block_logits: logits per row block; a block has ``block_logits // V`` rows,
            at least one and at most a :data:`MIN_BLOCKS` th of them. ``None``: as many
            as :data:`BLOCK_BYTES` holds in the head's dtype.
    """
    viewed = {s.root for s in graph.symbols if isinstance(s, AliasSymbol)}
    symbols, replaced, drop = list(graph.symbols), {}, set()
    for index, node in enumerate(graph.nodes):
        if node.cmd.name != "linear_softmax_crossentropy":
            continue
        chain = _mean_chain(graph, index, viewed)
        if chain is None:
            continue
        x, w, label, *bias = node.inputs
        xs, ws = graph.spec(x), graph.spec(w)
        if np.dtype(xs.dtype) == np.float16:
            continue  # its float32 gradient products would cost what the saved one does
        rows = int(np.prod(xs.shape[:-1], dtype=np.int64))
        block = block_logits
        if block is None:
            block = BLOCK_BYTES // np.dtype(xs.dtype).itemsize
        cmd = ops.linear_softmax_crossentropy_mean(
            trim0=node.cmd.param("trim0"),
            trim1=node.cmd.param("trim1"),
            row_chunk=max(1, min(-(-rows // MIN_BLOCKS), block // max(ws.shape[0], 1))),
        )
        acc = result_dtype(xs.dtype)
        mean = graph.nodes[chain[-1]].outputs[0]
        grads = []
        for shape in (xs.shape, ws.shape, (ws.shape[0],)):
            grads.append(len(symbols))
            symbols.append(TensorSymbol(len(symbols), tuple(shape), acc, ""))
        new = [Node(cmd, (x, w, label, *bias), (mean, *grads), node.name)]
        want = np.dtype(graph.spec(mean).dtype)
        if want != acc:  # the loss was reduced in 16 bits
            wide = TensorSymbol(len(symbols), tuple(graph.spec(mean).shape), acc, "")
            symbols.append(wide)
            new[0] = dataclasses.replace(new[0], outputs=(wide.id, *grads))
            new.append(Node(ops.datatype_conversion(dtype=want.name), (wide.id,), (mean,), ""))
        replaced[index] = new
        drop.update(chain)
    return spliced(graph, symbols, replaced, drop)
