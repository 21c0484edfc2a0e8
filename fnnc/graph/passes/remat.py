"""remat: recompute forward activations in the backward instead of keeping them.

A graph with its backward (:func:`~fnnc.graph.backward`) keeps every forward tensor a
gradient node reads alive from the forward until that gradient node runs: those are
the activations that dominate training memory. ``remat`` rewrites such a graph so that
chosen forward nodes are *not saved*: right before the first backward node that needs
one of their outputs, the forward segment that produces it is duplicated from the
nearest saved tensors, and the backward reads the recomputed copy. NNC's
``ccv_cnnp_model_set_gradient_checkpointing`` does this per sub-model; here it is a pass
over any graph, driven by a policy or by a byte budget.

The duplicated segment reads its saved inputs through one
:func:`~fnnc.ops.optimization_barrier` that also takes a tensor of the backward, so XLA
can neither merge the recomputation with the forward (CSE) nor schedule it early, as
``jax.checkpoint`` arranges. Duplicated nodes are named ``<name>@remat``.

Before / after (``policy="nothing_saveable"``; ``%2`` is no longer kept for ``%6``)::

    %2 = tanh(%1)                          %2 = tanh(%1)
    %3 = reduce_sum(%2)                    %3 = reduce_sum(%2)
    ...                                    ...
    %6 = tanh.backward(%5, %2)             %7, %8 = optimization_barrier(%1, %5)
                                           %9 = tanh(%7)  # @remat
                                           %6 = tanh.backward(%8, %9)

Not recomputed, whatever the policy: nodes of random or effectful commands (or holding
one in a sub-graph: a loop whose body has a debug callback runs it once), nodes that
write views, nodes whose outputs are graph outputs, nodes without inputs (constants:
nothing to save, and a copy would only add a node), and recomputations (nodes named
``@remat``, or reading the ``remat.barrier`` or another recomputation). So ``remat`` is
idempotent, also after ``simplify``: where ``fold`` turns the loss's seed gradient into
a constant, the first backward node comes after the recomputed segment, which still is
not recomputed again.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from fnnc.core.ir import Graph
from fnnc.errors import GraphError
from fnnc.graph.memory import PASS_THROUGH, Donate, donated_positions, memory_plan
from fnnc.graph.passes._subgraphs import is_pure
from fnnc.graph.passes.remat_cost import node_flops
from fnnc.graph.passes.remat_rewrite import BARRIER as BARRIER
from fnnc.graph.passes.remat_rewrite import SUFFIX as SUFFIX
from fnnc.graph.passes.remat_rewrite import Rewriter

Policy = Callable[[Graph, int], bool]
"""``policy(graph, index) -> True`` when forward node ``index``'s outputs are saved."""

SAVEABLE_COMMANDS = {"dots_saveable": ("gemm", "convolution", "convolution_transpose")}

POLICIES: dict[str, Policy] = {
    "everything_saveable": lambda graph, index: True,
    "nothing_saveable": lambda graph, index: False,
    "dots_saveable": lambda graph, index: (
        graph.nodes[index].cmd.name in SAVEABLE_COMMANDS["dots_saveable"]
    ),
}
"""Named policies, after JAX's ``jax.checkpoint_policies``."""


def backward_start(graph: Graph) -> int | None:
    """The index of the first backward node (one that runs another command's backward,
    as ``gradient`` does), or ``None``."""
    for index, node in enumerate(graph.nodes):
        if node.cmd.definition.backward_node is not None:
            return index
    return None


def remat(
    graph: Graph,
    *,
    policy: str | Policy | None = None,
    budget_bytes: int | None = None,
    donate: Donate = (),
) -> Graph:
    """Recomputes unsaved forward activations in the backward (see module doc).

    Args:
        graph: a graph holding a forward and its backward (gradient nodes).
        policy: which forward nodes keep their outputs: a name from :data:`POLICIES`
            or ``policy(graph, index) -> bool`` (True = saved).
        budget_bytes: instead of a policy, a peak for :func:`~fnnc.graph.memory_plan`:
            the pass chooses the nodes to recompute by a heuristic search (evenly
            spaced saved activations, as in checkpointing every ``sqrt(n)``-th block,
            then saving back what the budget does not need recomputed); it may miss a
            lower peak or a cheaper choice that an exhaustive search would find.
        donate: the graph inputs the compiled program donates (as for
            :func:`~fnnc.graph.compile`), so the budget is checked against the plan of
            the program that runs: a training step's updated parameters and state
            written into the old ones' buffers.

    Returns:
        The rewritten graph (``graph`` itself when nothing is recomputed). Outputs are
        unchanged in value; gradients are bit-identical in exact arithmetic and equal
        to float rounding otherwise.

    Raises:
        GraphError: both or neither of ``policy`` and ``budget_bytes`` given, an unknown
            policy name, a policy that is no function of ``(graph, index)`` (JAX's
            ``jax.checkpoint_policies`` other than the three named ones, which map to
            fnnc's), a budget that is no number, or a budget below what recomputing
            everything reaches.
        GraphInputError: ``donate`` names no graph input.

    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder, backward, memory_plan, remat
    >>> b = GraphBuilder()
    >>> x = b.input((64,), name="x")
    >>> h = x
    >>> for i in range(4):
    ...     h = b.exec(ops.tanh(), h, name=f"t{i}")
    >>> loss = b.exec(ops.reduce_sum(axes=(0,)), h)
    >>> g, _ = backward(b.build([loss]), loss, [x])
    >>> r = remat(g, policy=lambda graph, i: graph.nodes[i].name in ("t1", "t3"))
    >>> memory_plan(r).peak_bytes < memory_plan(g).peak_bytes
    True
    """
    if (policy is None) == (budget_bytes is None):
        raise GraphError("remat: give exactly one of policy= or budget_bytes=")
    donated_positions(graph, donate, "remat")  # a wrong name is an error with a policy too
    saved = None if policy is None else _policy(policy)
    budget = None if budget_bytes is None else _budget(budget_bytes)
    start = backward_start(graph)
    if start is None:
        return graph
    if budget is not None:
        return _within_budget(graph, start, budget, donate)
    assert saved is not None
    unsaved = {i for i in range(start) if not saved(graph, i)}
    return recompute(graph, unsaved)


def _policy(policy: Any) -> Policy:
    """``policy`` as a function, or a GraphError saying what a policy is."""
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise GraphError(f"remat: unknown policy {policy!r}; known: {sorted(POLICIES)}")
        return POLICIES[policy]
    for name, ours in POLICIES.items():  # jax.checkpoint_policies.<name> itself
        if policy is getattr(jax.checkpoint_policies, name, None):
            return ours
    where = getattr(policy, "__module__", None) or type(policy).__module__
    if not callable(policy) or where.split(".")[0] == "jax":
        what = "JAX's checkpoint policy" if callable(policy) else type(policy).__name__
        raise GraphError(
            f"remat: policy is {what} {policy!r}; give a name from {sorted(POLICIES)} or "
            "a function policy(graph, node_index) -> bool (True: the node's outputs are "
            "saved), which sees fnnc nodes, not JAX primitives"
        )
    return policy


def _budget(budget_bytes: Any) -> int:
    """``budget_bytes`` as an int, or a GraphError naming what was given."""
    number = isinstance(budget_bytes, (int, float, np.integer, np.floating))
    if number and not isinstance(budget_bytes, (bool, np.bool_)) and math.isfinite(budget_bytes):
        return int(budget_bytes)
    raise GraphError(
        f"remat: budget_bytes is {type(budget_bytes).__name__} {budget_bytes!r}; give the "
        "peak to meet in bytes, a number such as budget_bytes=2**20"
    )


def recomputable(graph: Graph, start: int | None = None) -> list[int]:
    """Forward nodes that may be recomputed in the backward.

    Not: nodes of random or effectful commands, nodes that write views, nodes whose
    outputs are graph outputs (they stay live to the end anyway), nodes without inputs
    (constants), and nodes that already are recomputations.
    """
    start = backward_start(graph) if start is None else start
    if start is None:
        return []
    symbols = graph.symbols
    outputs = {symbols[s].root for s in graph.outputs}
    copies: set[int] = set()  # roots made by a barrier of remat or a recomputation
    found = []
    for index in range(start):
        node = graph.nodes[index]
        copy = node.name == BARRIER or node.name.endswith(SUFFIX)
        if copy or any(symbols[s].root in copies for s in node.inputs):
            # a recomputation (after fold, ahead of the first backward node): not again
            copies.update(symbols[s].root for s in node.outputs)
            continue
        if not node.inputs:
            continue  # a constant: nothing to save
        if not is_pure(node.cmd) or node.cmd.name in PASS_THROUGH:  # sub-graphs too
            continue
        if any(symbols[s].is_alias or symbols[s].root in outputs for s in node.outputs):
            continue
        found.append(index)
    return found


def candidates(graph: Graph, start: int | None = None) -> list[int]:
    """Recomputable forward nodes whose outputs the backward reads."""
    start = backward_start(graph) if start is None else start
    if start is None:
        return []
    symbols = graph.symbols
    late = {symbols[s].root for node in graph.nodes[start:] for s in node.inputs}
    return [
        i
        for i in recomputable(graph, start)
        if any(symbols[s].root in late for s in graph.nodes[i].outputs)
    ]


def recompute(graph: Graph, unsaved: set[int]) -> Graph:
    """``graph`` with forward nodes ``unsaved`` not saved for the backward.

    Their outputs that backward nodes read are recomputed right before the first such
    reader, from the nearest saved tensors; nodes :func:`recomputable` excludes are kept
    as they are.
    """
    start = backward_start(graph)
    if start is None:
        return graph
    unsaved = set(unsaved) & set(recomputable(graph, start))
    if not unsaved & set(candidates(graph, start)):
        return graph
    return Rewriter(graph, start, unsaved).run()


def _within_budget(graph: Graph, start: int, budget: int, donate: Donate = ()) -> Graph:
    """The cheapest recomputation found whose plan's peak fits ``budget``.

    Candidates are the forward nodes the backward reads, each with the forward-only
    nodes that feed it alone (its segment). First a sweep saves every ``k``-th
    candidate and recomputes the others (``k = 1`` saves everything; for a chain of
    ``n`` blocks ``k ~ sqrt(n)`` is the classic checkpoint spacing), counted from the
    candidate before the one nearest the loss, or from that one (a block's output
    saved, its inner activation recomputed, or the other way round), and keeps the
    spacings that fit; where none fits, :func:`_descend` walks from the lowest peak
    found. Then, from each of the three cheapest spacings that fit and from the lowest
    configuration, each recomputed candidate, most expensive first, is saved again if
    the budget still holds; the cheapest result wins (one greedy pass from the cheapest
    spacing alone had recomputed more for a looser budget than for a tighter one).
    Configurations are tried once each (memoised). The search is a heuristic, not an
    exhaustive one: on some graphs a saved set it does not try meets a lower budget, or
    the same budget with fewer recomputed FLOPs.
    """
    full = memory_plan(graph, donate=donate).peak_bytes
    if full <= budget:
        return graph
    units = _segments(graph, start)
    order = list(units)
    cost = {c: sum(node_flops(graph, i) for i in unit) for c, unit in units.items()}

    memo: dict[frozenset[int], tuple[int, int, Graph, list[int]]] = {}

    def attempt(unsaved: list[int]) -> tuple[int, int, Graph, list[int]]:
        key = frozenset(unsaved)
        if key not in memo:
            result = recompute(graph, _union(units, unsaved))
            peak = memory_plan(result, donate=donate).peak_bytes
            memo[key] = (peak, sum(cost[c] for c in unsaved), result, unsaved)
        return memo[key]

    best: tuple[int, int, Graph, list[int]] | None = None
    fits = []
    lowest = attempt([])
    spacings = {  # every k-th saved, counted from the one before the loss end, or the end
        frozenset(order[len(order) - first :: -k]): None
        for k in range(2, len(order) + 2)
        for first in (2, 1)
    }
    for saved in [*spacings, frozenset()]:  # and none saved
        trial = attempt([c for c in order if c not in saved])
        lowest = min(lowest, trial, key=lambda t: (t[0], t[1]))
        if trial[0] <= budget:
            fits.append(trial)
        if trial[0] <= budget and (best is None or trial[1] < best[1]):
            best = trial
    starts = sorted(fits, key=lambda t: t[1])[:3]
    if lowest[0] > budget:
        lowest = _descend(attempt, order, lowest, budget) or lowest
    if lowest[0] <= budget and (best is None or lowest[3] != best[3]):
        starts.append(lowest)  # the fewest bytes: pruned, it may need fewer FLOPs
    if not starts:
        raise GraphError(
            f"remat: budget_bytes={budget:,d} is below the smallest peak found "
            f"({lowest[0]:,d} bytes; without remat {full:,d}); the search is heuristic, "
            "so a lower peak may exist: raise the budget, or name what to save with "
            "policy= (a function of the node) and check memory_plan(...).peak_bytes"
        )
    return min((_pruned(attempt, s, cost, budget) for s in starts), key=lambda t: t[1])[2]


def _pruned(attempt: Any, best: Any, cost: dict[int, int], budget: int) -> Any:
    """``best`` with each recomputed candidate, most expensive first, saved again
    while the budget still holds."""
    for c in sorted(best[3], key=lambda c: -cost[c]):
        trial = attempt([k for k in best[3] if k != c])
        if trial[0] <= budget:
            best = trial
    return best


def _descend(attempt: Any, order: list[int], start: Any, budget: int) -> Any:
    """From the lowest configuration the sweep found, flip one candidate at a time
    (saved <-> recomputed), or two neighbours together where no single flip helps (a
    block's output and its inner activation saved as a pair), while that lowers the
    peak, until the budget holds."""
    current = start
    groups = [[c] for c in order] + [list(p) for p in itertools.pairwise(order)]
    improved = True
    while improved and current[0] > budget:
        improved = False
        for group in groups:
            unsaved = current[3]
            flipped = [k for k in unsaved if k not in group]
            flipped += [c for c in group if c not in unsaved]
            trial = attempt(flipped)
            if trial[0] < current[0]:
                current, improved = trial, True
                if current[0] <= budget:
                    return current
                break  # single flips first again
    return current if current[0] <= budget else None


def _union(units: dict[int, set[int]], chosen: list[int]) -> set[int]:
    out: set[int] = set()
    for c in chosen:
        out |= units[c]
    return out


def _segments(graph: Graph, start: int) -> dict[int, set[int]]:
    """Per candidate: itself and the recomputable forward-only nodes it alone depends on
    (through others like them), stopping at other candidates, inputs and nodes that
    cannot be recomputed."""
    symbols, producers = graph.symbols, graph.producers
    cands = candidates(graph, start)
    inner = set(recomputable(graph, start)) - set(cands)
    units: dict[int, set[int]] = {}
    for c in cands:
        unit, stack = {c}, [c]
        while stack:
            for s in graph.nodes[stack.pop()].inputs:
                p = producers.get(symbols[s].root)
                if p is not None and p in inner and p not in unit:
                    unit.add(p)
                    stack.append(p)
        units[c] = unit
    return units
