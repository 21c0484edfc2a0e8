"""Pipelines: run passes in order, verify and dump between them, repeat to a fixpoint."""

from __future__ import annotations

import dataclasses
import difflib
import time
from collections.abc import Callable, Sequence

from fnnc import config
from fnnc.core.ir import Graph, require_graph
from fnnc.core.params import is_count
from fnnc.errors import FnncError, GraphError
from fnnc.graph.passes.cse import cse
from fnnc.graph.passes.dce import dce
from fnnc.graph.passes.fold import fold
from fnnc.graph.passes.fuse import fuse
from fnnc.graph.verify import verify

Pass = Callable[[Graph], Graph]

PASSES: dict[str, Pass] = {"cse": cse, "dce": dce, "fold": fold, "fuse": fuse}
"""The passes :func:`simplify` knows by name."""

SIMPLIFY_ROUNDS = 4


def _name(p: Pass) -> str:
    return getattr(p, "__name__", repr(p))


def resolve_passes(passes: str | Pass | Sequence[str | Pass], where: str) -> tuple[Pass, ...]:
    """``passes`` as a tuple of functions: names are looked up in :data:`PASSES`, and a
    lone name or function is a list of one; anything else is a :class:`GraphError` that
    says what ``where`` takes."""
    if isinstance(passes, str) or callable(passes):
        passes = (passes,)
    what = (
        "functions Graph -> Graph or the names of the built-in ones "
        f"{sorted(PASSES)}, one or a list"
    )
    if not isinstance(passes, Sequence):
        raise GraphError(f"{where}: passes are {what}; got {type(passes).__name__} {passes!r}")
    resolved = []
    for p in passes:
        if isinstance(p, str):
            if p not in PASSES:
                close = difflib.get_close_matches(p, PASSES, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise GraphError(
                    f"{where}: unknown pass {p!r}{hint}; known passes are {sorted(PASSES)}, "
                    "or pass a function Graph -> Graph"
                )
            p = PASSES[p]
        elif hasattr(p, "pattern") and hasattr(p, "replace"):  # a Rule: one step short
            raise GraphError(
                f"{where}: passes are {what}; got the rule {getattr(p, 'label', p)!r}: make "
                "it a pass with fnnc.graph.rewrite_pass(rule, ...)"
            )
        elif not callable(p):
            raise GraphError(f"{where}: passes are {what}; got {type(p).__name__} {p!r}")
        resolved.append(p)
    return tuple(resolved)


@dataclasses.dataclass(frozen=True)
class PassReport:
    """One pass run by :func:`run_passes`: its name, round, time and node counts."""

    name: str
    round: int
    seconds: float
    nodes_before: int
    nodes_after: int
    changed: bool

    def __str__(self) -> str:
        took = f"{self.seconds * 1e3:.1f} ms"
        if not self.changed:
            return f"{self.name} (round {self.round}): unchanged, {took}"
        return (
            f"{self.name} (round {self.round}): {self.nodes_before} -> {self.nodes_after} "
            f"nodes, {took}"
        )


def graph_diff(before: Graph, after: Graph, name: str = "pass") -> str:
    """The unified diff of two graphs' listings (one line of context)."""
    lines = difflib.unified_diff(
        str(before).splitlines(), str(after).splitlines(), "before", f"after {name}", n=1
    )
    return "\n".join(line.rstrip("\n") for line in lines)


def run_passes(
    graph: Graph,
    passes: str | Pass | Sequence[str | Pass],
    *,
    verify_each: bool | None = None,
    print_each: bool | None = None,
    max_rounds: int = 1,
    report: list[PassReport] | None = None,
) -> Graph:
    """Runs ``passes`` in order, ``max_rounds`` times at most or until nothing changes.

    Args:
        graph: the graph.
        passes: functions ``Graph -> Graph`` that return their argument itself when
            they change nothing, or names of :data:`PASSES` (one, or a list).
        verify_each: verify each changed graph, naming the pass that broke it; default
            ``fnnc.config.get().checks``.
        print_each: print each pass's time, node counts and the diff of the listing
            it made; default ``fnnc.config.get().debug >= 1`` (``FNNC_DEBUG=1``).
        max_rounds: with more than one, the passes run again while a round changed the
            graph (a fixpoint is a round after which the graph ``is`` the same object).
        report: a list to append one :class:`PassReport` per pass run to.

    Returns:
        The final graph (``graph`` itself when no pass changed anything).

    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder
    >>> from fnnc.graph.passes import cse, dce, run_passes
    >>> b = GraphBuilder()
    >>> x = b.input((2,), name="x")
    >>> _ = b.exec(ops.ewexp(), x)
    >>> g = b.build([b.exec(ops.relu(), x)])
    >>> print(run_passes(g, (cse, dce), print_each=True))  # doctest: +ELLIPSIS
    -- cse (round 1): unchanged, ... ms
    -- dce (round 1): 2 -> 1 nodes, ... ms
    --- before
    +++ after dce
    @@ -1,5 +1,4 @@
     graph(%0:f32[2] x) {
    -  %1:f32[2] = ewexp(%0)
    -  %2:f32[2] = relu(%0)
    -  return %2
    +  %1:f32[2] = relu(%0)
    +  return %1
     }
    graph(%0:f32[2] x) {
      %1:f32[2] = relu(%0)
      return %1
    }
    """
    require_graph(graph, "run_passes")
    passes = resolve_passes(passes, "run_passes")
    if not is_count(max_rounds, 1):
        raise GraphError(
            f"run_passes: max_rounds is an int >= 1 (rounds of the passes); got {max_rounds!r}"
        )
    cfg = config.get()
    checks = cfg.checks if verify_each is None else verify_each
    show = cfg.debug >= 1 if print_each is None else print_each
    for round_ in range(1, max_rounds + 1):
        start = graph
        for p in passes:
            began = time.perf_counter()
            new = p(graph)
            if not isinstance(new, Graph):  # checked with checks off too: it costs nothing
                raise GraphError(
                    f"pass {_name(p)} (round {round_}) returned {type(new).__name__} "
                    f"{new!r:.60}, not a Graph; a pass returns the new graph, or the graph "
                    "it was given when it changes nothing"
                )
            if show or report is not None:
                done = PassReport(
                    _name(p), round_, time.perf_counter() - began, len(graph.nodes),
                    len(new.nodes), new is not graph,
                )  # fmt: skip
                if report is not None:
                    report.append(done)
                if show:
                    print(f"-- {done}")
                    if new is not graph:
                        print(graph_diff(graph, new, _name(p)))
            if checks and new is not graph:
                try:
                    verify(new)
                except FnncError as e:
                    raise GraphError(
                        f"pass {_name(p)} (round {round_}) produced an invalid graph; its "
                        f"input was valid, so the pass has a bug:\n{e}"
                    ) from e
            graph = new
        if graph is start:
            break
    return graph


def simplify(
    graph: Graph,
    *,
    passes: str | Pass | Sequence[str | Pass] = ("cse", "fold", "fuse", "dce"),
    max_rounds: int = SIMPLIFY_ROUNDS,
) -> Graph:
    """Runs the simplifying passes until a fixpoint (at most ``max_rounds`` rounds).

    Args:
        graph: the graph.
        passes: pass names (:data:`PASSES`) or functions, in order (a lone name or
            function is one pass).
        max_rounds: most rounds; each round runs every pass once.

    NNC's example, ``(x + y) * (x + y)`` built with two ``add`` nodes, becomes one
    ``add`` and one ``mul``:

    >>> import numpy as np
    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder, interpret, simplify
    >>> b = GraphBuilder()
    >>> x, y = b.input((), name="x"), b.input((), name="y")
    >>> z = b.exec(ops.mul(), b.exec(ops.add(), x, y), b.exec(ops.add(), x, y))
    >>> g = simplify(b.build([z]), passes=("cse", "dce"))
    >>> [str(node.cmd) for node in g.nodes]
    ['add', 'mul']
    >>> float(interpret(g, np.float32(10), np.float32(8)))
    324.0
    """
    require_graph(graph, "simplify")
    return run_passes(graph, resolve_passes(passes, "simplify"), max_rounds=max_rounds)
