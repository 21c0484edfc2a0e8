"""The reference interpreter: the oracle every pass and backend is tested against."""

from __future__ import annotations

from typing import Any

import numpy as np

from fnnc.core.dispatch import REFERENCE, compiled_forward
from fnnc.core.evaluate import as_tuple, run_nodes
from fnnc.core.ir import Graph, Node
from fnnc.core.text import format_graph
from fnnc.errors import FnncError, GraphError
from fnnc.graph._io import flatten_inputs, unflatten_outputs


def interpret(graph: Graph, *args: Any) -> Any:
    """Runs ``graph`` node by node with every command's reference forward.

    Each node runs as its own small compiled computation (the reference forward,
    jitted once per command value and cached), so the oracle shares no lowering with
    :func:`~fnnc.graph.compile`, which builds one program for the whole graph.

    Each node's results are checked against the specs its output symbols declare, so a
    wrong shape rule is caught at the node that has it.

    Args:
        graph: the graph.
        *args: one array per graph input (or pytrees whose leaves are those arrays).

    Returns:
        The outputs: shaped by the graph's ``out_tree`` if it has one, else the single
        output bare or several as a tuple.

    >>> import numpy as np
    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder, interpret
    >>> b = GraphBuilder()
    >>> x = b.input((2,))
    >>> interpret(b.build([b.exec(ops.relu(), x)]), np.array([-1.0, 3.0], np.float32))
    Array([0., 3.], dtype=float32)
    """
    values = flatten_inputs(graph, args, "interpret")

    def run_node(index: int, node: Node, inputs: list[Any]) -> tuple[Any, ...]:
        try:
            outs = as_tuple(compiled_forward(node.cmd, REFERENCE)(*inputs))
        except FnncError:
            raise
        except Exception as e:
            raise GraphError(
                f"interpret: node {index} ({node.name or node.cmd.name}) failed: {e}\n"
                f"{format_graph(graph, mark=index, window=3)}"
            ) from e
        for sid, value in zip(node.outputs, outs):
            sym = graph.symbol(sid)
            if tuple(value.shape) != sym.shape or np.dtype(value.dtype) != np.dtype(sym.dtype):
                raise GraphError(
                    f"interpret: node {index} ({node.cmd}) produced "
                    f"{np.dtype(value.dtype).name}{list(value.shape)} for {graph.label(sid)}, "
                    f"declared {np.dtype(sym.dtype).name}{list(sym.shape)}: the command's shape "
                    f"rule disagrees with its forward\n{format_graph(graph, mark=index, window=3)}"
                )
        return outs

    return unflatten_outputs(graph, run_nodes(graph, values, run_node))
