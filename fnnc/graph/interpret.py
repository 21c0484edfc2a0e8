"""The reference interpreter: the oracle every pass and backend is tested against."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fnnc import config
from fnnc.core.dispatch import REFERENCE, compiled_forward, reference_only
from fnnc.core.evaluate import as_tuple, run_nodes
from fnnc.core.ir import Graph, Node, require_graph
from fnnc.core.text import format_graph
from fnnc.errors import FnncError, GraphError
from fnnc.graph._io import flatten_inputs, unflatten_outputs
from fnnc.graph.numerics import Blame, check_node
from fnnc.ops import while_tape

OnNode = Callable[..., Sequence[Any] | None]
"""``on_node(index, node, inputs, outputs) -> None | replacement outputs``; a hook of
three arguments is called as ``(node, inputs, outputs)``, one of two as
``(node, outputs)`` (the node and its values)."""


def interpret(graph: Graph, *args: Any, on_node: OnNode | None = None) -> Any:
    """Runs ``graph`` node by node with every command's reference forward.

    Each node runs as its own small compiled computation (the reference forward,
    jitted once per command value and cached), so the oracle shares no lowering with
    :func:`~fnnc.graph.compile`, which builds one program for the whole graph.

    Each node's results are checked against the specs its output symbols declare, so a
    wrong shape rule is caught at the node that has it.

    With the numerics check on (``config.override(numerics=True)``), the first node
    whose output holds a NaN or an infinity raises :class:`~fnnc.errors.NumericsError`
    naming it, with its inputs' statistics.

    Args:
        graph: the graph.
        *args: one array per graph input (or pytrees whose leaves are those arrays,
            with the traced key paths, ``graph.in_paths``, where ``trace`` made the
            graph: a renamed dict key is a :class:`~fnnc.errors.GraphInputError`);
            with one argument per input, any of them may be a nested list of numbers,
            converted to its input's dtype (floats into an integer input are refused).
            :class:`~fnnc.graph.Program` takes the same.
        on_node: called after each node with ``(index, node, inputs, outputs)`` (a
            function requiring three positional arguments gets ``(node, inputs,
            outputs)``, one requiring two ``(node, outputs)``); it may inspect them
            (:func:`~fnnc.graph.tensor_stats`) or return replacement outputs (same shapes
            and dtypes) to inject values: the base of a step-through debugger.

    Returns:
        The outputs: shaped by the graph's ``out_tree`` if it has one, else the single
        output bare or several as a tuple.

    >>> import numpy as np
    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder, interpret
    >>> b = GraphBuilder()
    >>> x = b.input((2,))
    >>> graph = b.build([b.exec(ops.relu(), x)])
    >>> interpret(graph, np.array([-1.0, 3.0], np.float32))
    Array([0., 3.], dtype=float32)

    A hook that prints every node's output statistics:

    >>> from fnnc.graph import tensor_stats
    >>> def show(index, node, inputs, outputs):
    ...     print(index, node.cmd, tensor_stats(outputs[0]))
    >>> _ = interpret(graph, np.ones(2, np.float32), on_node=show)
    0 relu f32[2] min=1 max=1 mean=1 std=0 nan=0 inf=0
    """
    values = flatten_inputs(require_graph(graph, "interpret"), args, "interpret")
    blame = Blame(graph) if config.get().numerics else None
    hook = None if on_node is None else _hook(on_node)

    def run_node(index: int, node: Node, inputs: list[Any]) -> tuple[Any, ...]:
        try:
            with reference_only():  # sub-graphs' nodes too: the oracle runs references
                outs = as_tuple(compiled_forward(node.cmd, REFERENCE)(*inputs))
            if while_tape.checks_on_host(node.cmd):
                # Its overflow check raises from a host callback; an asynchronous
                # runtime (GPU) reports that only when the outputs are waited for.
                jax.block_until_ready(outs)
        except FnncError:
            raise
        except Exception as e:
            error = while_tape.forward_mode_error(node.cmd, e)
            if error is None and while_tape.checks_on_host(node.cmd):
                while_tape.forget_failed_tokens()  # reported here: not again at exit
                error = while_tape.host_error(e)  # the tape's own message, not XLA's trace
            if error is not None:
                raise GraphError(
                    f"interpret: node {index} ({node.name or node.cmd.name}): {error}\n"
                    f"{format_graph(graph, mark=index, window=3)}"
                ) from None
            raise GraphError(
                f"interpret: node {index} ({node.name or node.cmd.name}) failed: {e}\n"
                f"{format_graph(graph, mark=index, window=3)}"
            ) from e
        return outs

    def after(index: int, node: Node, inputs: list[Any], outs: tuple[Any, ...]) -> tuple:
        if blame is not None:
            check_node(graph, index, inputs, outs, "interpret", blame)
        if hook is not None:
            replaced = hook(index, node, tuple(inputs), outs)
            if replaced is not None:
                outs = _replacements(graph, index, node, replaced)
        return outs

    results = run_nodes(graph, values, run_node, where="interpret", after=after)
    return unflatten_outputs(graph, results)


def _hook(on_node: Any) -> Callable[[int, Node, tuple, tuple], Any]:
    """``on_node`` as a function of ``(index, node, inputs, outputs)``: one written for
    ``(node, inputs, outputs)`` or ``(node, outputs)`` gets those, judged by its
    required positional parameters (or, where all have defaults, the most it takes)."""
    if not callable(on_node):
        raise GraphError(
            f"interpret: on_node={on_node!r:.60} ({type(on_node).__name__}) is not callable; "
            "expected a function of (index, node, inputs, outputs)"
        )
    try:
        params = inspect.signature(on_node).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: the full form
        return on_node
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return on_node
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(p.default is p.empty for p in positional)
    # the required ones decide (def hook(node, outputs, verbose=False) is two); a hook
    # whose arguments all have defaults gets the most it takes
    fits = [n for n in (4, 3, 2) if required <= n <= len(positional)]
    if 2 <= required <= 4:
        n = required
    elif fits:
        n = fits[0]
    else:
        raise GraphError(
            f"interpret: on_node {getattr(on_node, '__name__', on_node)!s:.40} takes "
            f"{required} positional argument(s); expected (index, node, inputs, outputs), "
            "(node, inputs, outputs) or (node, outputs)"
        )
    if n == 4:
        return on_node
    if n == 3:
        return lambda index, node, inputs, outs: on_node(node, inputs, outs)
    return lambda index, node, inputs, outs: on_node(node, outs)


def _replacements(graph: Graph, index: int, node: Node, replaced: Sequence[Any]) -> tuple:
    """``on_node``'s replacement outputs, checked against the node's output specs."""
    replaced = tuple(replaced) if isinstance(replaced, (tuple, list)) else (replaced,)
    if len(replaced) != len(node.outputs):
        raise GraphError(
            f"interpret: on_node returned {len(replaced)} value(s) for node {index} "
            f"({node.name or node.cmd.name}), which has {len(node.outputs)} output(s)"
        )
    out = []
    for sid, value in zip(node.outputs, replaced):
        sym, value = graph.symbol(sid), jnp.asarray(value)
        if tuple(value.shape) != sym.shape or np.dtype(value.dtype) != np.dtype(sym.dtype):
            raise GraphError(
                f"interpret: on_node replaced {graph.label(sid)} of node {index} with "
                f"{np.dtype(value.dtype).name}{list(value.shape)}; it is "
                f"{np.dtype(sym.dtype).name}{list(sym.shape)}"
            )
        out.append(value)
    return tuple(out)
