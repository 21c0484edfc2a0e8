"""Roles of parameters in a graph, found from its structure: which weight of an MLP is
its first dense and which its second, which project attention's queries, keys and
values and which joins the heads, which are embedding tables.

A *dense* is a ``gemm`` whose second operand is a parameter (through a precision cast
at most); its weight ``[out, in]`` (``transpose_b=True``, fnnc's ``Dense``) or
``[in, out]`` has an output-feature axis and an input-feature axis. Roles:

========== ================================================ ==================
role       found as                                         split axis
========== ================================================ ==================
column     a dense whose output reaches another dense's     output features
           data operand through elementwise commands only   (and its bias)
           (MLP: ``fc1 -> relu -> fc2``; SwiGLU's gate, up)
row        that second dense                                input features
heads      a dense projecting attention's q, k or v         output features
           (through reshapes and elementwise commands)      (and its bias)
heads_out  the dense after attention (or its fused weights) input features
vocab      an ``embedding`` table, ``index_select``'s table vocabulary (rows)
========== ================================================ ==================

Blocks run by a ``scan`` or ``pipeline`` node (:class:`~fnnc.models.Repeat`) take
their parameters stacked ``[n, *shape]``: the roles are found inside the block body,
where each stacked parameter is one slice input, and the stacked parameter gets its
slice's role one axis further on (an MLP's first dense ``[n, out, in]``: ``column``
on axis 1), so a layout splits every block alike and leaves the block axis free (for
pipeline stages). A loop constant keeps its role's axis.

Per-command finders live in :data:`ROLE_FINDERS` (a rule table; a command without one
gives no role). Anything without a role is replicated by the Megatron table
(:mod:`fnnc.graph.sharding_rules`). Roles say nothing about correctness: any layout
computes the same values under XLA's SPMD partitioner; they pick the layout with one
all-reduce per MLP and per attention block (Megatron-LM, Shoeybi et al. 2019).

>>> from fnnc import ops
>>> from fnnc.graph import GraphBuilder, find_roles
>>> b = GraphBuilder()
>>> x = b.input((4, 8), name="x")
>>> w1, w2 = b.input((16, 8), name="w1"), b.input((8, 16), name="w2")
>>> h = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w1))
>>> g = b.build([b.exec(ops.gemm(transpose_b=True), h, w2)])
>>> {g.symbols[s].name: (r.name, r.dim) for s, r in find_roles(g).items()}
{'w1': ('column', 0), 'w2': ('row', 1)}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from fnnc.core.ir import Graph, Node

# Commands a weight passes through on its way to a gemm (precision casts, constraints)
# and that an activation keeps its feature axes through on its way between layers.
CASTS = frozenset({"datatype_conversion", "sharding_constraint"})
RESHAPES = frozenset({"reshape"})
DEPTH = 12  # how far a walk between a projection and attention looks


@dataclasses.dataclass(frozen=True)
class Role:
    """What a parameter is in its layer.

    Attributes:
        name: ``"column"``, ``"row"``, ``"heads"``, ``"heads_out"`` or ``"vocab"``.
        dim: the parameter axis the role splits.
    """

    name: str
    dim: int


@dataclasses.dataclass(frozen=True)
class Dense:
    """A gemm with a parameter weight: its node, weight and bias ids, feature axes."""

    node: Node
    weight: int
    bias: int | None
    out_dim: int
    in_dim: int


class Walk:
    """Producers, consumers and the parameters of one graph, for the finders."""

    def __init__(self, graph: Graph, params: Iterable[int]):
        self.graph = graph
        self.params = frozenset(params)
        self.producer = {o: node for node in graph.nodes for o in node.outputs}
        self.users: dict[int, list[Node]] = {}
        for node in graph.nodes:
            for s in node.inputs:
                self.users.setdefault(s, []).append(node)

    def param(self, sid: int) -> int | None:
        """The parameter ``sid`` is (through casts), or ``None``."""
        for _ in range(DEPTH):
            if sid in self.params:
                return sid
            node = self.producer.get(sid)
            if node is None or node.cmd.name not in CASTS:
                return None
            sid = node.inputs[0]
        return None

    def dense(self, node: Node) -> Dense | None:
        """``node`` as a :class:`Dense`, or ``None`` if it is not one."""
        if node.cmd.name != "gemm" or len(node.inputs) < 2 or node.cmd.param("transpose_a"):
            return None
        w = self.param(node.inputs[1])
        if w is None or len(self.graph.symbols[w].shape) != 2:
            return None
        bias = self.param(node.inputs[2]) if len(node.inputs) > 2 else None
        out_dim = 0 if node.cmd.param("transpose_b") else 1
        return Dense(node, w, bias, out_dim, 1 - out_dim)

    def passes_through(self, node: Node, reshape: bool) -> bool:
        """Whether ``node`` carries an activation's features unchanged in meaning."""
        name = node.cmd.name
        return (
            node.cmd.definition.attributes.elementwise
            or name in CASTS
            or (reshape and name in RESHAPES)
        )

    def denses_after(self, sid: int, reshape: bool) -> list[Dense]:
        """Denses that take ``sid`` (through pass-through nodes) as their data operand."""
        found, todo, seen = [], [(sid, 0)], set()
        while todo:
            s, depth = todo.pop(0)
            for user in self.users.get(s, []):
                dense = self.dense(user)
                if dense is not None and user.inputs[0] == s:
                    found.append(dense)
                elif depth < DEPTH and self.passes_through(user, reshape) and id(user) not in seen:
                    seen.add(id(user))
                    todo += [(o, depth + 1) for o in user.outputs]
        return found

    def dense_before(self, sid: int) -> Dense | None:
        """The dense ``sid`` comes from through reshapes and elementwise commands."""
        for _ in range(DEPTH):
            node = self.producer.get(sid)
            if node is None:
                return None
            dense = self.dense(node)
            if dense is not None:
                return dense
            if not self.passes_through(node, reshape=True):
                return None
            sid = node.inputs[0]
        return None


def _split(dense: Dense, role: str, bias: bool) -> dict[int, Role]:
    """``dense``'s weight split by output features (``bias``: its bias too) for
    ``role``, or by input features (bias whole)."""
    if bias:
        out = {dense.weight: Role(role, dense.out_dim)}
        return out | ({dense.bias: Role(role, 0)} if dense.bias is not None else {})
    return {dense.weight: Role(role, dense.in_dim)}


def _attention_roles(walk: Walk, node: Node) -> dict[int, Role]:
    roles: dict[int, Role] = {}
    for sid in node.inputs[:3]:  # q, k, v
        dense = walk.dense_before(sid)
        if dense is not None:
            roles |= _split(dense, "heads", bias=True)
    fused = walk.param(node.inputs[4]) if len(node.inputs) > 4 else None
    if fused is not None:  # weights [E, H * Dv]: the joined heads are its input axis
        return roles | {fused: Role("heads_out", 1)}
    for dense in walk.denses_after(node.outputs[0], reshape=True):
        roles |= _split(dense, "heads_out", bias=False)
    return roles


def _table_roles(axis_of: Callable[[Node], int]) -> Callable[[Walk, Node], dict[int, Role]]:
    def roles(walk: Walk, node: Node) -> dict[int, Role]:
        table = walk.param(node.inputs[0])
        return {} if table is None else {table: Role("vocab", axis_of(node))}

    return roles


def _stacked_roles(walk: Walk, node: Node) -> dict[int, Role]:
    """Roles of a loop's parameters, found on its block body: a stacked input ``[n,
    *slice]`` gets its slice's role shifted past the block axis."""
    body: Graph = node.cmd.param("forward")
    n_carry, n_stacked = node.cmd.param("n_carry"), node.cmd.param("n_stacked")
    inner = find_roles(body, body.inputs[n_carry:])
    roles: dict[int, Role] = {}
    for k, (outer, sid) in enumerate(zip(node.inputs[n_carry:], body.inputs[n_carry:])):
        param, role = walk.param(outer), inner.get(sid)
        if param is not None and role is not None:
            roles[param] = Role(role.name, role.dim + (k < n_stacked))
    return roles


RoleFinder = Callable[[Walk, Node], dict[int, Role]]
ROLE_FINDERS: dict[str, RoleFinder] = {
    "scaled_dot_product_attention": _attention_roles,
    "scan": _stacked_roles,
    "pipeline": _stacked_roles,
    "embedding": _table_roles(lambda node: 0),
    "index_select": _table_roles(lambda node: int(node.cmd.param("axis") or 0)),
}
"""Per-command role finders: ``finder(walk, node) -> {parameter id: Role}``."""


def find_roles(graph: Graph, parameters: Iterable[int] | None = None) -> dict[int, Role]:
    """The :class:`Role` of each parameter of ``graph`` that has one (see module doc).

    Args:
        graph: a forward graph (or a training step: only forward gemms read weights as
            their second operand).
        parameters: the ids of the parameter inputs; default every input.

    Returns:
        Parameter symbol id -> role, in graph order; parameters without a role are
        absent. The first role found for a parameter stays.
    """
    walk = Walk(graph, graph.inputs if parameters is None else parameters)
    roles: dict[int, Role] = {}
    for node in graph.nodes:
        finder = ROLE_FINDERS.get(node.cmd.name)
        if finder is not None:
            for sid, role in finder(walk, node).items():
                roles.setdefault(sid, role)
    for node in graph.nodes:  # MLPs: pairs of denses joined by elementwise commands
        first = walk.dense(node)
        if first is None or first.weight in roles:
            continue
        width = graph.symbols[first.weight].shape[first.out_dim]
        for second in walk.denses_after(node.outputs[0], reshape=False):
            taken = roles.get(second.weight)
            fits = graph.symbols[second.weight].shape[second.in_dim] == width
            if fits and (taken is None or taken.name == "row"):
                roles |= _split(first, "column", bias=True)
                roles.setdefault(second.weight, Role("row", second.in_dim))
    return dict(sorted(roles.items(), key=lambda kv: list(graph.inputs).index(kv[0])))
