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
* Lowering: ``lax.while_loop``. It has no reverse mode, so a loop that is
  differentiated needs one of two hyper-parameters, else its backward raises
  :class:`~fnnc.errors.CommandError`:

  - ``max_iterations=N`` (a static trip bound): the forward runs a ``lax.scan`` of N
    steps with an "active" flag instead: the same values while ``count`` stays within
    N, and its backward is ``jax.vjp`` of that scan with every body node differentiated
    by its command's own backward rule (as the backward pass and a taped loop do). The
    loop then stops at ``count == N`` even if the condition still holds. Every call pays
    N steps.
  - ``tape=K`` (NNC's tape, for a trip count that is data): the forward stays a
    ``lax.while_loop`` that also stores each iteration's carried values in a buffer of
    K iterations; the backward replays the tape in reverse over the iterations actually
    taken, running each command's own backward rule on the body
    (:mod:`fnnc.ops.while_tape`). Cost follows the trips taken; memory is K copies of
    the carried tensors. More than K iterations: the forward values stay exact, the
    gradients are NaN and the backward raises an error naming the loop, its trip
    count, K and the K to rebuild with.

**case_of** (NNC's ``ccv_nnc_symbolic_graph_case_of_new``). ``selector(*inputs)``
returns an integer scalar ``k``; branch ``k`` runs on the inputs and its outputs are
the node's. ``-1`` is the bypass: output ``k`` is input ``bypass[k]``. Lowering:
``lax.switch`` on ``k + 1`` (slot 0 is the bypass), which clamps other indices into
range. Its backward is ``jax.vjp`` of the switch with every branch node differentiated
by its command's own backward rule (no gradient reaches the index).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import NOTHING, Command, Spec, defcommand, vjp_backward
from fnnc.core.dtypes import at_least_float32
from fnnc.errors import CommandError, GraphError
from fnnc.ops._rules import broadcast_shape, require_choice, require_same_dtype, to_shape
from fnnc.ops._subgraph import (
    check_inputs,
    higher_order_check,
    positions,
    require_graph,
    require_scalar,
    require_spec,
    run_graph,
    run_graph_nnc,
    split_body,
    without_effects,
)
from fnnc.ops._while_rules import (
    NO_REVERSE_MODE,
    describe_loop,
    while_backward_check,
    while_display,
    while_shape,
)
from fnnc.ops.while_tape import taped_while

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


@defcommand(
    family="control",
    shape=while_shape,
    display=while_display,
    backward_check=while_backward_check,
)
def while_loop(
    *inputs,
    body,
    cond,
    carry_overs,
    cond_inputs=(),
    breakpoint=(),
    max_iterations=None,
    tape=None,
):
    """NNC's while loop over a body sub-graph (see the module doc for the semantics).

    Build it with :func:`fnnc.graph.while_loop`. Hyper-parameters: ``body`` and
    ``cond`` graphs, ``carry_overs`` pairs (body output position, body input position),
    ``cond_inputs`` (``("in", i)`` / ``("out", j)``), ``breakpoint`` (positions of the
    body outputs computed before the condition), and for gradients one of
    ``max_iterations`` (a static bound: the loop lowers to a scan of that many steps and
    stops there) or ``tape`` (the loop stays unbounded; its backward replays up to
    ``tape`` stored iterations, :mod:`fnnc.ops.while_tape`).

    A tape too short for the iterations a call takes is found only when that call's
    backward runs (the trip count is data): its gradients are NaN and the backward
    raises a :class:`~fnnc.errors.CommandError` from a host callback that names the loop,
    its trip count, the tape and the tape to rebuild with (``interpret`` wraps it in a
    ``GraphError`` naming the node; a compiled :class:`~fnnc.graph.Program` holding a
    taped backward waits for its outputs and raises it as a ``CommandError`` naming the
    node). Why this design: :mod:`fnnc.ops.while_tape`.

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

    With ``tape=4`` the same loop differentiates (``d(8 z0)/dz0 = 8``):

    >>> import jax
    >>> loop = ops.while_loop(body=body, cond=cond, carry_overs=((0, 0),), tape=4)
    >>> float(jax.grad(loop)(np.float32(1)))
    8.0
    """
    return _run_loop(
        inputs, body, cond, carry_overs, cond_inputs, breakpoint, max_iterations, tape, False
    )


def _run_loop(inputs, body, cond, carry_overs, cond_inputs, breakpoint, max_iterations, tape, nnc):
    """The loop; ``nnc``: the body's nodes differentiate by their own backward rules."""
    head, tail = split_body(body, breakpoint)
    n_roots = len(head.outputs) - len(breakpoint)
    slots = sorted({i for _, i in carry_overs})
    fixed = [i for i in range(len(inputs)) if i not in slots]
    dtypes = [inputs[i].dtype for i in slots]
    # A differentiated loop (a taped one trip by trip, a bounded one in its backward) is
    # differentiated with jax.vjp of the body: running it through run_graph_nnc makes
    # that vjp follow each command's own backward rule, as the backward pass does.
    run = run_graph if tape is None and not nnc else run_graph_nnc
    kinds = [inputs[i].dtype for i in fixed]

    def full(consts, xs):
        args = [None] * len(inputs)
        for i, v, d in zip(fixed, consts, kinds):
            args[i] = lax.convert_element_type(v, d)
        for i, v in zip(slots, xs):
            args[i] = v
        return args

    def test(consts, state):
        count, xs, early = state
        args = full(consts, xs)
        seen = [
            args[k] if kind == "in" else early[n_roots + breakpoint.index(k)]
            for kind, k in cond_inputs
        ]
        return run_graph(cond, [count, *seen])[0]

    def step(consts, state):
        count, xs, early = state
        outs = run(tail, [*full(consts, xs), *early[:n_roots]])
        new = list(xs)
        for j, i in carry_overs:
            new[slots.index(i)] = lax.convert_element_type(outs[j], dtypes[slots.index(i)])
        new = tuple(new)
        return count + 1, new, tuple(run(head, full(consts, new)))

    # Loop-invariant 16-bit floats enter the loop in float32 (each trip reads them back
    # exactly): their gradients, summed over the trips, are then summed in float32 and
    # rounded once, as scan's are (a bfloat16 sum of 300 terms was 7% off).
    consts = tuple(_widened(inputs[i]) for i in fixed)
    xs0 = tuple(lax.convert_element_type(inputs[i], d) for i, d in zip(slots, dtypes))
    state = (jnp.zeros((), jnp.int32), xs0, tuple(run(head, full(consts, xs0))))
    if tape is not None:
        label = describe_loop(body, carry_overs, breakpoint, max_iterations, tape)
        state = taped_while(test, step, consts, state, capacity=tape, label=label)
    else:
        state = _untaped(test, step, consts, state, max_iterations)
    _, xs, early = state
    outs = tuple(
        early[n_roots + breakpoint.index(j)] if j in breakpoint else xs[slots.index(i)]
        for j, i in carry_overs
    )
    return outs[0] if len(outs) == 1 else outs


def _widened(x):
    """``x`` in the type its gradient is summed in over a loop's trips."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return x
    return lax.convert_element_type(x, at_least_float32(x.dtype))


def _untaped(test, step, consts, state, max_iterations):
    """``lax.while_loop``, or with a bound a ``lax.scan`` of that many masked steps."""
    test, step = functools.partial(test, consts), functools.partial(step, consts)
    if max_iterations is None:
        return lax.while_loop(test, step, state)

    def bounded(carry, _):
        state, active = carry
        state = lax.cond(active, step, lambda s: s, state)
        return (state, jnp.logical_and(active, test(state))), None

    (state, _), _ = lax.scan(bounded, (state, test(state)), None, length=max_iterations)
    return state


@while_loop.backward
def _while_loop_backward(grads, inputs, outputs, **params):
    if params["max_iterations"] is None and params["tape"] is None:
        raise CommandError(f"while_loop: {NO_REVERSE_MODE}")
    return vjp_backward(_differentiable_loop, grads, inputs, **params)


def _differentiable_loop(*inputs, body, cond, **params):
    """The loop whose ``jax.vjp`` follows the body commands' own backward rules; the
    body's effects (a debug callback) ran in the forward and do not run again here."""
    body, cond = without_effects(body), without_effects(cond)
    return _run_loop(inputs, body=body, cond=cond, **params, nnc=True)


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


def _case_backward_check(cmd: Command, order: int = 1) -> str | None:
    """A case_of has the gradient orders all its branches have."""
    for k, branch in enumerate(cmd.param("branches")):
        reason = higher_order_check(branch, order)
        if reason is not None:
            return f"branch {k}, {reason}"
    return None


@defcommand(
    family="control",
    shape=_case_shape,
    display=_case_display,
    backward_check=_case_backward_check,
)
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
    return _run_case(inputs, selector, branches, bypass, run_graph)


@case_of.backward
def _case_of_backward(grads, inputs, outputs, **params):
    # jax.vjp of the branches run by run_graph_nnc: each node's own backward rule, as the
    # backward pass (and NNC's backward of the taken branch) differentiates it.
    return vjp_backward(_differentiable_case, grads, inputs, **params)


def _differentiable_case(*inputs, selector, branches, bypass):
    branches = tuple(without_effects(g) for g in branches)
    return _run_case(inputs, without_effects(selector), branches, bypass, run_graph_nnc)


def _run_case(inputs, selector, branches, bypass, run):
    """case_of's forward; ``run`` runs a branch (:func:`run_graph` or its NNC-rule twin)."""
    (index,) = run_graph(selector, inputs)
    dtypes = [inputs[p].dtype for p in bypass]

    def take(graph):
        return lambda *xs: tuple(
            lax.convert_element_type(o, d) for o, d in zip(run(graph, xs), dtypes)
        )

    fns = [lambda *xs: tuple(lax.convert_element_type(xs[p], d) for p, d in zip(bypass, dtypes))]
    fns += [take(graph) for graph in branches]
    slot = jnp.clip(index.astype(jnp.int32) + 1, 0, len(branches))
    outs = lax.switch(slot, fns, *inputs)
    return outs[0] if len(outs) == 1 else tuple(outs)
