"""The two commands the dynamic graph records besides the user's: ``write_view`` and ``call``.

``write_view[shape, base, stride](root, value)`` is ``root`` with one view replaced by
``value``: how a write through an alias (``y[0] = z``) becomes a new SSA version of
``y`` without breaking the old one. Its gradient sends the view of ``g`` to ``value``
and the rest of ``g`` to ``root``.

``call[graph](*inputs)`` runs a whole :class:`~fnnc.graph.Graph` (a traced model, a
compiled program's graph) as one node. Its backward is built by fnnc's ``backward``
pass on that graph (cached per graph and gradient mask), so gradients flow through it
by the same rules as through any recorded node.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp
import numpy as np

from fnnc.errors import DTypeError, ShapeError
from fnnc.ops import NOTHING, Command, defcommand
from fnnc.ops._rules import show
from fnnc.ops._subgraph import check_inputs, require_graph, run_graph
from fnnc.ops.command import Spec, is_float

if TYPE_CHECKING:
    from fnnc.graph.ir import Graph


def _alias(shape: tuple[int, ...], base: int, stride: tuple[int, ...], dtype: Any) -> Any:
    from fnnc.graph.ir import AliasSymbol

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
    if len(stride) != len(shape) or base < 0 or (0 not in shape and view.last_index() >= size):
        raise ShapeError(
            f"write_view: view {list(shape)} at base {base} with stride {list(stride)} does "
            f"not fit in {show(root)}"
        )
    return Spec(tuple(root.shape), root.dtype)


@defcommand(family="data", shape=_write_view_shape, uses=NOTHING)
def write_view(root, value, *, shape, base, stride):
    """``root`` with the view ``(shape, base, stride)`` of its flat buffer set to ``value``."""
    from fnnc.graph.evaluate import write_view as write

    return write(root, _alias(shape, base, stride, root.dtype), value)


@write_view.backward
def _write_view_backward(grads, inputs, outputs, *, shape, base, stride):
    from fnnc.graph.evaluate import read_view
    from fnnc.graph.evaluate import write_view as write

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


@defcommand(family="control", shape=_call_shape, display=_call_display, min_inputs=0)
def call(*inputs, graph):
    """Runs the sub-graph ``graph`` on the inputs; its outputs are the node's."""
    outs = run_graph(graph, inputs)
    return outs[0] if len(outs) == 1 else tuple(outs)


@call.backward
def _call_backward(grads, inputs, outputs, *, graph):
    mask = tuple(g is not None for g in grads)
    wants = tuple(i for i, x in enumerate(inputs) if is_float(x))
    grad_graph = call_gradient(graph, mask, wants)
    seeds = [g for g in grads if g is not None]
    got = iter(run_graph(grad_graph, [*inputs, *seeds]))
    return tuple(next(got) if i in wants else None for i in range(len(inputs)))


@functools.lru_cache(maxsize=256)
def call_gradient(graph: Graph, mask: tuple[bool, ...], wants: tuple[int, ...]) -> Graph:
    """``(*inputs, *seeds) -> grads of inputs wants``: ``graph`` and fnnc's backward pass.

    One seed per output that has a gradient (``mask``); an output read twice in
    ``graph.outputs`` gets the sum of its seeds.
    """
    from fnnc.graph.builder import GraphBuilder
    from fnnc.graph.passes.backward import backward

    b = GraphBuilder.from_graph(graph)
    fs, seeds = [], []
    for sid, m in zip(graph.outputs, mask):
        if m:
            spec = graph.spec(sid)
            seed = b.tensor(spec.shape, spec.dtype, name="seed")
            b.add_input(seed)
            fs.append(graph.symbols[sid])
            seeds.append(seed)
    wrt = [graph.symbols[graph.inputs[i]] for i in wants]
    fwd = b.build([])
    if not fs:
        z = GraphBuilder.from_graph(fwd)
        zeros = [z.exec(_zeros(s)) for s in wrt]
        return z.build(zeros)
    out, grads = backward(fwd, fs, wrt, df=seeds)
    return _returning(out, grads)


def _zeros(sym: Any) -> Command:
    from fnnc import ops

    return ops.set(shape=sym.shape, dtype=np.dtype(sym.dtype), value=0.0)


def _returning(graph: Graph, outputs: Any) -> Graph:
    import dataclasses

    return dataclasses.replace(graph, outputs=tuple(s.id for s in outputs), out_tree=None)
