"""The while loop's static rules: structure checks, shape, display and when it has a
reverse mode (see :mod:`fnnc.ops.control` for the loop's semantics)."""

from __future__ import annotations

import functools

import numpy as np

from fnnc.core.command import Command, Spec
from fnnc.errors import CommandError, GraphError
from fnnc.ops._subgraph import (
    check_inputs,
    higher_order_check,
    positions,
    require_graph,
    require_scalar,
    require_spec,
)


@functools.lru_cache(maxsize=512)
def _check_while(body, cond, carry_overs, cond_inputs, breakpoint, max_iterations, tape) -> None:
    """Structural rules of a loop (cached: graphs are hashable)."""
    require_graph("while_loop", "body", body)
    require_graph("while_loop", "cond", cond)
    _check_reverse_mode(max_iterations, tape)
    for index, node in enumerate(body.nodes):
        for sid in node.outputs:
            root = body.symbols[sid].root
            if root in body.inputs:
                raise GraphError(
                    f"while_loop: body node {index} ({node.name or node.cmd.name}) writes the "
                    f"body input {body.label(root)}; a loop-carried value is a new symbol: "
                    f"write it to a fresh tensor and carry it over into {body.label(root)}"
                )
    early = positions("while_loop", "breakpoint", breakpoint, len(body.outputs), "the body")
    _check_carry_overs(body, carry_overs)
    seen = _cond_symbols(body, cond_inputs, early)
    read = {j for j, _ in carry_overs} | {k for kind, k in cond_inputs if kind == "out"}
    for j, sid in enumerate(body.outputs):
        if j not in read and sid not in body.inputs:
            raise GraphError(
                f"while_loop: body output {body.label(sid)} has no carry-over and the condition "
                "does not read it, so its value is lost after each iteration; carry it into "
                f"the body input it updates (carry_overs={{{body.label(sid)}: <that input>}})"
            )
    _check_cond(body, cond, seen)


def _check_reverse_mode(max_iterations, tape) -> None:
    """``max_iterations`` None or an int >= 0; ``tape`` None or an int >= 1; not both."""
    is_int = lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, bool)
    if max_iterations is not None and not (is_int(max_iterations) and max_iterations >= 0):
        raise CommandError(
            f"while_loop: max_iterations must be None or an int >= 0, got {max_iterations!r}"
        )
    if tape is not None and not (is_int(tape) and tape >= 1):
        raise CommandError(
            f"while_loop: tape must be None or an int >= 1 (the most iterations whose "
            f"carried values the backward can replay), got {tape!r}"
        )
    if tape is not None and max_iterations is not None:
        raise CommandError(
            f"while_loop: give max_iterations ({max_iterations}) or tape ({tape}), not both: "
            "max_iterations=N bounds the loop (a scan of N steps every call), tape=K keeps "
            "the loop unbounded and stores up to K iterations for the backward"
        )


def _check_carry_overs(body, carry_overs) -> None:
    """Pairs (output, input) in range, one per input, output spec == input spec."""
    n_out, n_in = len(body.outputs), len(body.inputs)
    if not carry_overs:
        raise GraphError(
            "while_loop: no carry-overs; a loop needs at least one body output "
            "carried into a body input (y -> x)"
        )
    into: dict[int, int] = {}
    for pair in carry_overs:
        ok = isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(v, int) for v in pair)
        if not ok or not (0 <= pair[0] < n_out and 0 <= pair[1] < n_in):
            raise CommandError(
                f"while_loop: carry-over {pair!r} must be a pair (output position, input "
                f"position); the body has {n_out} outputs and {n_in} inputs"
            )
        j, i = pair
        y, x = body.outputs[j], body.inputs[i]
        if i in into:
            raise GraphError(
                f"while_loop: body input {body.label(x)} receives two carry-overs "
                f"(outputs {body.label(body.outputs[into[i]])} and {body.label(y)})"
            )
        into[i] = j
        require_spec(
            f"while_loop: carry-over {body.label(y)} -> {body.label(x)}: the output",
            body.spec(y),
            body.spec(x),
            "the input it is carried into",
        )


def _cond_symbols(body, cond_inputs, early: tuple[int, ...]) -> list[int]:
    """The body symbols the condition reads after the count."""
    seen = []
    for ref in cond_inputs:
        kind, k = ref if isinstance(ref, tuple) and len(ref) == 2 else (None, -1)
        size = len(body.inputs) if kind == "in" else len(body.outputs)
        if kind not in ("in", "out") or not isinstance(k, int) or not 0 <= k < size:
            raise CommandError(
                f"while_loop: condition input {ref!r} must be ('in', i) or "
                "('out', j) with i, j positions of the body's inputs / outputs"
            )
        if kind == "out" and k not in early:
            raise GraphError(
                f"while_loop: the condition reads body output "
                f"{body.label(body.outputs[k])}, which the body computes after the "
                "breakpoint; move the breakpoint after it"
            )
        seen.append(body.inputs[k] if kind == "in" else body.outputs[k])
    return seen


def _check_cond(body, cond, seen: list[int]) -> None:
    """cond takes (count: int32[], *seen) and returns a bool scalar."""
    if len(cond.inputs) != 1 + len(seen):
        labels = ", ".join(body.label(s) for s in seen) or "nothing else"
        raise GraphError(
            f"while_loop: the condition takes {len(cond.inputs)} input(s); it is fed the loop "
            f"count and {labels} ({1 + len(seen)} in all)"
        )
    first = cond.inputs[0]
    count = Spec((), np.dtype(np.int32))
    where = f"while_loop: the condition's first input {cond.label(first)}"
    require_spec(where, cond.spec(first), count, "the loop count it receives")
    for sid, mine in zip(seen, cond.inputs[1:]):
        where = f"while_loop: the condition input {cond.label(mine)}"
        require_spec(where, cond.spec(mine), body.spec(sid), f"the body's {body.label(sid)}")
    require_scalar("while_loop", "condition", cond, "bool")


def while_shape(
    *specs: Spec, body, cond, carry_overs, cond_inputs, breakpoint, max_iterations, tape
):
    _check_while(body, cond, carry_overs, cond_inputs, breakpoint, max_iterations, tape)
    check_inputs("while_loop", "body", body, specs)
    return tuple(body.spec(body.inputs[i]) for _, i in carry_overs)


def while_display(cmd: Command) -> str:
    p = cmd.kwargs
    return describe_loop(
        p.get("body"),
        p.get("carry_overs"),
        p.get("breakpoint"),
        p.get("max_iterations"),
        p.get("tape"),
    )


def describe_loop(body, carry, early, bound, tape) -> str:
    """``while_loop[1 nodes; carry z1->z0; break before; tape=8]``: listings and errors."""
    try:
        name = lambda sid: body.symbols[sid].name or f"%{sid}"
        pairs = ", ".join(f"{name(body.outputs[j])}->{name(body.inputs[i])}" for j, i in carry)
        where = "before" if not early else "after"
        if early and len(early) < len(body.outputs):
            where = "after " + ",".join(name(body.outputs[j]) for j in early)
        shown = [f"{len(body.nodes)} nodes", f"carry {pairs}", f"break {where}"]
        shown += [] if bound is None else [f"max_iterations={bound}"]
        shown += [] if tape is None else [f"tape={tape}"]
        return f"while_loop[{'; '.join(shown)}]"
    except (AttributeError, IndexError, TypeError, ValueError):
        return "while_loop[?]"


NO_REVERSE_MODE = (
    "gradients need a static trip bound or a tape, and this loop has neither "
    "(lax.while_loop has no reverse mode); rebuild it with max_iterations=N, an upper "
    "bound on its trips (a scan of N steps), or with tape=K to keep it unbounded and "
    "store up to K iterations for the backward"
)


TAPE_FIRST_ORDER = (
    "a loop with a tape has first-order gradients only (its backward replays the tape in "
    "a lax.while_loop, which has no reverse mode), and this is gradient order {order}; "
    "build the loop with max_iterations=N, an upper bound on its trips (a scan of N "
    "steps), to differentiate it more than once"
)


def while_backward_check(cmd: Command, order: int = 1) -> str | None:
    """Why ``cmd`` has no gradient of order ``order`` (1: its backward, 2: the backward
    of that, ...): a loop needs ``max_iterations`` or ``tape``, a tape gives only the
    first order, and a bounded loop has the orders its body's nodes have."""
    if cmd.param("max_iterations") is not None:
        return higher_order_check(cmd.param("body"), order)
    if cmd.param("tape") is not None:
        return None if order <= 1 else TAPE_FIRST_ORDER.format(order=order)
    return NO_REVERSE_MODE
