"""Two commands the dynamic graph records besides the user's: ``write_view`` and ``call``.

``write_view[shape, base, stride](root, value)`` is ``root`` with one view replaced by
``value``: how a write through an alias (``y[0] = z``) becomes a new SSA version of
``y`` without breaking the old one. Its gradient sends the view of ``g`` to ``value``
and the rest of ``g`` to ``root``.

``call[graph](*inputs)`` runs a whole :class:`~fnnc.core.ir.Graph` (a traced model, a
compiled program's graph) as one node. Its backward differentiates the sub-graph with
every node's own backward rule (:func:`~fnnc.ops._subgraph.run_graph_nnc`), so
gradients flow through it by the same rules as through any recorded node.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.core.command import NOTHING, Command, Spec, defcommand, is_float
from fnnc.core.evaluate import read_view
from fnnc.core.evaluate import write_view as write
from fnnc.core.ir import AliasSymbol
from fnnc.errors import DTypeError, ShapeError
from fnnc.ops._rules import show
from fnnc.ops._subgraph import (
    check_inputs,
    higher_order_check,
    require_graph,
    run_graph,
    run_graph_nnc,
    without_effects,
)


def _alias(shape: tuple[int, ...], base: int, stride: tuple[int, ...], dtype: Any) -> Any:
    return AliasSymbol(1, 0, tuple(shape), np.dtype(dtype), int(base), tuple(stride))


def _write_view_shape(root: Spec, value: Spec, *, shape, base, stride) -> Spec:
    if tuple(value.shape) != tuple(shape):
        raise ShapeError(f"write_view: the value is {show(value)}, the view is {list(shape)}")
    if np.dtype(value.dtype) != np.dtype(root.dtype):
        raise DTypeError(
            f"write_view: the value is {show(value)}, the tensor written is {show(root)}"
        )
    size = int(np.prod(root.shape, dtype=np.int64))
    view = _alias(shape, base, stride, root.dtype)
    if len(stride) != len(shape) or view.outside(size):
        raise ShapeError(
            f"write_view: view {list(shape)} at base {base} with stride {list(stride)} does "
            f"not fit in {show(root)}"
        )
    return Spec(tuple(root.shape), root.dtype)


@defcommand(family="data", shape=_write_view_shape, uses=NOTHING)
def write_view(root, value, *, shape, base, stride):
    """``root`` with the view ``(shape, base, stride)`` of its flat buffer set to ``value``."""
    return write(root, _alias(shape, base, stride, root.dtype), value)


@write_view.backward
def _write_view_backward(grads, inputs, outputs, *, shape, base, stride):
    (g,) = grads
    view = _alias(shape, base, stride, g.dtype)
    return write(g, view, jnp.zeros(shape, g.dtype)), read_view(g, view)


def _call_shape(*specs: Spec, graph) -> tuple[Spec, ...]:
    require_graph("call", "graph", graph)
    check_inputs("call", "graph", graph, specs)
    return graph.output_specs


def _call_display(cmd: Command) -> str:
    graph = cmd.param("graph")
    return (
        f"call[{len(graph.inputs)} inputs, {len(graph.nodes)} nodes, {len(graph.outputs)} outputs]"
    )


def _call_backward_check(cmd: Command, order: int = 1) -> str | None:
    return higher_order_check(cmd.param("graph"), order)


@defcommand(
    family="control",
    shape=_call_shape,
    display=_call_display,
    min_inputs=0,
    backward_check=_call_backward_check,
)
def call(*inputs, graph):
    """Runs the sub-graph ``graph`` on the inputs; its outputs are the node's."""
    outs = run_graph(graph, inputs)
    return outs[0] if len(outs) == 1 else tuple(outs)


@call.backward
def _call_backward(grads, inputs, outputs, *, graph):
    wants = tuple(i for i, x in enumerate(inputs) if is_float(x))
    graph = without_effects(graph)  # its effects ran in the forward

    def f(*xs: Any) -> tuple[Any, ...]:
        args = list(inputs)
        for i, x in zip(wants, xs):
            args[i] = x
        return tuple(run_graph_nnc(graph, args))

    outs, pullback = jax.vjp(f, *[inputs[i] for i in wants])
    cts = tuple(
        np.zeros(o.shape, jax.dtypes.float0)
        if not is_float(o)
        else jnp.zeros(o.shape, o.dtype)
        if g is None
        else g.astype(o.dtype)
        for g, o in zip(grads, outs)
    )
    got = iter(pullback(cts))
    return tuple(next(got) if i in wants else None for i in range(len(inputs)))
