"""Rules: a pattern and a replacement; :func:`graph_rewrite` runs a list of them to a fixpoint.

A :class:`Rule` pairs a :class:`~fnnc.graph.pattern.Pat` with a replacement
``replace(m) -> symbol | tuple | None`` that builds the new computation with
``m.exec(cmd, *inputs)`` from the captured symbols ``m["x"]`` (``None``: leave this
match alone). Swapping relu for leaky relu:

>>> import numpy as np
>>> from fnnc import ops
>>> from fnnc.graph import GraphBuilder, Pat, Rule, graph_rewrite, interpret
>>> leaky = Rule(
...     Pat.op("relu", Pat.var("x")),
...     lambda m: m.exec(ops.leaky_relu(negative_slope=0.1), m["x"]),
... )
>>> b = GraphBuilder()
>>> x = b.input((2,), name="x")
>>> g = graph_rewrite(b.build([b.exec(ops.relu(), x, name="act")]), [leaky])
>>> print(g)
graph(%0:f32[2] x) {
  %1:f32[2] = leaky_relu[negative_slope=0.1](%0)  # act
  return %1
}
>>> interpret(g, np.float32([-1.0, 2.0]))
Array([-0.1,  2. ], dtype=float32)

How :func:`graph_rewrite` runs: one walk over the nodes in order. At each node the
rules whose pattern can end at its command are tried in list order; the first
replacement that returns something replaces the node: its new nodes go where the node
was, each visited in turn (so rules apply to them too), and every later reader of the
node's outputs, the graph outputs and views of them read the replacement. Patterns
look only upstream, at nodes already final, so one walk reaches the fixpoint. A fresh
replacement output takes the replaced output's symbol (its id and name stay), and new
nodes are named as the replaced node. Nodes that write views are never replaced.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fnnc.core.command import output_specs
from fnnc.core.ir import AliasSymbol, Graph, Node, Symbol, TensorSymbol, require_graph
from fnnc.core.text import format_graph
from fnnc.errors import CommandError, FnncError, GraphError
from fnnc.graph.matching import Match, constant_value, matches, may_match
from fnnc.graph.passes._loops import LOOPS, map_loop_blocks
from fnnc.graph.passes._subgraphs import map_subgraphs
from fnnc.graph.passes.compact import compact
from fnnc.graph.passes.dce import dce as dce_pass
from fnnc.graph.pattern import Pat
from fnnc.ops import Command

MAX_DEPTH = 32
"""Most nested rewrites of one node's replacements before a rule is called cyclic."""

Replace = Callable[[Match], Symbol | Sequence[Symbol] | None]


@dataclasses.dataclass(frozen=True, eq=False)
class Rule:
    """A rewrite: where ``pattern`` matches (and ``where(m)`` holds), ``replace(m)``
    computes the root's outputs.

    Attributes:
        pattern: an op pattern (:meth:`Pat.op`); its root is the node replaced.
        replace: ``replace(m)`` returns the symbol (tuple: one per root output) the
            root's outputs become, built with ``m.exec``, or ``None`` for no change
            (as is the root's own outputs).
        where: an extra condition on the match.
        name: shown in errors and debug listings; default the replacement's name.
    """

    pattern: Pat
    replace: Replace
    where: Callable[[Match], bool] | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, Pat) or self.pattern.kind != "op":
            raise GraphError(
                f"Rule {self.label}: the pattern must be an op pattern (Pat.op(...)), the "
                f"node it matches is the one replaced; got {self.pattern!r}"
            )

    @property
    def label(self) -> str:
        return self.name or getattr(self.replace, "__name__", "rule")


def graph_rewrite(
    graph: Graph,
    rules: Sequence[Rule],
    *,
    dce: bool = True,
    subgraphs: bool = True,
    loops: bool = True,
) -> Graph:
    """Applies ``rules`` until none matches (see the module doc for the order).

    Args:
        graph: the graph.
        rules: rules, tried in order at each node (one :class:`Rule` alone is a list of one).
        dce: drop nodes left without readers (the matched nodes the replacement no
            longer needs); otherwise only replaced nodes go.
        subgraphs: rewrite inside sub-graphs held by commands too.
        loops: with ``subgraphs``, where the rules change the block of a ``scan`` or
            ``pipeline`` node, derive its backward body again from the new block (as
            at build), so its gradient is the rewritten block's; ``False`` rewrites
            the forward and backward bodies on their own, which is right only for
            rules that keep values (``fold``'s). A graph that already holds such a
            loop's gradient is refused where the rewrite changes the loop's tape.

    Returns:
        ``graph`` itself when no rule fired; else the rewritten graph, compacted.

    Raises:
        GraphError: ``rules`` holds something other than a :class:`Rule`, a
            replacement's outputs do not have the replaced outputs' specs, or a rule
            keeps matching its own replacement.
    """
    require_graph(graph, "graph_rewrite")
    rules = _as_rules(rules, "graph_rewrite")
    if subgraphs:

        def inner(sub: Graph) -> Graph:
            return graph_rewrite(sub, rules, dce=dce, subgraphs=True, loops=loops)

        if loops:
            blocks = map_loop_blocks(graph, inner, f"graph_rewrite({_labels(rules)})")
            graph = graph if blocks is graph else compact(blocks)
        # loops' bodies are map_loop_blocks's alone (in their nodes and in the `of` of
        # their gradient nodes): the rules run again over the backward body it just
        # derived would rewrite the gradient's own sums as if they were the block's
        graph = map_subgraphs(graph, inner, skip=LOOPS if loops else ())
    walk = _Walk(graph, tuple(rules))
    for node in graph.nodes:
        walk.visit(node, 0)
    if not walk.changed:
        return graph
    new = walk.result()
    return compact(dce_pass(new) if dce else new)


def rewrite_pass(*rules: Rule, name: str = "rewrite", dce: bool = True) -> Callable[[Graph], Graph]:
    """A pass ``Graph -> Graph`` running ``rules`` with :func:`graph_rewrite`, named
    ``name`` (what :func:`~fnnc.graph.run_passes` blames and prints); the rules may
    also come as one list, as :func:`graph_rewrite` takes them."""
    rules = _as_rules(rules[0] if len(rules) == 1 else rules, f"rewrite_pass({name!r})")

    def run(graph: Graph) -> Graph:
        return graph_rewrite(graph, rules, dce=dce)

    run.__name__ = run.__qualname__ = name
    run.rules = rules  # type: ignore[attr-defined]
    return run


class _Walk:
    """The rewritten graph as it grows: a :class:`~fnnc.graph.pattern.Source` whose
    producers are the nodes already emitted, and the emitter of replacements."""

    def __init__(self, graph: Graph, rules: tuple[Rule, ...]):
        self.graph = graph
        self.rules = rules
        self.symbols: list[Symbol] = list(graph.symbols)
        self._inputs = frozenset(graph.inputs)
        self.views: dict[int, list[int]] = {}
        for s in graph.symbols:
            if isinstance(s, AliasSymbol):
                self.views.setdefault(s.root, []).append(s.id)
        self.same: dict[int, int] = {}
        self.writer: dict[int, Node] = {}
        self.nodes: list[Node] = []
        self.changed = False
        self._by_cmd: dict[str, tuple[Rule, ...]] = {}
        self._pending: list[Node] | None = None
        self._root: Node | None = None
        self._rule: Rule | None = None

    # -- Source -------------------------------------------------------------------
    def symbol(self, sid: int) -> Symbol:
        return self.symbols[sid]

    def producer(self, sid: int) -> Node | None:
        return None if self.symbols[sid].is_alias else self.writer.get(sid)

    def value(self, sid: int) -> np.ndarray | None:
        return constant_value(self, sid)

    def is_input(self, sid: int) -> bool:
        return sid in self._inputs

    # -- the walk -----------------------------------------------------------------
    def _rules_for(self, name: str) -> tuple[Rule, ...]:
        found = self._by_cmd.get(name)
        if found is None:
            found = tuple(r for r in self.rules if may_match(r.pattern, name))
            self._by_cmd[name] = found
        return found

    def _resolve(self, sid: int) -> int:
        while sid in self.same:
            sid = self.same[sid]
        return sid

    def visit(self, node: Node, depth: int) -> None:
        if self.same:
            inputs = tuple(self._resolve(s) for s in node.inputs)
            if inputs != node.inputs:
                node = dataclasses.replace(node, inputs=inputs)
        rules = self._rules_for(node.cmd.name)
        if rules and node.outputs and not any(self.symbols[o].is_alias for o in node.outputs):
            for o in node.outputs:
                self.writer[o] = node
            for rule in rules:
                if self._apply(rule, node, depth):
                    return
        self.nodes.append(node)
        for o in node.outputs:
            if not self.symbols[o].is_alias:
                self.writer[o] = node

    def _apply(self, rule: Rule, node: Node, depth: int) -> bool:
        for m in matches(rule.pattern, self, node.outputs[0]):
            if rule.where is not None and not rule.where(m):
                continue
            start = len(self.symbols)
            self._pending, self._root, self._rule = [], node, rule
            try:
                result = rule.replace(m)
            finally:
                pending, self._pending = self._pending, None
            outs = _as_ids(result)
            if outs is not None and outs == node.outputs:
                outs = None  # the root's own outputs: the node is left as it is
            elif outs is not None and set(outs) & set(node.outputs):
                raise GraphError(
                    f"rule {rule.label}: the replacement of node {node.cmd.name} returns "
                    "some of that node's own outputs, which go with it; return new symbols "
                    "(m.exec(...)) or captured ones, or None to leave the node alone"
                )
            if outs is None or not self._fits(rule, node, outs):
                del self.symbols[start:]
                continue
            if depth >= MAX_DEPTH:
                raise GraphError(
                    f"rule {rule.label}: its replacements keep matching rules ({MAX_DEPTH} "
                    f"nested rewrites at node {node.cmd.name}); make the replacement not "
                    "match a pattern again"
                )
            self._replace(node, outs, pending, start, depth)
            return True
        return False

    def _fits(self, rule: Rule, node: Node, outs: tuple[int, ...]) -> bool:
        if len(outs) != len(node.outputs):
            raise GraphError(
                f"rule {rule.label}: the replacement gave {len(outs)} symbol(s) for node "
                f"{node.cmd.name} with {len(node.outputs)} output(s)"
            )
        for o, n in zip(node.outputs, outs):
            old, new = self.symbols[o], self.symbols[n]
            if old.shape != new.shape or np.dtype(old.dtype) != np.dtype(new.dtype):
                listing = format_graph(self.graph, mark=self.graph.nodes.index(node), window=3) \
                    if node in self.graph.nodes else ""  # fmt: skip
                raise GraphError(
                    f"rule {rule.label}: the replacement of node {node.cmd.name} "
                    f"({self.graph.label(o) if o < len(self.graph.symbols) else o}) is "
                    f"{_spec(new)}, the output it replaces is {_spec(old)}; a replacement "
                    f"keeps the outputs' shapes and dtypes (return None to skip)\n{listing}"
                )
            if o in self.views and new.is_alias:
                return False  # views of o cannot be re-rooted onto a view
        return True

    def _replace(
        self, node: Node, outs: tuple[int, ...], pending: list[Node], start: int, depth: int
    ) -> None:
        self.changed = True
        for o in node.outputs:
            self.writer.pop(o, None)
        rename: dict[int, int] = {}
        for o, n in zip(node.outputs, outs):
            if n >= start and n not in rename and not self.symbols[n].is_alias:
                rename[n] = o
            else:
                n = rename.get(n, n)  # a fresh symbol given for two outputs: the first's id
                self.same[o] = n
                for a in self.views.pop(o, ()):
                    self.symbols[a] = dataclasses.replace(self.symbols[a], root=n)
                    self.views.setdefault(n, []).append(a)
        while len(self.symbols) - 1 in rename:  # renamed fresh symbols are unused
            self.symbols.pop()
        for p in pending:
            if rename:
                p = dataclasses.replace(
                    p,
                    inputs=tuple(rename.get(s, s) for s in p.inputs),
                    outputs=tuple(rename.get(s, s) for s in p.outputs),
                )
            self.visit(p, depth + 1)

    def exec(self, cmd: Command, *inputs: Any, name: str = "") -> Any:
        if self._pending is None or self._rule is None or self._root is None:
            raise GraphError("Match.exec: nodes are added only inside a rule's replacement")
        where = f"rule {self._rule.label}: replacement node {getattr(cmd, 'name', cmd)}"
        if not isinstance(cmd, Command):
            raise CommandError(f"{where}: expected a Command (e.g. ops.relu()), got {cmd!r}")
        ids = tuple(_id(x, where) for x in inputs)
        try:
            specs = output_specs(cmd, [self.symbols[i].spec for i in ids])
        except FnncError as e:
            raise type(e)(f"{where}: {e}") from None
        outs = []
        for spec in specs:
            sym = TensorSymbol(len(self.symbols), tuple(spec.shape), np.dtype(spec.dtype))
            self.symbols.append(sym)
            outs.append(sym)
        self._pending.append(Node(cmd, ids, tuple(s.id for s in outs), name or self._root.name))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def result(self) -> Graph:
        g = self.graph
        outputs = tuple(self._resolve(s) for s in g.outputs)
        nodes = tuple(self.nodes)
        return Graph(tuple(self.symbols), nodes, g.inputs, outputs, g.out_tree, g.in_paths)


def _as_rules(rules: Any, where: str) -> tuple[Rule, ...]:
    """``rules`` as a tuple of :class:`Rule`, or a GraphError naming what is not one."""
    if isinstance(rules, Rule):
        return (rules,)
    if not isinstance(rules, Sequence) or isinstance(rules, str):
        raise GraphError(f"{where}: rules are a list of Rule, got {type(rules).__name__}")
    for i, r in enumerate(rules):
        if not isinstance(r, Rule):
            raise GraphError(
                f"{where}: rules[{i}] is {type(r).__name__} {r!r}, not a Rule; build one "
                f"with Rule(Pat.op(...), replace)"
            )
    return tuple(rules)


def _labels(rules: Sequence[Rule]) -> str:
    names = [r.label for r in rules]
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def _id(x: Any, where: str) -> int:
    if isinstance(x, (TensorSymbol, AliasSymbol)):
        return x.id
    raise CommandError(f"{where}: inputs are symbols (m['x'], m.exec(...)), got {x!r}")


def _as_ids(result: Any) -> tuple[int, ...] | None:
    if result is None:
        return None
    items = result if isinstance(result, (tuple, list)) else (result,)
    return tuple(_id(s, "replacement result") for s in items)


def _spec(sym: Symbol) -> str:
    return f"{np.dtype(sym.dtype).name}{list(sym.shape)}"
