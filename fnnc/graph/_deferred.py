"""Shapes set after the computation is specified (NNC's ``ccv_nnc_tensor_symbol_set``).

NNC lets a graph be written before its inputs have shapes: a tensor symbol made with
auto parameters is read by nodes, its shape is set later, and compiling infers every
shape that depends on it. :class:`~fnnc.graph.GraphBuilder` does the same:

* ``input(None)`` and ``tensor(None)`` (never written) make *sources* without a shape;
  :meth:`GraphBuilder.set_shape` gives one, and may give another before the next build;
* a node reading a source made without a shape, or an output of such a node, is
  *pending*: its shape rule runs at :meth:`GraphBuilder.build`, not at ``exec``, and
  its outputs are shape-less symbols until then (as NNC's are until compile);
* :func:`resolve` runs those rules in node order on a copy of the symbols, so the
  builder keeps the computation and a later ``set_shape`` + ``build`` infers again.

>>> import numpy as np
>>> from fnnc import ops
>>> from fnnc.graph import GraphBuilder, interpret
>>> b = GraphBuilder()
>>> a = b.input(None, name="a")
>>> y = b.exec(ops.ewlog(), a, name="log")
>>> y.shape is None
True
>>> _ = b.set_shape(a, (1,))
>>> graph = b.build([y])
>>> graph.output_specs[0].shape
(1,)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from fnnc.core.command import Command, output_specs
from fnnc.core.ir import Node, Symbol, TensorSymbol
from fnnc.errors import DTypeError, FnncError, GraphError, ShapeError


def resolve(
    symbols: Sequence[Symbol],
    nodes: Sequence[Node],
    pending: Iterable[int],
    label: Callable[[Symbol], str],
    problem: Callable[[Symbol], str],
) -> list[Symbol]:
    """``symbols`` with the outputs of the ``pending`` nodes shaped by their shape rules.

    Args:
        symbols, nodes: the builder's (not changed).
        pending: indices into ``nodes`` whose shape rules did not run at ``exec``.
        label: how messages name a symbol (``%3 (x)``).
        problem: why a source symbol has no shape, and what to do (the builder's words).

    Raises:
        GraphError: a pending node reads a source that still has no shape, or makes
            another number of outputs than it was given.
        ShapeError, DTypeError: a shape rule rejects the shapes now set (naming the
            node and its inputs), or an output given to ``exec(outputs=)`` disagrees.
    """
    out = list(symbols)
    for index in sorted(pending):
        node = nodes[index]
        where = (
            f"build: node {node.name!r} ({node.cmd.name})"
            if node.name
            else (f"build: node {node.cmd.name}")
        )
        ins = [out[i] for i in node.inputs]
        for sym in ins:
            if sym.shape is None:
                raise GraphError(f"{where} reads {problem(sym)}")
        try:
            specs = output_specs(node.cmd, [s.spec for s in ins])
        except FnncError as e:
            listing = ", ".join(f"{label(s)}:{_spec(s)}" for s in ins)
            raise type(e)(f"{where}: {e}\n  inputs: {listing or '(none)'}") from None
        if len(specs) != len(node.outputs):
            raise GraphError(
                f"{where} makes {len(specs)} outputs, but {len(node.outputs)} were taken when "
                "it was added (its inputs had no shape then, so its outputs could not be "
                "counted); pass them with exec(..., outputs=[...])"
            )
        for oid, spec in zip(node.outputs, specs):
            out[oid] = _filled(out[oid], spec, where, label)
    return out


def count_outputs(cmd: Command, ins: Sequence[Symbol]) -> int:
    """How many outputs a pending node has: by its shape rule on the shapes set so far,
    else one (:func:`resolve` checks the count and asks for ``outputs=`` if it differs)."""
    if all(s.shape is not None for s in ins):
        try:
            return len(output_specs(cmd, [s.spec for s in ins]))
        except FnncError:
            pass  # the shapes may still be set again; build reports a real mismatch
    return 1


def _filled(sym: Symbol, spec: Any, where: str, label: Callable[[Symbol], str]) -> Symbol:
    """The output ``sym`` with ``spec``'s shape (and dtype, unless it has one), or checked."""
    made = f"{np.dtype(spec.dtype).name}{list(spec.shape)}"
    if sym.shape is None:
        if sym.dtype is not None and np.dtype(sym.dtype) != np.dtype(spec.dtype):
            raise DTypeError(
                f"{where}: output {label(sym)} is {np.dtype(sym.dtype).name}, but the "
                f"command produces {made}"
            )
        return TensorSymbol(sym.id, tuple(spec.shape), np.dtype(spec.dtype), sym.name)
    if tuple(sym.shape) != tuple(spec.shape) or np.dtype(sym.dtype) != np.dtype(spec.dtype):
        error = ShapeError if tuple(sym.shape) != tuple(spec.shape) else DTypeError
        raise error(
            f"{where}: output {label(sym)} is {_spec(sym)}, but the command produces {made}"
        )
    return sym


def _spec(sym: Symbol) -> str:
    if sym.shape is None:
        return "(no shape)"
    return f"{np.dtype(sym.dtype).name}{list(sym.shape)}"
