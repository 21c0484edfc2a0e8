"""A FLOP model of commands, for choosing what to recompute (:func:`fnnc.graph.remat`).

Per command a rule in :data:`FLOP_RULES`; the default is one operation per output
element, which is right for elementwise commands and a fair floor for the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from fnnc.core.ir import Graph, Node

FlopRule = Callable[[Graph, Node], int]


def _elements(graph: Graph, node: Node) -> int:
    return sum(math.prod(graph.symbols[s].shape) for s in node.outputs)


def _gemm(graph: Graph, node: Node) -> int:
    a = graph.symbols[node.inputs[0]].shape
    k = a[-2] if node.cmd.param("transpose_a") and len(a) > 1 else a[-1]
    return 2 * k * math.prod(graph.symbols[node.outputs[0]].shape)


def _convolution(graph: Graph, node: Node) -> int:
    w = graph.symbols[node.inputs[1]].shape  # [out, k..., in/groups]
    per_output = math.prod(w[1:])
    return 2 * per_output * math.prod(graph.symbols[node.outputs[0]].shape)


def _convolution_transpose(graph: Graph, node: Node) -> int:
    w = graph.symbols[node.inputs[1]].shape
    return 2 * math.prod(w) * math.prod(graph.symbols[node.inputs[0]].shape[:-1])


def _scan(graph: Graph, node: Node) -> int:
    body = node.cmd.param("forward")  # one iteration: its nodes' FLOPs, length times
    return node.cmd.param("length") * sum(node_flops(body, i) for i in range(len(body.nodes)))


def _pipeline(graph: Graph, node: Node) -> int:
    body, stages, micro = (node.cmd.param(k) for k in ("forward", "stages", "microbatches"))
    blocks = graph.symbols[node.inputs[node.cmd.param("n_carry")]].shape[0]
    # every stage runs its blocks on one microbatch per iteration, bubbles included
    calls = (micro + stages - 1) * blocks
    return calls * sum(node_flops(body, i) for i in range(len(body.nodes)))


FLOP_RULES: dict[str, FlopRule] = {
    "gemm": _gemm,
    "convolution": _convolution,
    "convolution_transpose": _convolution_transpose,
    "scan": _scan,
    "pipeline": _pipeline,
}


def node_flops(graph: Graph, index: int) -> int:
    """Estimated floating-point operations of node ``index``."""
    node = graph.nodes[index]
    return FLOP_RULES.get(node.cmd.name, _elements)(graph, node)


def recomputed_flops(graph: Graph) -> int:
    """FLOPs of the nodes :func:`fnnc.graph.remat` duplicated (named ``...@remat``)."""
    return sum(node_flops(graph, i) for i, n in enumerate(graph.nodes) if n.name.endswith("@remat"))
