"""Sub-graphs in a graph under construction: NNC's while loop and case..of.

A loop body, a loop condition and each branch are :class:`~fnnc.graph.Graph` values
built with their own :class:`~fnnc.graph.GraphBuilder`; these functions add one
``while_loop`` or ``case_of`` node to the outer builder and return its output
symbols. Symbols of the sub-graphs (carry-overs, condition inputs) are given as the
sub-graph builder returned them; they are stored as positions of the sub-graph's inputs
and outputs, which every pass keeps. The semantics are in :mod:`fnnc.ops.control`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from fnnc import ops
from fnnc.core.ir import Graph, Symbol
from fnnc.errors import CommandError, GraphError, located
from fnnc.graph.builder import GraphBuilder
from fnnc.ops._subgraph import require_graph

Breakpoint = Literal["before", "after"] | int


def while_loop(
    builder: GraphBuilder,
    body: Graph,
    cond: Graph,
    inputs: Sequence[Symbol],
    *,
    carry_overs: Mapping[Symbol, Symbol] | Sequence[tuple[Symbol, Symbol]],
    breakpoint: Breakpoint = "before",  # noqa: A002 - NNC's word
    cond_inputs: Sequence[Symbol] = (),
    max_iterations: int | None = None,
    tape: int | None = None,
    name: str = "",
) -> tuple[Symbol, ...]:
    """Adds NNC's while loop; returns the final value of each carried tensor.

    Each iteration runs the body nodes before the breakpoint, then
    ``cond(count, *cond_inputs)``; if false the loop ends, else the rest of the body
    runs, ``count`` (int32, from 0) grows by one and each carried output ``y`` becomes
    body input ``x`` of the next iteration.

    Args:
        builder: the outer graph's builder.
        body: the loop body; its inputs are fed ``inputs`` in order.
        cond: the condition: inputs ``(count: int32[], *cond_inputs)``, one bool scalar
            output.
        inputs: outer symbols, one per body input (initial values; the inputs no
            carry-over updates stay fixed).
        carry_overs: body output -> body input ("y -> x"), as a mapping ``{y: x}`` or
            ``(y, x)`` pairs. The outputs returned follow this order.
        breakpoint: where the condition is evaluated: ``"before"`` the body (``count <
            N`` runs it N times), ``"after"`` it (N + 1 times), or an int k: after the
            first k body nodes (NNC's breakpoint node).
        cond_inputs: body inputs, or body outputs computed before the breakpoint, that
            the condition reads after ``count``.
        max_iterations: a static bound on ``count``: the loop lowers to a masked
            ``lax.scan`` and stops at that count; differentiable (second order too).
        tape: for gradients of a loop whose trip count depends on the data: NNC's
            tape, the carries of up to ``tape`` trips kept for the backward, which
            walks them in reverse (cost follows the trips taken). More trips than
            ``tape`` in a differentiated call is an error naming the size to use.
            Reverse mode only: forward mode (``jax.jvp``, ``jax.hessian``) needs
            ``max_iterations``. Exclusive with ``max_iterations``; see
            :mod:`fnnc.ops.while_tape`.
        name: the node's name.

    Returns:
        One symbol per carry-over: the carried tensor's value when the loop ends.

    Example: NNC's ``z = x^5 * y`` (z <- z * x five times from 1, then times y).

    >>> import numpy as np
    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder, interpret, while_loop
    >>> bb = GraphBuilder()
    >>> z0, x0 = bb.input((1,), name="z0"), bb.input((1,), name="x")
    >>> z1 = bb.exec(ops.ewprod(), z0, x0, name="z1")
    >>> body = bb.build([z1])
    >>> cb = GraphBuilder()
    >>> count = cb.input((), np.int32, name="count")
    >>> cond = cb.build([cb.exec(ops.compare(op="lt"), count, cb.constant(np.int32(5)))])
    >>> b = GraphBuilder()
    >>> x, y = b.input((1,), name="x"), b.input((1,), name="y")
    >>> one = b.constant(np.ones(1, np.float32))
    >>> (z,) = while_loop(b, body, cond, [one, x], carry_overs={z1: z0}, name="for 1..5")
    >>> graph = b.build([b.exec(ops.ewprod(), z, y)])
    >>> round(float(interpret(graph, np.float32([0.92]), np.float32([3.2]))[0]), 6)
    2.109061
    """
    with _naming(name):
        require_graph("while_loop", "body", body)
        require_graph("while_loop", "cond", cond)
        pairs = _carry_pairs(carry_overs)
        carry = tuple(
            (
                _position(body, y, "outputs", "carry-over source"),
                _position(body, x, "inputs", "carry-over target"),
            )
            for y, x in pairs
        )
        refs = tuple(_cond_ref(body, s) for s in cond_inputs)
        early = _early_outputs(body, breakpoint)
    cmd = ops.while_loop(
        body=body,
        cond=cond,
        carry_overs=carry,
        cond_inputs=refs,
        breakpoint=early,
        max_iterations=max_iterations,
        tape=tape,
    )
    return _as_tuple(builder.exec(cmd, *inputs, name=name))


def case_of(
    builder: GraphBuilder,
    selector: Graph,
    branches: Sequence[Graph],
    inputs: Sequence[Symbol],
    *,
    bypass: Sequence[Symbol | int],
    name: str = "",
) -> tuple[Symbol, ...]:
    """Adds NNC's case..of; returns its output symbols.

    ``selector(*inputs)`` returns an integer scalar ``k``: branch ``k`` runs on
    ``inputs`` and gives the outputs; ``-1`` takes the outputs from ``bypass``.

    Args:
        builder: the outer graph's builder.
        selector: inputs like ``inputs``; one integer scalar output.
        branches: graphs taking ``inputs``; all return the same output specs.
        inputs: outer symbols fed to the selector and to every branch.
        bypass: per output, the input (a symbol of ``inputs``, or its position) whose
            value it takes when the selector returns -1.
        name: the node's name.

    Example: NNC's piece-wise function: 0 below 0, x on [0, 1), x / 2 + 1 / 2 on
    [1, 2), 1.5 from 2 on.

    >>> import numpy as np
    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder, case_of, interpret
    >>> s = GraphBuilder()
    >>> x = s.input((), name="x")
    >>> def below(v, then, other):
    ...     test = s.exec(ops.compare(op="lt"), x, s.constant(np.float32(v)))
    ...     return s.exec(ops.select(), test, s.constant(np.int32(then)), other)
    >>> k = below(0, 0, below(1, -1, below(2, 1, s.constant(np.int32(2)))))
    >>> selector = s.build([k])
    >>> def branch(fn):
    ...     g = GraphBuilder()
    ...     return g.build([fn(g, g.input((), name="x"))])
    >>> zero = branch(lambda g, x: g.exec(ops.set(shape=())))
    >>> half = branch(lambda g, x: g.exec(ops.add(p=0.5, q=0.5), x, g.constant(np.float32(1))))
    >>> flat = branch(lambda g, x: g.exec(ops.set(shape=(), value=1.5)))
    >>> b = GraphBuilder()
    >>> x = b.input((), name="x")
    >>> (y,) = case_of(b, selector, [zero, half, flat], [x], bypass=[x])
    >>> graph = b.build([y])
    >>> [round(float(interpret(graph, np.float32(v))), 4) for v in (-1, 0.76, 1.226, 2.1)]
    [0.0, 0.76, 1.113, 1.5]
    """
    positions = []
    for k, item in enumerate(bypass):
        if isinstance(item, (bool, np.bool_)):  # an int to Python, but no position
            error = GraphError(
                f"case_of: bypass output {k} is {item!r}; pass one of `inputs` or its "
                "position (an int)"
            )
            raise located(error, f"node {name!r}") if name else error
        if isinstance(item, (int, np.integer)):  # a position, NumPy's ints too
            positions.append(int(item))
            continue
        at = [p for p, s in enumerate(inputs) if s == item]
        if not at:
            error = GraphError(
                f"case_of: bypass output {k} names {_label(item)}, which is not one of the "
                "node's inputs; pass one of `inputs` (or its position)"
            )
            raise located(error, f"node {name!r}") if name else error
        positions.append(at[0])
    cmd = ops.case_of(selector=selector, branches=tuple(branches), bypass=tuple(positions))
    return _as_tuple(builder.exec(cmd, *inputs, name=name))


# -- helpers -------------------------------------------------------------------


@contextlib.contextmanager
def _naming(name: str) -> Iterator[None]:
    """Errors of the checks made before the node exists name the node, as its own do."""
    try:
        yield
    except (GraphError, CommandError) as error:
        if not name:
            raise
        raise located(error, f"node {name!r}") from error


def _label(sym: Any) -> str:
    if hasattr(sym, "id"):
        return f"%{sym.id} ({sym.name})" if getattr(sym, "name", "") else f"%{sym.id}"
    return repr(sym)


def _carry_pairs(carry_overs: Any) -> list[tuple[Any, Any]]:
    """``carry_overs`` as ``(body output, body input)`` pairs, else a GraphError."""
    if isinstance(carry_overs, Mapping):
        return list(carry_overs.items())
    pairs = list(carry_overs) if isinstance(carry_overs, (list, tuple)) else None
    bad = next((p for p in pairs or () if not (isinstance(p, (list, tuple)) and len(p) == 2)), None)
    if pairs is None or bad is not None:
        got = _label(bad) if pairs is not None else repr(carry_overs)
        raise GraphError(
            f"while_loop: carry_overs must map each body output to the body input it "
            f"updates, {{y: x}}, or be (y, x) pairs, e.g. [(y, x)]; got {got:.80} among "
            f"them; pair each output with its input"
        )
    return pairs


def _of_body(body: Graph, sym: Any, what: str) -> int:
    sid = getattr(sym, "id", None)
    if not isinstance(sid, int) or not 0 <= sid < len(body.symbols) or body.symbols[sid] != sym:
        raise GraphError(
            f"while_loop: {what} {_label(sym)} is not a symbol of the body graph; pass the "
            "symbols the body's GraphBuilder returned"
        )
    return sid


def _position(body: Graph, sym: Any, where: str, what: str) -> int:
    sid = _of_body(body, sym, what)
    ids = body.outputs if where == "outputs" else body.inputs
    if sid not in ids:
        fix = (
            "build the body with it among its outputs"
            if where == "outputs"
            else ("carry into a body input (made with GraphBuilder.input)")
        )
        raise GraphError(f"while_loop: {what} {body.label(sid)} is not a body {where[:-1]}; {fix}")
    return ids.index(sid)


def _cond_ref(body: Graph, sym: Any) -> tuple[str, int]:
    sid = _of_body(body, sym, "condition input")
    if sid in body.inputs:
        return ("in", body.inputs.index(sid))
    if sid in body.outputs:
        return ("out", body.outputs.index(sid))
    raise GraphError(
        f"while_loop: the condition reads {body.label(sid)}, which is neither a body input nor "
        "a body output; build the body with it among its outputs"
    )


def _early_outputs(body: Graph, breakpoint: Any) -> tuple[int, ...]:  # noqa: A002
    """Positions of the body outputs computed before the breakpoint."""
    if breakpoint == "before":
        return ()
    if breakpoint == "after":
        return tuple(range(len(body.outputs)))
    is_int = isinstance(breakpoint, (int, np.integer)) and not isinstance(breakpoint, bool)
    if not is_int or not 0 <= breakpoint <= len(body.nodes):
        raise CommandError(
            f'while_loop: breakpoint must be "before", "after" or a node count in '
            f"[0, {len(body.nodes)}], got {breakpoint!r}"
        )
    last = {}
    for index, node in enumerate(body.nodes):
        for sid in node.outputs:
            last[body.symbols[sid].root] = index
    return tuple(
        j for j, sid in enumerate(body.outputs) if last.get(body.symbols[sid].root, -1) < breakpoint
    )


def _as_tuple(out: Any) -> tuple[Symbol, ...]:
    return out if isinstance(out, tuple) else (out,)
