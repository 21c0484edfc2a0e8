"""Loops over blocks (``scan``, ``pipeline``): their backward body is derived from the block.

A ``scan`` node holds a ``forward`` body (the block, whose first ``n_carry + n_ys``
outputs are its results, then the tensors the backward reads) and a ``backward`` body
that :func:`~fnnc.graph.scan.scan_bodies` derived from the block when the loop was
built. A rewrite that changes what the block computes (a user's rule swapping
``relu`` for ``leaky_relu``) must derive the backward again: rewriting both bodies on
their own leaves ``gradient[of=relu]`` in the backward, a silently wrong gradient.
:func:`map_loop_blocks` does that; value-keeping passes (``cse``, ``fold``, ...) may
keep rewriting the two bodies on their own (:func:`~fnnc.graph.passes.map_subgraphs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from fnnc.core.command import Spec, output_specs
from fnnc.core.ir import Graph, TensorSymbol
from fnnc.errors import GraphError
from fnnc.ops import Command

LOOPS = frozenset({"scan", "pipeline"})
"""Commands whose ``backward`` body is derived from the block in their ``forward``."""


def block_of(cmd: Command) -> Graph:
    """The block of a loop command: its forward body without the saved tensors."""
    forward, kept = cmd.param("forward"), _kept(cmd)
    return dataclasses.replace(forward, outputs=forward.outputs[:kept], out_tree=None)


def _kept(cmd: Command) -> int:
    return cmd.param("n_carry") + cmd.kwargs.get("n_ys", 0)


def _rederived(cmd: Command, fn: Callable[[Graph], Graph]) -> Command | None:
    """``cmd`` with its block rewritten by ``fn`` and its bodies derived again from it, as
    at build; ``None`` when ``fn`` leaves the block as it is."""
    from fnnc.graph.scan import scan_bodies  # scan uses the passes: load it late

    block = block_of(cmd)
    new = fn(block)
    if new is block:
        return None
    n_carry, n_ys = cmd.param("n_carry"), cmd.kwargs.get("n_ys", 0)
    fwd, grad, wants = scan_bodies(
        new, n_carry, cmd.param("n_stacked"), cmd.param("checkpoint"), n_ys
    )
    return cmd.replace(forward=fwd, backward=grad, wants=wants)


def map_loop_blocks(graph: Graph, fn: Callable[[Graph], Graph], who: str) -> Graph:
    """``graph`` with the block of every loop node rewritten by ``fn`` and its forward and
    backward bodies derived again; the same object when ``fn`` changed no block.

    The tape (the node's outputs after its results) follows the new forward body. A
    ``gradient`` node of the loop takes the new command where the tape keeps its
    specs; where it changes and the graph already reads the tape, the rewrite is
    refused (``who`` names it): run it on the forward graph, before ``backward``.
    """
    new_cmd: dict[Command, Command] = {}
    for node in graph.nodes:
        if node.cmd.name in LOOPS and node.cmd not in new_cmd:
            cmd = _rederived(node.cmd, fn)
            if cmd is not None:
                new_cmd[node.cmd] = cmd
    if not new_cmd:
        return graph
    symbols, nodes = list(graph.symbols), []
    reads = {s for n in graph.nodes for s in n.inputs} | set(graph.outputs)
    for index, node in enumerate(graph.nodes):
        cmd = new_cmd.get(node.cmd)
        if cmd is None:
            of = node.cmd.kwargs.get("of") if node.cmd.name == "gradient" else None
            if of in new_cmd:
                _same_tape(graph, index, new_cmd[of], who)
                node = dataclasses.replace(node, cmd=node.cmd.replace(of=new_cmd[of]))
            nodes.append(node)
            continue
        specs = output_specs(cmd, [graph.spec(s) for s in node.inputs])
        outputs = node.outputs
        if [(tuple(s.shape), np.dtype(s.dtype)) for s in specs] != [
            (tuple(graph.spec(o).shape), np.dtype(graph.spec(o).dtype)) for o in outputs
        ]:
            tape = outputs[_kept(cmd) :]
            if any(s in reads for s in tape):
                _refuse(graph, index, who)
            outputs = outputs[: _kept(cmd)]
            for spec in specs[_kept(cmd) :]:
                symbols.append(TensorSymbol(len(symbols), tuple(spec.shape), spec.dtype))
                outputs = (*outputs, len(symbols) - 1)
        nodes.append(dataclasses.replace(node, cmd=cmd, outputs=outputs))
    return dataclasses.replace(graph, symbols=tuple(symbols), nodes=tuple(nodes))


def _same_tape(graph: Graph, index: int, new: Command, who: str) -> None:
    """Refuses when gradient node ``index`` (of a rederived loop) was made for another tape."""
    grad = graph.nodes[index].cmd
    in_specs = [Spec(shape, dtype) for shape, dtype in grad.param("in_specs")]
    after = [(tuple(s.shape), np.dtype(s.dtype)) for s in output_specs(new, in_specs)]
    if after != [(tuple(shape), np.dtype(dtype)) for shape, dtype in grad.param("out_specs")]:
        _refuse(graph, index, who)


def _refuse(graph: Graph, index: int, who: str) -> None:
    node = graph.nodes[index]
    raise GraphError(
        f"{who}: it rewrites the block of a loop (node {index}, {node.name or node.cmd.name}) "
        "whose gradient this graph already holds, and the block's backward then reads other "
        "tensors than the tape the graph keeps; run it on the forward graph, before backward "
        "(or minimize), so the loop's gradient is derived from the rewritten block"
    )
