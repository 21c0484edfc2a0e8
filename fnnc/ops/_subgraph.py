"""Helpers of the commands that hold sub-graphs: running a sub-graph, splitting a loop
body at its breakpoint, and checking the specs a command feeds a sub-graph.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from fnnc.core import dispatch
from fnnc.core.command import Command, Spec
from fnnc.core.evaluate import as_tuple, run_nodes
from fnnc.core.ir import Graph, Node
from fnnc.errors import BackendError, CommandError, DTypeError, GraphError, ShapeError
from fnnc.ops._rules import show


def run_graph(graph: Graph, args: Sequence[Any], *, backends: bool = True) -> list[Any]:
    """``graph``'s outputs on ``args``, each node on the backend the dispatch rule picks
    for it (:func:`fnnc.core.dispatch.select_backend`: forced, tuned, measured, then by
    priority), as a node of a compiled graph gets; ``backends=False`` (a fused
    elementwise chain: one XLA fusion by design) or :func:`fnnc.core.dispatch.reference_only`
    (the oracle, :func:`fnnc.graph.interpret`) runs every node's reference forward.

    Nodes that are themselves control commands run through this again, so sub-graphs
    nest to any depth. The plain forwards are called (no jit per node): a sub-graph
    always runs inside its command's own compiled forward, which is cached per dispatch
    state, so a backend registered later is picked up there too.
    """

    def reference(index: int, node: Any, inputs: list[Any]) -> tuple[Any, ...]:
        return as_tuple(node.cmd.definition.forward(*inputs, **node.cmd.kwargs))

    def chosen(index: int, node: Any, inputs: list[Any]) -> tuple[Any, ...]:
        specs = [Spec(tuple(x.shape), x.dtype) for x in inputs]
        try:
            backend = dispatch.select_backend(node.cmd, specs)
        except BackendError as e:  # a forced backend that cannot run it: say which node
            raise BackendError(
                f"sub-graph node {index} ({node.name or node.cmd.name}): {e}"
            ) from None
        if backend == dispatch.REFERENCE:
            return reference(index, node, inputs)
        return as_tuple(dispatch.forward_of(node.cmd, backend)(*inputs))

    pick = backends and not dispatch.references_only()  # interpret: references only
    return run_nodes(graph, args, chosen if pick else reference)


def run_graph_nnc(graph: Graph, args: Sequence[Any]) -> list[Any]:
    """:func:`run_graph` whose derivative (``jax.vjp``) follows each command's backward.

    Every node runs as a ``jax.custom_vjp`` whose backward is the command's own rule in
    NNC's convention (reading only its ``backward_uses``), so differentiating a whole
    sub-graph gives what fnnc's ``backward`` pass gives node by node, NNC's conventions
    included (ties of ``min``/``max``, loss gradients), while views and writes through
    aliases are differentiated by JAX exactly. As in that pass, a rule gets ``None`` for
    an output no result depends on (a ``scan``'s tape and ``ys``, which must get no
    gradient), and a node none of whose outputs any result depends on is not
    differentiated at all.
    """

    def run_node(index: int, node: Node, inputs: list[Any]) -> tuple[Any, ...]:
        return _nnc_differentiable(node.cmd, node.cmd.definition)(*inputs)

    return run_nodes(graph, args, run_node)


@functools.lru_cache(maxsize=1024)
def _nnc_differentiable(cmd: Any, opdef: Any) -> Any:
    """``cmd``'s reference forward with its backward rule as the custom VJP (keyed on
    the definition too: a command replaced or given a backward gets a new one)."""
    params = cmd.kwargs

    def forward(*xs: Any) -> tuple[Any, ...]:
        return as_tuple(opdef.forward(*xs, **params))

    if not opdef.attributes.differentiable:
        return forward

    @jax.custom_vjp
    def run(*xs: Any) -> tuple[Any, ...]:
        return forward(*xs)

    def fwd(*xs: Any) -> tuple[tuple[Any, ...], Any]:
        xs = tuple(x.value for x in xs)
        outs = forward(*xs)
        return outs, (xs, outs)

    def bwd(res: Any, cts: tuple[Any, ...]) -> tuple[Any, ...]:
        xs, outs = res
        if all(_is_zero(g) for g in cts):
            # What the backward pass does for a node no gradient reaches: nothing. The
            # rule is not called with all-None gradients: that is NNC's null gradient
            # (ones) to min/max, the losses and others.
            return tuple(_cotangent_of(None, x) for x in xs)
        check = opdef.backward_check(cmd) if opdef.backward_check else None
        if check is not None:
            raise CommandError(f"{cmd} has no backward here: {check}")
        # As the backward pass: None for an output no gradient reaches (a scan's tape
        # and ys among them), the gradient for the others.
        grads = tuple(None if _is_zero(g) else g for g in cts)
        got = opdef.run_backward(cmd, opdef.backward, grads, xs, outs)
        return tuple(_cotangent_of(g, x) for g, x in zip(got, xs))

    # symbolic_zeros: JAX says which outputs no result depends on (SymbolicZero) instead
    # of handing zeros for them, which a scan's tape must not get.
    run.defvjp(fwd, bwd, symbolic_zeros=True)
    return run


@functools.lru_cache(maxsize=512)
def without_effects(graph: Graph) -> Graph:
    """``graph`` without the nodes that run only for their effects (an effectful command
    with no outputs: a traced ``jax.debug.callback``), in its sub-graphs too; the same
    object when it holds none.

    What a command's backward runs when it recomputes its sub-graphs' forward
    (``jax.vjp`` of a loop, a branch, a ``call``): their effects then happen once per
    trip, in the forward, as under ``jax.grad`` of the same program, not again in the
    backward. Values are unchanged: the nodes dropped write nothing."""
    nodes = []
    for node in graph.nodes:
        if node.cmd.definition.attributes.has_effects and not node.outputs:
            continue
        cmd = _quiet_value(node.cmd)
        nodes.append(node if cmd is node.cmd else dataclasses.replace(node, cmd=cmd))
    if len(nodes) == len(graph.nodes) and all(a is b for a, b in zip(nodes, graph.nodes)):
        return graph
    return dataclasses.replace(graph, nodes=tuple(nodes))


def _quiet_value(value: Any) -> Any:
    """``value`` (a hyper-parameter) with :func:`without_effects` applied to its graphs."""
    if isinstance(value, Graph):
        return without_effects(value)
    if isinstance(value, tuple):
        items = tuple(_quiet_value(v) for v in value)
        return value if all(a is b for a, b in zip(items, value)) else items
    if isinstance(value, Command):
        params = tuple((k, _quiet_value(v)) for k, v in value.params)
        same = all(a[1] is b[1] for a, b in zip(params, value.params))
        return value if same else dataclasses.replace(value, params=params)
    return value


def higher_order_check(graph: Graph, order: int) -> str | None:
    """Why ``graph``'s nodes, run by a command whose ``order``-th gradient is asked for,
    have no gradient of that order (the first node's ``backward_check`` that refuses).

    The first order is checked node by node as each node's backward runs (above, and
    only for nodes a gradient reaches), so this answers ``None`` for it. From the second
    on, JAX differentiates the first-order backward of every node as plain code, where
    no node's check runs: a taped ``while_loop`` would fail with JAX's bare message."""
    if order <= 1:
        return None
    for node in graph.nodes:
        check = node.cmd.definition.backward_check
        reason = check(node.cmd, order) if check is not None else None
        if reason is not None:
            return f"its node {node.name or node.cmd.name} ({node.cmd}): {reason}"
    return None


def _is_zero(g: Any) -> bool:
    """Whether cotangent ``g`` is JAX's symbolic zero (no result depends on the output)."""
    if g is None or isinstance(g, jax.custom_derivatives.SymbolicZero):
        return True
    return hasattr(g, "dtype") and g.dtype == jax.dtypes.float0


def _cotangent_of(g: Any, x: Any) -> Any:
    """What ``custom_vjp`` wants for input ``x``: float0 zeros where it has no gradient."""
    if not jax.numpy.issubdtype(x.dtype, jax.numpy.inexact):
        return np.zeros(x.shape, jax.dtypes.float0)
    if g is None:
        return jax.numpy.zeros(x.shape, x.dtype)
    return g.astype(x.dtype)


def require_graph(name: str, what: str, value: Any) -> None:
    if not isinstance(value, Graph):
        raise CommandError(
            f"{name}: {what} must be a Graph (build it with its own GraphBuilder), got "
            f"{type(value).__name__}"
        )


def positions(name: str, what: str, value: Any, size: int, where: str) -> tuple[int, ...]:
    """``value`` is a tuple of positions in ``range(size)``, else a CommandError."""
    if not isinstance(value, tuple) or not all(isinstance(v, int) for v in value):
        raise CommandError(f"{name}: {what} must be a tuple of ints, got {value!r}")
    bad = [v for v in value if not 0 <= v < size]
    if bad:
        raise CommandError(f"{name}: {what} {value} names positions {bad}; {where} has {size}")
    return value


def require_spec(where: str, got: Spec, want: Spec, against: str) -> None:
    """``got`` equals ``want``, else a Shape/DTypeError saying ``where`` and ``against``."""
    if tuple(got.shape) != tuple(want.shape):
        raise ShapeError(f"{where} is {show(got)}, but {against} is {show(want)}")
    if np.dtype(got.dtype) != np.dtype(want.dtype):
        raise DTypeError(f"{where} is {show(got)}, but {against} is {show(want)}")


def check_inputs(name: str, what: str, graph: Graph, specs: Sequence[Spec]) -> None:
    """The node's input ``specs`` fit ``graph``'s inputs one by one."""
    if len(specs) != len(graph.inputs):
        labels = ", ".join(graph.label(s) for s in graph.inputs) or "none"
        raise GraphError(
            f"{name}: the {what} takes {len(graph.inputs)} input(s) ({labels}), the node "
            f"gives {len(specs)}; pass one input per {what} input, in order"
        )
    for k, (spec, sid) in enumerate(zip(specs, graph.inputs)):
        require_spec(
            f"{name}: input {k}", spec, graph.spec(sid), f"the {what} input {graph.label(sid)}"
        )


def require_scalar(name: str, what: str, graph: Graph, kind: str) -> None:
    """``graph`` returns one scalar of ``kind`` ("bool" or "int")."""
    if len(graph.outputs) != 1:
        raise GraphError(
            f"{name}: the {what} must return one {kind} scalar, it returns "
            f"{len(graph.outputs)} outputs"
        )
    sid = graph.outputs[0]
    spec = graph.spec(sid)
    dtype = np.dtype(spec.dtype)
    ok = dtype == np.bool_ if kind == "bool" else np.issubdtype(dtype, np.integer)
    if not ok:
        raise DTypeError(
            f"{name}: the {what} returns {graph.label(sid)}: {show(spec)}, expected "
            f"{'a bool' if kind == 'bool' else 'an integer'} scalar"
            + ("; compare with fnnc.ops.compare" if kind == "bool" else "")
        )
    if tuple(spec.shape) != ():
        raise ShapeError(
            f"{name}: the {what} returns {graph.label(sid)}: {show(spec)}, expected a scalar "
            "(shape []); reshape it with fnnc.ops.reshape(shape=())"
        )


@functools.lru_cache(maxsize=512)
def split_body(body: Graph, early: tuple[int, ...]) -> tuple[Graph, Graph]:
    """Splits ``body`` at the breakpoint that follows its outputs ``early``.

    Returns ``(head, tail)``. ``head`` holds the nodes those outputs need; it takes the
    body inputs and returns the roots it writes that the tail's nodes or the body's
    outputs read, followed by the ``early`` outputs. ``tail`` holds the other nodes; it
    takes the body inputs followed by those roots and returns all body outputs.
    """
    syms = body.symbols
    need = {syms[body.outputs[j]].root for j in early}
    head_at: list[int] = []
    for index in range(len(body.nodes) - 1, -1, -1):
        node = body.nodes[index]
        if any(syms[o].root in need for o in node.outputs):
            head_at.append(index)
            need.update(syms[s].root for s in node.inputs)
    head_at.reverse()
    taken = set(head_at)
    # The roots the head hands on: those the tail's nodes touch or the body returns. A
    # root nothing after the breakpoint reads (a scan's tape, which only its gradient
    # node may read) stays inside the head: carried over the trips it would receive a
    # zero gradient, which a scan refuses.
    later = {syms[o].root for o in body.outputs}
    for index, node in enumerate(body.nodes):
        if index not in taken:
            later.update(syms[s].root for s in (*node.inputs, *node.outputs))
    roots: dict[int, None] = {}
    for index in head_at:
        roots.update((syms[o].root, None) for o in body.nodes[index].outputs)
    roots = {r: None for r in roots if r in later}
    early_ids = tuple(body.outputs[j] for j in early)
    head = dataclasses.replace(
        body,
        nodes=tuple(body.nodes[i] for i in head_at),
        outputs=(*roots, *early_ids),
        out_tree=None,
    )
    tail = dataclasses.replace(
        body,
        nodes=tuple(n for i, n in enumerate(body.nodes) if i not in taken),
        inputs=(*body.inputs, *roots),
        out_tree=None,
    )
    return head, tail
