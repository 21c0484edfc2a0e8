"""Pipelines: run passes in order, verify and dump between them, repeat to a fixpoint."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence

from fnnc import config
from fnnc.core.ir import Graph
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


def run_passes(
    graph: Graph,
    passes: Sequence[Pass],
    *,
    verify_each: bool | None = None,
    print_each: bool | None = None,
    max_rounds: int = 1,
) -> Graph:
    """Runs ``passes`` in order, ``max_rounds`` times at most or until nothing changes.

    Args:
        graph: the graph.
        passes: functions ``Graph -> Graph`` that return their argument itself when
            they change nothing.
        verify_each: verify each changed graph, naming the pass that broke it; default
            ``fnnc.config.get().checks``.
        print_each: print each pass's result as a listing; default
            ``fnnc.config.get().debug >= 1``.
        max_rounds: with more than one, the passes run again while a round changed the
            graph (a fixpoint is a round after which the graph ``is`` the same object).

    Returns:
        The final graph (``graph`` itself when no pass changed anything).

    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder
    >>> from fnnc.graph.passes import cse, dce, run_passes
    >>> b = GraphBuilder()
    >>> x = b.input((2,), name="x")
    >>> _ = b.exec(ops.ewexp(), x)
    >>> g = b.build([b.exec(ops.relu(), x)])
    >>> print(run_passes(g, (cse, dce), print_each=True))
    -- cse (round 1): unchanged
    -- dce (round 1):
    graph(%0:f32[2] x) {
      %1:f32[2] = relu(%0)
      return %1
    }
    graph(%0:f32[2] x) {
      %1:f32[2] = relu(%0)
      return %1
    }
    """
    cfg = config.get()
    checks = cfg.checks if verify_each is None else verify_each
    show = cfg.debug >= 1 if print_each is None else print_each
    for round_ in range(1, max_rounds + 1):
        start = graph
        for p in passes:
            new = p(graph)
            if show:
                print(f"-- {_name(p)} (round {round_}):" + (" unchanged" if new is graph else ""))
                if new is not graph:
                    print(new)
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
    passes: Sequence[str | Pass] = ("cse", "fold", "fuse", "dce"),
    max_rounds: int = SIMPLIFY_ROUNDS,
) -> Graph:
    """Runs the simplifying passes until a fixpoint (at most ``max_rounds`` rounds).

    Args:
        graph: the graph.
        passes: pass names (:data:`PASSES`) or functions, in order.
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
    resolved = []
    for p in passes:
        if isinstance(p, str):
            if p not in PASSES:
                close = difflib.get_close_matches(p, PASSES, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise GraphError(
                    f"simplify: unknown pass {p!r}{hint}; known passes are {sorted(PASSES)}, "
                    "or pass a function Graph -> Graph"
                )
            p = PASSES[p]
        resolved.append(p)
    return run_passes(graph, tuple(resolved), max_rounds=max_rounds)
