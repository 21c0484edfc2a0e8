"""fold: constant folding and algebraic identities, as rules of the rewrite toolkit.

Both are rule lists run by :func:`~fnnc.graph.graph_rewrite` (what users write their
passes with): :data:`IDENTITIES` (``x * 1 -> x``, ...) and constant folding.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from fnnc.core.command import output_specs
from fnnc.core.dispatch import REFERENCE, compiled_forward
from fnnc.core.ir import Graph, Symbol, num_elements, require_graph
from fnnc.core.params import is_count
from fnnc.errors import GraphError
from fnnc.graph.matching import Match
from fnnc.graph.pattern import Pat
from fnnc.graph.rules import Rule, graph_rewrite
from fnnc.ops.constant import Literal, constant

MAX_ELEMENTS = 1024
"""Default size limit of a folded result: larger ones stay computed, not stored."""


X = Pat.var("x")
ONE, ZERO = Pat.const(1), Pat.const(0)


def _keep(name: str = "x") -> Callable[[Match], Symbol | None]:
    """The replacement "the captured symbol", taken only when it keeps the node's output
    spec exactly (so a broadcasting ``x * 1`` stays)."""

    def replace(m: Match) -> Symbol | None:
        return m[name] if _same_spec(m[name], m.source.symbol(m.root.outputs[0])) else None

    replace.__name__ = f"keep_{name}"
    return replace


def _without(unit: float) -> Callable[[Match], Symbol | None]:
    """n-ary ``ewsum`` / ``ewprod``: drop operands that are all ``unit`` (0 or 1)."""

    def replace(m: Match) -> Symbol | None:
        ins = m.rest
        if len(ins) == 1:
            return _keep_symbol(m, ins[0])
        rest = [s for s in ins if not _is_all(m, s.id, unit)]
        if len(rest) == len(ins) or not rest:
            return None
        if len(rest) == 1:
            return _keep_symbol(m, rest[0])
        (spec,) = output_specs(m.root.cmd, [s.spec for s in rest])
        out = m.source.symbol(m.root.outputs[0])
        return m.exec(m.root.cmd, *rest) if _same_spec(spec, out) else None

    replace.__name__ = f"without_{unit:g}"
    return replace


def _keep_symbol(m: Match, sym: Symbol) -> Symbol | None:
    return sym if _same_spec(sym, m.source.symbol(m.root.outputs[0])) else None


def _is_all(m: Match, sid: int, x: float) -> bool:
    value = m.source.value(sid)
    return value is not None and bool(np.all(value == x))


def _param_is(key: str, want: Any) -> Callable[[Match], bool]:
    return lambda m: m.root.cmd.param(key) == want


def _identity_perm(perm: tuple[int, ...]) -> bool:
    return tuple(perm) == tuple(range(len(perm)))


RESHAPING = ("broadcast_to", "concat", "data_transfer", "datatype_conversion", "pad", "reshape")
"""Commands that are the identity exactly when their output spec equals their input's."""

IDENTITIES: tuple[Rule, ...] = (
    Rule(Pat.op("add", X, ZERO, ordered=True, p=1.0), _keep(), name="x+0"),  # x - 0 too
    Rule(Pat.op("add", ZERO, X, ordered=True, q=1.0), _keep(), name="0+x"),
    Rule(Pat.op((*RESHAPING, "slice"), X), _keep(), name="same-shape view"),
    Rule(Pat.op("clamp", X, min=None, max=None), _keep(), name="clamp without bounds"),
    Rule(Pat.op("ewdiv", X, ONE), _keep(), name="x/1"),
    Rule(Pat.op("ewprod", ...), _without(1), name="ewprod without ones"),
    Rule(Pat.op("ewsum", ...), _without(0), name="ewsum without zeros"),
    Rule(
        Pat.op("format_transform", X),
        _keep(),
        where=lambda m: m.root.cmd.param("src") == m.root.cmd.param("dst"),
        name="format_transform to itself",
    ),
    Rule(Pat.op("mul", X, ONE, p=1.0), _keep(), name="x*1"),
    Rule(Pat.op("scalar_mul", X, a=1.0), _keep(), name="1*x"),
    Rule(Pat.op("select", Pat.const(True), X, Pat.var()), _keep(), name="select true"),
    Rule(Pat.op("select", Pat.const(False), Pat.var(), X), _keep(), name="select false"),
    Rule(Pat.op("transpose", X, perm=_identity_perm), _keep(), name="transpose to itself"),
    Rule(Pat.op(None, X, X, attrs=("idempotent",)), _keep(), name="f(x, x) = x"),
)
"""Algebraic identities as rewrite rules (:class:`~fnnc.graph.Rule`): a rewrite is taken
only when the result keeps the node's output spec exactly (shape and dtype), so a
broadcasting ``x * 1`` stays. Commutative commands (``mul``) match in either order."""


def _fold_constants(max_elements: int) -> Rule:
    """A pure node whose inputs are all known constants, and whose outputs are small,
    becomes ``constant`` nodes (values from the command's reference forward)."""

    def replace(m: Match) -> Any:
        node = m.root
        if node.cmd.name == constant.definition.name:
            return None
        specs = [m.source.symbol(s) for s in node.outputs]
        if any(num_elements(s.shape) > max_elements for s in specs):
            return None
        args = [m.source.value(s) for s in node.inputs]
        outs = compiled_forward(node.cmd, REFERENCE)(*args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return tuple(m.exec(constant(Literal.of(np.asarray(v)))) for v in outs)

    return Rule(Pat.op(None, attrs=("pure",), each=Pat.const()), replace, name="fold constants")


@functools.lru_cache(maxsize=8)
def fold_rules(max_elements: int = MAX_ELEMENTS) -> tuple[Rule, ...]:
    """The rules :func:`fold` runs: :data:`IDENTITIES`, then constant folding."""
    return (*IDENTITIES, _fold_constants(max_elements))


def fold(graph: Graph, *, max_elements: int = MAX_ELEMENTS) -> Graph:
    """Constant folding and algebraic identities (:data:`IDENTITIES`).

    Walking the nodes in order:

    * a pure node (not random, no effects) whose inputs are all written by
      ``constant`` nodes (or by nodes folded before it) and whose outputs have at most
      ``max_elements`` elements becomes ``constant`` nodes, with values from the
      command's reference forward (the very computation ``interpret`` runs);
    * a pure single-output node matching an identity (``x * 1``, ``x + 0``,
      ``scalar_mul[a=1]``, a reshape to the same shape, ...) is dropped and its output
      replaced by the input it equals, in later nodes, in the graph outputs and as the
      root of views; or it is replaced by a cheaper node (``ewsum(x, y, 0)`` ->
      ``ewsum(x, y)``).

    Constants left without readers stay; :func:`~fnnc.graph.passes.dce` removes them.
    Sub-graphs are folded too.

    Needs: a verified graph.

    Guarantees: the same graph object when nothing folded; otherwise a compacted graph
    with the same input and output specs whose values equal the original's
    (``x + 0`` may turn ``-0.0`` into ``0.0``). ``fold(fold(g)) is fold(g)``.

    Before / after::

        graph(%0:f32[2] x) {                       graph(%0:f32[2] x) {
          %1:f32[] = constant[value=2.0]()           %1:f32[] = constant[value=2.0]()
          %2:f32[] = constant[value=1.0]()           %2:f32[] = constant[value=1.0]()
          %3:f32[] = ewsum(%1, %2)                   %3:f32[] = constant[value=3.0]()
          %4:f32[2] = mul(%0, %3)                    %4:f32[2] = mul(%0, %3)
          %5:f32[2] = scalar_mul(%4)                 return %4
          return %5                                }
        }

    Args:
        graph: the graph.
        max_elements: largest folded output, in elements.
    """
    require_graph(graph, "fold")
    if not is_count(max_elements, 0):
        raise GraphError(
            f"fold: max_elements is the largest folded output, an int >= 0; got {max_elements!r}"
        )
    # identities keep values: the bodies of a loop are folded on their own
    return graph_rewrite(graph, fold_rules(max_elements), dce=False, loops=False)


def _same_spec(a: Any, b: Any) -> bool:
    return tuple(a.shape) == tuple(b.shape) and np.dtype(a.dtype) == np.dtype(b.dtype)
