"""fold: constant folding and algebraic identities."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from fnnc.core.command import Spec, output_specs
from fnnc.core.dispatch import REFERENCE, compiled_forward
from fnnc.core.ir import AliasSymbol, Graph, Node, num_elements
from fnnc.graph.passes._subgraphs import is_pure, map_subgraphs
from fnnc.graph.passes.compact import compact
from fnnc.ops import Command
from fnnc.ops.constant import Literal, constant

MAX_ELEMENTS = 1024
"""Default size limit of a folded result: larger ones stay computed, not stored."""


class Facts:
    """What an identity rule may ask about a symbol: its spec and, if known, its value."""

    def __init__(self, graph: Graph, values: dict[int, np.ndarray], same: dict[int, int]):
        self._graph = graph
        self._values = values
        self._same = same  # dropped result -> the symbol it equals (views follow it)

    def spec(self, sid: int) -> Spec:
        return self._graph.spec(sid)

    def is_view(self, sid: int) -> bool:
        return self._graph.symbol(sid).is_alias

    def value(self, sid: int) -> np.ndarray | None:
        """The value of ``sid`` when a ``constant`` node (or a folded one) wrote it whole.

        A view of a result an identity dropped is a view of its replacement (the pass
        re-roots it there), so its value is looked up there, in the same run.
        """
        sym = self._graph.symbol(sid)
        root = self._values.get(self._same.get(sym.root, sym.root))
        if root is None or not isinstance(sym, AliasSymbol):
            return root
        return root.reshape(-1)[sym.flat_indices()]

    def is_all(self, sid: int, x: float) -> bool:
        value = self.value(sid)
        return value is not None and bool(np.all(value == x))


Rewrite = int | tuple[Command, tuple[int, ...]] | None
"""What a rule returns: the symbol the output equals, a cheaper node, or no change."""

Rule = Callable[[Command, tuple[int, ...], Facts], Rewrite]


def _input0(cmd: Command, ins: tuple[int, ...], facts: Facts) -> Rewrite:
    # For commands that are the identity exactly when their output spec equals their
    # input's (reshape, broadcast_to, slice, pad, ...): the driver checks the specs.
    return ins[0]


def _without(unit: float) -> Rule:
    """n-ary ``ewsum`` / ``ewprod``: drop operands that are all ``unit`` (0 or 1)."""

    def rule(cmd: Command, ins: tuple[int, ...], facts: Facts) -> Rewrite:
        if len(ins) == 1:
            return ins[0]
        rest = tuple(s for s in ins if not facts.is_all(s, unit))
        if len(rest) == len(ins) or not rest:
            return None
        return rest[0] if len(rest) == 1 else (cmd, rest)

    return rule


def _when(param: str, want: object) -> Rule:
    """Input 0 when hyper-parameter ``param`` has the neutral value ``want``."""
    return lambda cmd, ins, facts: ins[0] if cmd.param(param) == want else None


def _mul(cmd: Command, ins: tuple[int, ...], facts: Facts) -> Rewrite:
    a, b = ins
    if cmd.param("p") != 1.0:
        return None
    return a if facts.is_all(b, 1) else b if facts.is_all(a, 1) else None


def _add(cmd: Command, ins: tuple[int, ...], facts: Facts) -> Rewrite:
    a, b = ins
    if cmd.param("p") == 1.0 and facts.is_all(b, 0):
        return a  # x + 0 and x - 0 (any q)
    if cmd.param("q") == 1.0 and facts.is_all(a, 0):
        return b
    return None


def _ewdiv(cmd: Command, ins: tuple[int, ...], facts: Facts) -> Rewrite:
    return ins[0] if facts.is_all(ins[1], 1) else None


def _select(cmd: Command, ins: tuple[int, ...], facts: Facts) -> Rewrite:
    cond, a, b = ins
    return a if facts.is_all(cond, True) else b if facts.is_all(cond, False) else None


def _idempotent(cmd: Command, ins: tuple[int, ...], facts: Facts) -> Rewrite:
    return ins[0] if ins[0] == ins[1] else None


def _transpose(cmd: Command, ins: tuple[int, ...], facts: Facts) -> Rewrite:
    perm = tuple(cmd.param("perm"))
    return ins[0] if perm == tuple(range(len(perm))) else None


def _format_transform(cmd: Command, ins: tuple[int, ...], facts: Facts) -> Rewrite:
    return ins[0] if cmd.param("src") == cmd.param("dst") else None


def _clamp(cmd: Command, ins: tuple[int, ...], facts: Facts) -> Rewrite:
    return ins[0] if cmd.param("min") is None and cmd.param("max") is None else None


def _rule_of(cmd: Command) -> Rule:
    """The identity rule of ``cmd``: its table entry, else ``f(x, x) = x`` for commands
    with the ``idempotent`` attribute, else none."""
    rule = IDENTITIES.get(cmd.name)
    if rule is not None:
        return rule
    return _idempotent if cmd.definition.attributes.idempotent else _no_rule


IDENTITIES: dict[str, Rule] = {
    "add": _add,
    "broadcast_to": _input0,
    "clamp": _clamp,
    "concat": _input0,
    "data_transfer": _input0,
    "datatype_conversion": _input0,
    "ewdiv": _ewdiv,
    "ewprod": _without(1),
    "ewsum": _without(0),
    "format_transform": _format_transform,
    "mul": _mul,
    "pad": _input0,
    "reshape": _input0,
    "scalar_mul": _when("a", 1.0),
    "select": _select,
    "slice": _input0,
    "transpose": _transpose,
}
"""Per command, an algebraic identity. A rewrite is taken only when the result keeps the
node's output spec exactly (shape and dtype), so a broadcasting ``x * 1`` stays."""


def _no_rule(cmd: Command, ins: tuple[int, ...], facts: Facts) -> Rewrite:
    return None


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
    graph = map_subgraphs(graph, lambda sub: fold(sub, max_elements=max_elements))
    symbols = graph.symbols
    viewed = {s.root for s in symbols if isinstance(s, AliasSymbol)}
    values: dict[int, np.ndarray] = {}  # root id -> value, for tensors constants wrote
    same: dict[int, int] = {}
    facts = Facts(graph, values, same)
    nodes: list[Node] = []
    for node in graph.nodes:
        inputs = tuple(same.get(s, s) for s in node.inputs)
        if inputs != node.inputs:
            node = dataclasses.replace(node, inputs=inputs)
        if not is_pure(node.cmd) or any(symbols[s].is_alias for s in node.outputs):
            nodes.append(node)
            continue
        node, equal = _simplified(node, facts, viewed)
        if equal is not None:
            same[node.outputs[0]] = equal
            continue
        nodes.extend(_folded(node, facts, values, max_elements))
    outputs = tuple(same.get(s, s) for s in graph.outputs)
    unchanged = len(nodes) == len(graph.nodes) and outputs == graph.outputs
    if unchanged and all(new is old for new, old in zip(nodes, graph.nodes)):
        return graph
    symbols = tuple(
        dataclasses.replace(s, root=same[s.root])
        if isinstance(s, AliasSymbol) and s.root in same
        else s
        for s in symbols
    )
    return compact(dataclasses.replace(graph, symbols=symbols, nodes=tuple(nodes), outputs=outputs))


def _same_spec(a: Spec, b: Spec) -> bool:
    return tuple(a.shape) == tuple(b.shape) and np.dtype(a.dtype) == np.dtype(b.dtype)


def _simplified(node: Node, facts: Facts, viewed: set[int]) -> tuple[Node, int | None]:
    """Applies identities to ``node`` until none fits: the node, or the symbol it equals."""
    if len(node.outputs) != 1:
        return node, None
    out = facts.spec(node.outputs[0])
    for _ in range(8):  # each rewrite drops an operand or the node, so few are needed
        rewrite = _rule_of(node.cmd)(node.cmd, node.inputs, facts)
        if isinstance(rewrite, int):
            # Views of the output are re-rooted onto the replacement: it must be a tensor.
            plain = node.outputs[0] not in viewed or not facts.is_view(rewrite)
            ok = plain and _same_spec(facts.spec(rewrite), out)
            return node, (rewrite if ok else None)
        if rewrite is None:
            break
        cmd, inputs = rewrite
        specs = output_specs(cmd, [facts.spec(s) for s in inputs])
        if len(specs) != 1 or not _same_spec(specs[0], out):
            break
        node = dataclasses.replace(node, cmd=cmd, inputs=inputs)
    return node, None


def _folded(
    node: Node, facts: Facts, values: dict[int, np.ndarray], max_elements: int
) -> list[Node]:
    """``node`` as ``constant`` nodes when its inputs are known and its outputs small."""
    if node.cmd.name == constant.definition.name:
        values[node.outputs[0]] = node.cmd.param("value").numpy()
        return [node]
    args = [facts.value(s) for s in node.inputs]
    too_big = any(num_elements(facts.spec(s).shape) > max_elements for s in node.outputs)
    if too_big or any(a is None for a in args):
        return [node]
    outs = compiled_forward(node.cmd, REFERENCE)(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    folded = []
    for sid, value in zip(node.outputs, outs):
        values[sid] = np.asarray(value)
        folded.append(Node(constant(Literal.of(values[sid])), (), (sid,), node.name))
    return folded
