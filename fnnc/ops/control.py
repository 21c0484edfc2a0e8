"""Control family: NNC's while and case..of sub-graphs, and ``compare`` for their conditions.

``while_loop`` and ``case_of`` are ordinary commands whose hyper-parameters hold
sub-graphs (:class:`~fnnc.graph.Graph` values are frozen and hashable). Their forwards
run the sub-graphs node by node with each node's reference forward, so a ``case_of``
can sit in a loop body and a loop in a branch. Build them with
:func:`fnnc.graph.while_loop` and :func:`fnnc.graph.case_of`, which take symbols
instead of the positions stored here.

**while_loop** (NNC's ``ccv_nnc_symbolic_graph_while``). Node inputs feed the body
inputs in order. Each iteration runs the body nodes that come before the breakpoint,
evaluates ``cond(count, *visible)``, and stops if it is false; otherwise it runs the
rest of the body, adds one to ``count`` and carries each body output ``y`` into body
input ``x`` (``carry_overs``, "y -> x"). Body inputs that receive no carry-over are loop
invariant. The node's outputs are the final values of the carried tensors, one per
carry-over: the carried input ``x``, or the output ``y`` itself when the body computed
it before the breakpoint of the last (partial) iteration.

* ``count`` is an int32 scalar starting at 0 (NNC: int64; JAX runs with x64 off).
* Breakpoint before the body with ``count < N``: the body runs N times; after the body:
  N + 1 times. In between is allowed too. The breakpoint is stored as the body outputs
  computed before it (``()`` = before the body, all = after), so passes that rewrite
  the body (dce, cse, fuse) cannot move it: the nodes those outputs need run before the
  condition, the others after (NNC runs the nodes that lead to its breakpoint node).
* The condition sees ``count`` and ``cond_inputs``: ``("in", i)`` is body input ``i``
  as the iteration sees it, ``("out", j)`` a body output computed before the breakpoint.
* Lowering: ``lax.while_loop``. It has no reverse mode, so with ``max_iterations=N``
  (a static trip bound) the forward runs a ``lax.scan`` of N steps with an "active"
  flag instead: the same values while ``count`` stays within N, and ``jax.vjp`` (the
  derived backward) differentiates it. The loop then stops at ``count == N`` even if
  the condition still holds. Without a bound, the backward raises
  :class:`~fnnc.errors.CommandError`.

**case_of** (NNC's ``ccv_nnc_symbolic_graph_case_of_new``). ``selector(*inputs)``
returns an integer scalar ``k``; branch ``k`` runs on the inputs and its outputs are
the node's. ``-1`` is the bypass: output ``k`` is input ``bypass[k]``. Lowering:
``lax.switch`` on ``k + 1`` (slot 0 is the bypass), which clamps other indices into
range. Differentiable through the derived backward (no gradient reaches the index).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import NOTHING, Command, Spec, defcommand, vjp_backward
from fnnc.errors import CommandError, GraphError
from fnnc.ops._rules import broadcast_shape, require_choice, require_same_dtype, to_shape
from fnnc.ops._subgraph import (
    check_inputs,
    positions,
    require_graph,
    require_scalar,
    require_spec,
    run_graph,
    split_body,
)

COMPARISONS = {
    "lt": jnp.less,
    "le": jnp.less_equal,
    "gt": jnp.greater,
    "ge": jnp.greater_equal,
    "eq": jnp.equal,
    "ne": jnp.not_equal,
}


def _compare_shape(a: Spec, b: Spec, *, op: str) -> Spec:
    require_choice("compare", "op", op, tuple(COMPARISONS))
    require_same_dtype("compare", a, b)
    return Spec(broadcast_shape("compare", a.shape, b.shape), np.dtype(np.bool_))


@defcommand(family="control", shape=_compare_shape, uses=NOTHING, differentiable=False)
def compare(a, b, *, op="lt"):
    """``a op b`` elementwise as bool (broadcasting); ``op`` is lt, le, gt, ge, eq or ne.

    Loop conditions and branch selectors are built from it.

    >>> import numpy as np
    >>> ops.compare(op="lt")(np.int32(3), np.int32(5))
    Array(True, dtype=bool)
    """
    shape = broadcast_shape("compare", a.shape, b.shape)
    return COMPARISONS[op](to_shape(a, shape), to_shape(b, shape))


# --- while_loop ---------------------------------------------------------------------


@functools.lru_cache(maxsize=512)
def _check_while(body, cond, carry_overs, cond_inputs, breakpoint, max_iterations) -> None:
    """Structural rules of a loop (cached: graphs are hashable)."""
    require_graph("while_loop", "body", body)
    require_graph("while_loop", "cond", cond)
    bounded = isinstance(max_iterations, (int, np.integer)) and max_iterations >= 0
    if max_iterations is not None and not bounded:
        raise CommandError(
            f"while_loop: max_iterations must be None or an int >= 0, got {max_iterations!r}"
        )
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


def _while_shape(*specs: Spec, body, cond, carry_overs, cond_inputs, breakpoint, max_iterations):
    _check_while(body, cond, carry_overs, cond_inputs, breakpoint, max_iterations)
    check_inputs("while_loop", "body", body, specs)
    return tuple(body.spec(body.inputs[i]) for _, i in carry_overs)


def _while_display(cmd: Command) -> str:
    try:
        body, carry = cmd.param("body"), cmd.param("carry_overs")
        early, bound = cmd.param("breakpoint"), cmd.param("max_iterations")
        name = lambda sid: body.symbols[sid].name or f"%{sid}"
        pairs = ", ".join(f"{name(body.outputs[j])}->{name(body.inputs[i])}" for j, i in carry)
        where = "before" if not early else "after"
        if early and len(early) < len(body.outputs):
            where = "after " + ",".join(name(body.outputs[j]) for j in early)
        shown = [f"{len(body.nodes)} nodes", f"carry {pairs}", f"break {where}"]
        shown += [] if bound is None else [f"max_iterations={bound}"]
        return f"while_loop[{'; '.join(shown)}]"
    except (AttributeError, IndexError, TypeError, ValueError):
        return "while_loop[?]"


def _while_backward_check(cmd: Command) -> str | None:
    if cmd.param("max_iterations") is not None:
        return None
    return (
        "gradients need a static trip bound, and this loop has none (lax.while_loop has "
        "no reverse mode); rebuild it with max_iterations=N, an upper bound on its trips"
    )


@defcommand(
    family="control",
    shape=_while_shape,
    display=_while_display,
    backward_check=_while_backward_check,
)
def while_loop(
    *inputs, body, cond, carry_overs, cond_inputs=(), breakpoint=(), max_iterations=None
):
    """NNC's while loop over a body sub-graph (see the module doc for the semantics).

    Build it with :func:`fnnc.graph.while_loop`. Hyper-parameters: ``body`` and
    ``cond`` graphs, ``carry_overs`` pairs (body output position, body input position),
    ``cond_inputs`` (``("in", i)`` / ``("out", j)``), ``breakpoint`` (positions of the
    body outputs computed before the condition), ``max_iterations`` (static bound;
    needed for gradients).

    >>> import numpy as np
    >>> from fnnc.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> z0 = b.input((), name="z0")
    >>> body = b.build([b.exec(ops.scalar_mul(a=2.0), z0, name="z1")])
    >>> c = GraphBuilder()
    >>> n = c.input((), np.int32, name="count")
    >>> cond = c.build([c.exec(ops.compare(op="lt"), n, c.constant(np.int32(3)))])
    >>> ops.while_loop(body=body, cond=cond, carry_overs=((0, 0),))(np.float32(1))
    Array(8., dtype=float32)
    """
    head, tail = split_body(body, breakpoint)
    n_roots = len(head.outputs) - len(breakpoint)
    slots = sorted({i for _, i in carry_overs})
    dtypes = [inputs[i].dtype for i in slots]

    def full(xs):
        args = list(inputs)
        for i, x in zip(slots, xs):
            args[i] = x
        return args

    def test(state):
        count, xs, early = state
        args = full(xs)
        seen = [
            args[k] if kind == "in" else early[n_roots + breakpoint.index(k)]
            for kind, k in cond_inputs
        ]
        return run_graph(cond, [count, *seen])[0]

    def step(state):
        count, xs, early = state
        outs = run_graph(tail, [*full(xs), *early[:n_roots]])
        new = list(xs)
        for j, i in carry_overs:
            new[slots.index(i)] = lax.convert_element_type(outs[j], dtypes[slots.index(i)])
        new = tuple(new)
        return count + 1, new, tuple(run_graph(head, full(new)))

    xs0 = tuple(lax.convert_element_type(inputs[i], d) for i, d in zip(slots, dtypes))
    state = (jnp.zeros((), jnp.int32), xs0, tuple(run_graph(head, full(xs0))))
    if max_iterations is None:
        state = lax.while_loop(test, step, state)
    else:

        def bounded(carry, _):
            state, active = carry
            state = lax.cond(active, step, lambda s: s, state)
            return (state, jnp.logical_and(active, test(state))), None

        (state, _), _ = lax.scan(bounded, (state, test(state)), None, length=max_iterations)
    _, xs, early = state
    outs = tuple(
        early[n_roots + breakpoint.index(j)] if j in breakpoint else xs[slots.index(i)]
        for j, i in carry_overs
    )
    return outs[0] if len(outs) == 1 else outs


@while_loop.backward
def _while_loop_backward(grads, inputs, outputs, **params):
    if params["max_iterations"] is None:
        raise CommandError(
            "while_loop: gradients need a static trip bound, and this loop has none "
            "(lax.while_loop has no reverse mode); rebuild it with max_iterations=N, an upper "
            "bound on the loop count: the forward then runs a lax.scan of N steps and "
            "returns the same values"
        )
    return vjp_backward(while_loop.definition.forward, grads, inputs, **params)


# --- case_of ------------------------------------------------------------------------


@functools.lru_cache(maxsize=512)
def _check_case(selector, branches, bypass) -> None:
    require_graph("case_of", "selector", selector)
    require_scalar("case_of", "selector", selector, "int")
    if not isinstance(branches, tuple) or not branches:
        raise CommandError(
            f"case_of: branches must be a non-empty tuple of Graphs, got {branches!r:.80}"
        )
    first = branches[0]
    for k, branch in enumerate(branches):
        require_graph("case_of", f"branch {k}", branch)
        if len(branch.outputs) != len(first.outputs):
            raise GraphError(
                f"case_of: branch {k} returns {len(branch.outputs)} outputs, "
                f"branch 0 returns {len(first.outputs)}; every branch must agree"
            )
        for sid, ref in zip(branch.outputs, first.outputs):
            require_spec(
                f"case_of: branch {k} output {branch.label(sid)}",
                branch.spec(sid),
                first.spec(ref),
                f"branch 0 output {first.label(ref)}",
            )
    if not isinstance(bypass, tuple) or len(bypass) != len(first.outputs):
        raise CommandError(
            f"case_of: bypass must give one input position per output "
            f"({len(first.outputs)}), got {bypass!r}"
        )


def _case_shape(*specs: Spec, selector, branches, bypass) -> tuple[Spec, ...]:
    _check_case(selector, branches, bypass)
    check_inputs("case_of", "selector", selector, specs)
    for k, branch in enumerate(branches):
        check_inputs("case_of", f"branch {k}", branch, specs)
    first = branches[0]
    positions("case_of", "bypass", bypass, len(specs), "the node's inputs")
    for k, (p, sid) in enumerate(zip(bypass, first.outputs)):
        require_spec(
            f"case_of: bypass output {k} (input {p})",
            specs[p],
            first.spec(sid),
            f"the branches' output {first.label(sid)}",
        )
    return first.output_specs


def _case_display(cmd: Command) -> str:
    try:
        n, bypass = len(cmd.param("branches")), cmd.param("bypass")
        return f"case_of[{n} branches; bypass ({','.join(map(str, bypass))})]"
    except (AttributeError, TypeError):
        return "case_of[?]"


@defcommand(family="control", shape=_case_shape, display=_case_display)
def case_of(*inputs, selector, branches, bypass):
    """NNC's case..of: ``branches[selector(*inputs)]`` runs; -1 bypasses (module doc).

    Build it with :func:`fnnc.graph.case_of`. ``bypass[k]`` is the input position
    whose value output ``k`` takes when the selector returns -1.

    >>> import numpy as np
    >>> from fnnc.graph import GraphBuilder
    >>> s = GraphBuilder()
    >>> x = s.input((), name="x")
    >>> selector = s.build([s.constant(np.int32(-1))])
    >>> b = GraphBuilder()
    >>> x = b.input((), name="x")
    >>> branch = b.build([b.exec(ops.scalar_mul(a=2.0), x)])
    >>> ops.case_of(selector=selector, branches=(branch,), bypass=(0,))(np.float32(3))
    Array(3., dtype=float32)
    """
    (index,) = run_graph(selector, inputs)
    dtypes = [inputs[p].dtype for p in bypass]

    def take(graph):
        return lambda *xs: tuple(
            lax.convert_element_type(o, d) for o, d in zip(run_graph(graph, xs), dtypes)
        )

    fns = [lambda *xs: tuple(lax.convert_element_type(xs[p], d) for p, d in zip(bypass, dtypes))]
    fns += [take(graph) for graph in branches]
    slot = jnp.clip(index.astype(jnp.int32) + 1, 0, len(branches))
    outs = lax.switch(slot, fns, *inputs)
    return outs[0] if len(outs) == 1 else tuple(outs)
