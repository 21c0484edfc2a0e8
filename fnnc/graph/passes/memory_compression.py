"""memory_compression: keep convolution activations for the backward LSSC-compressed.

NNC's ``ccv_nnc_symbolic_graph_memory_compression``, on a graph with its backward
(:func:`~fnnc.graph.backward`). It picks, as NNC does:

- the input ``x`` of every forward ``convolution`` (what NNC finds as input 1 of
  ``CONVOLUTION_BACKWARD``) and its output (NNC: output 0 of
  ``CONVOLUTION_FORWARD``, kept for e.g. a following norm's or activation's backward);
- only those a backward node reads and a forward node writes (not graph inputs), that
  are neither views nor viewed (NNC skips aliased tensors), and that are not graph
  outputs; fnnc also needs float tensors of a 2-D convolution (``[N, H, W, C]``: LSSC
  takes 4x4 blocks of one sample's ``H x W`` plane; a 1-D convolution's ``[N, L, C]``
  would put four samples in a block, making one sample's gradient depend on the
  others, so it is not compressed), and every backward reader to be a ``gradient``
  node (so the lossy values reach gradients only, as in NNC, where only backward
  commands are rewired).

Each picked tensor is compressed (:func:`~fnnc.ops.lssc_compress`) right after the
node that writes it and decompressed (:func:`~fnnc.ops.lssc_decompress`, back to its
shape and dtype) right before its first backward reader; backward readers read the
decompressed copy. Between the two only the words live: 1/8 of float32 bytes, 1/4 of
float16. Forward readers keep the exact values, so the forward and the loss are
unchanged; gradients are approximate (each value is rounded to one of four levels of
its 4x4 block, error up to 1/6 of the block's range).

The levels are float16, as in NNC (whose commands take half only): a float32
activation beyond float16's range (``|x| > 65504``) decompresses to an infinity, and
the gradients that read it become infinities or NaN. The pass cannot see values; turn
on the numerics check (``FNNC_CHECKS=numerics``) and it raises naming the
``<name>.unlssc`` decompression. Activations that large need a normalisation before
the convolution, or no compression.

Before / after::

    %3 = convolution(%0, %1)               %3 = convolution(%0, %1)
    %4 = relu(%3)                          %9 = lssc_compress(%3)
    ...                                    %4 = relu(%3)
    %7 = convolution.backward(%6, %0, %1)  ...
    %8 = relu.backward(%5, %3)  # reads %3 %10 = lssc_decompress[size=..](%9)
                                           %8 = relu.backward(%5, %10)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fnnc.core.dtypes import is_floating
from fnnc.core.ir import Graph, Node, TensorSymbol
from fnnc.graph.passes.remat import backward_start
from fnnc.ops import lssc_compress, lssc_decompress

COMPRESSED_COMMANDS = ("convolution",)
"""Forward commands whose input 0 and output 0 are compressed (NNC: convolution)."""


def compressible(graph: Graph) -> list[int]:
    """The root ids :func:`memory_compression` compresses (see the module doc)."""
    start = backward_start(graph)
    if start is None:
        return []
    symbols, producers = graph.symbols, graph.producers
    viewed = {s.root for s in symbols if s.is_alias}
    outputs = {symbols[s].root for s in graph.outputs}
    picked: list[int] = []
    for node in graph.nodes[:start]:
        # a 2-D convolution (weights [O, kh, kw, C]) on [N, H, W, C] or one [H, W, C]
        # image: LSSC's 4x4 blocks lie in one sample's plane; a 1-D one's [N, L, C] would
        # put several samples in a block
        two_d = len(node.inputs) > 1 and len(symbols[node.inputs[1]].shape) == 4
        if node.cmd.name in COMPRESSED_COMMANDS and two_d:
            picked += [node.inputs[0], node.outputs[0]]
    late: dict[int, list[Node]] = {}
    for node in graph.nodes[start:]:
        for s in node.inputs:
            late.setdefault(s, []).append(node)
    found = []
    for sid in dict.fromkeys(picked):
        sym = symbols[sid]
        readers = late.get(sid, [])
        if (
            sym.is_alias
            or sid in viewed
            or sid in outputs
            or producers.get(sid, start) >= start
            or not readers
            or any(r.cmd.name != "gradient" for r in readers)
            or len(sym.shape) not in (3, 4)  # [N, H, W, C] or [H, W, C]
            or not is_floating(sym.dtype)
        ):
            continue
        found.append(sid)
    return found


def memory_compression(graph: Graph) -> Graph:
    """``graph`` with convolution activations kept for the backward compressed.

    Args:
        graph: a graph holding a forward and its backward (gradient nodes).

    Returns:
        The rewritten graph, or ``graph`` itself when nothing is compressed (no
        backward, no convolution activation the backward reads).

    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder, backward, memory_plan
    >>> from fnnc.graph.passes import memory_compression
    >>> b = GraphBuilder()
    >>> x, w = b.input((2, 16, 16, 8), name="x"), b.input((8, 3, 3, 8), name="w")
    >>> h = b.exec(ops.convolution(padding="SAME"), x, w, name="c1")
    >>> h = b.exec(ops.convolution(padding="SAME"), h, w, name="c2")
    >>> loss = b.exec(ops.reduce_sum(axes=(0, 1, 2, 3)), h)
    >>> g, _ = backward(b.build([loss]), loss, [w])
    >>> c = memory_compression(g)
    >>> [n.cmd.name for n in c.nodes].count("lssc_compress")  # c1's output
    1
    """
    picked = compressible(graph)
    if not picked:
        return graph
    start = backward_start(graph)
    assert start is not None
    symbols = list(graph.symbols)

    def new(shape: tuple[int, ...], dtype: object, name: str) -> int:
        sym = TensorSymbol(len(symbols), tuple(shape), dtype, name)
        symbols.append(sym)
        return sym.id

    producers = graph.producers
    after: dict[int, list[int]] = {}
    for sid in picked:
        after.setdefault(producers[sid], []).append(sid)
    words: dict[int, int] = {}
    nodes: list[Node] = []
    for index, node in enumerate(graph.nodes[:start]):
        nodes.append(node)
        for sid in after.get(index, []):
            sym = symbols[sid]
            spec = lssc_compress().shape(sym.spec)[0]
            words[sid] = new(spec.shape, spec.dtype, f"{sym.name}.lssc" if sym.name else "")
            nodes.append(Node(lssc_compress(), (sid,), (words[sid],), f"{sym.name}.lssc"))
    restored: dict[int, int] = {}
    for node in graph.nodes[start:]:
        for sid in node.inputs:
            if sid in words and sid not in restored:
                sym = symbols[sid]
                cmd = lssc_decompress(size=tuple(sym.shape[-3:-1]), dtype=np.dtype(sym.dtype).name)
                restored[sid] = new(sym.shape, sym.dtype, f"{sym.name}.unlssc" if sym.name else "")
                nodes.append(Node(cmd, (words[sid],), (restored[sid],), f"{sym.name}.unlssc"))
        inputs = tuple(restored.get(s, s) for s in node.inputs)
        nodes.append(dataclasses.replace(node, inputs=inputs) if inputs != node.inputs else node)
    return dataclasses.replace(graph, symbols=tuple(symbols), nodes=tuple(nodes))
