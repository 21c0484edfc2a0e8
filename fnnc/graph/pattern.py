"""Patterns over the graph IR: structure, attributes, hyper-parameters, dtypes and shapes.

A :class:`Pat` describes a symbol: what command wrote it (by name, or by command
attribute such as ``elementwise``), with which hyper-parameters, from which inputs
(patterns again), or that it is any symbol, a constant (of a value) or a graph input,
optionally with a dtype, a shape and a predicate. Naming a pattern captures the symbol
it matched; a name used twice must match the same symbol both times. Inputs of a
commutative command (the command's ``commutative`` attribute, e.g. ``mul``, ``ewsum``,
``add`` when ``p == q``) match in any order unless ``ordered=True``.

>>> from fnnc import ops
>>> from fnnc.graph import GraphBuilder
>>> from fnnc.graph.pattern import Pat, match
>>> b = GraphBuilder()
>>> x = b.input((2,), name="x")
>>> y = b.exec(ops.mul(), b.exec(ops.sigmoid(), x), x)
>>> g = b.build([y])
>>> silu = Pat.op("mul", Pat.var("x"), Pat.op("sigmoid", Pat.var("x")))
>>> m = match(silu, g, g.outputs[0])
>>> m["x"].name, m.root.cmd.name
('x', 'mul')

Matching only reads the graph; :mod:`fnnc.graph.rules` turns a pattern and a
replacement into a rewrite.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from fnnc.core.ir import AliasSymbol, Graph, Node, Symbol
from fnnc.errors import GraphError
from fnnc.ops import Command

ATTRIBUTES = ("elementwise", "commutative", "idempotent", "random", "has_effects", "pure")
"""Command attributes a pattern may require (``pure``: neither random nor effectful)."""

MAX_PERMUTED = 4
"""Commutative nodes with more inputs than this match in the given order only."""


class Source(Protocol):
    """What matching reads: a frozen graph, or the live state of a rewrite."""

    def symbol(self, sid: int) -> Symbol: ...

    def producer(self, sid: int) -> Node | None: ...

    def value(self, sid: int) -> np.ndarray | None: ...

    def is_input(self, sid: int) -> bool: ...


@dataclasses.dataclass(frozen=True, eq=False)
class Pat:
    """A pattern for one symbol; build it with :meth:`op`, :meth:`var`, :meth:`const`,
    :meth:`input` or :meth:`any_of`."""

    kind: str
    name: str | None = None
    cmds: frozenset[str] | None = None
    inputs: tuple[Pat, ...] | None = None
    rest: bool = False
    params: tuple[tuple[str, Any], ...] = ()
    attrs: tuple[str, ...] = ()
    ordered: bool = False
    dtype: Any = None
    shape: tuple[int | None, ...] | None = None
    where: Callable[[Symbol], bool] | None = None
    value: Any = None
    choices: tuple[Pat, ...] = ()
    index: int | None = None
    each: Pat | None = None

    @staticmethod
    def op(
        cmd: str | Sequence[str] | None,
        *inputs: Pat | Any,
        name: str | None = None,
        attrs: Sequence[str] = (),
        ordered: bool = False,
        dtype: Any = None,
        shape: Sequence[int | None] | None = None,
        where: Callable[[Symbol], bool] | None = None,
        index: int | None = None,
        each: Pat | None = None,
        **params: Any,
    ) -> Pat:
        """The output of a node running ``cmd`` (a name, several names, or ``None`` for
        any command) on ``inputs``.

        Args:
            cmd: command name(s); ``None`` matches any command (narrow it with ``attrs``).
            *inputs: one pattern per input; a trailing ``...`` lets further inputs be
                anything (``Match.rest`` holds them); no inputs at all means any inputs.
            name: capture the output under this name (``Match.node(name)`` is its node).
            attrs: command attributes that must hold (:data:`ATTRIBUTES`).
            ordered: match inputs in the given order even for a commutative command.
            dtype, shape, where: as for :meth:`var`.
            index: which output of the node the symbol must be (default any).
            each: a pattern every input must match (any number of inputs); instead
                of listing ``inputs``.
            **params: hyper-parameters that must be equal, or predicates
                ``value -> bool`` (``perm=lambda p: p == (1, 0)``).
        """
        for a in attrs:
            if a not in ATTRIBUTES:
                raise GraphError(f"Pat.op: unknown attribute {a!r}; known: {list(ATTRIBUTES)}")
        rest = bool(inputs) and inputs[-1] is Ellipsis
        pats = inputs[:-1] if rest else inputs
        for p in pats:
            if not isinstance(p, Pat):
                raise GraphError(
                    f"Pat.op({cmd!r}): inputs are patterns (Pat.var(), Pat.op(...)) or a "
                    f"trailing ..., got {type(p).__name__} {p!r}"
                )
        cmds = None if cmd is None else frozenset([cmd] if isinstance(cmd, str) else cmd)
        return Pat(
            "op", name, cmds, tuple(pats) if inputs else None, rest, tuple(params.items()),
            tuple(attrs), ordered, _dtype(dtype), _shape(shape), where, index=index,
            each=each,
        )  # fmt: skip

    @staticmethod
    def var(
        name: str | None = None,
        *,
        dtype: Any = None,
        shape: Sequence[int | None] | None = None,
        where: Callable[[Symbol], bool] | None = None,
    ) -> Pat:
        """Any symbol (a node output, a graph input, a view).

        Args:
            name: capture it under this name.
            dtype: a dtype, a tuple of dtypes, or ``"floating"`` / ``"integer"``.
            shape: the exact shape; ``None`` entries match any size.
            where: a predicate on the symbol.
        """
        return Pat("var", name, dtype=_dtype(dtype), shape=_shape(shape), where=where)

    @staticmethod
    def const(
        value: Any = None,
        name: str | None = None,
        *,
        dtype: Any = None,
        shape: Sequence[int | None] | None = None,
    ) -> Pat:
        """A symbol whose value is known: written by a ``constant`` node (or a view of
        one); with ``value``, every element must equal it."""
        return Pat("const", name, dtype=_dtype(dtype), shape=_shape(shape), value=value)

    @staticmethod
    def input(name: str | None = None, *, dtype: Any = None, shape: Any = None) -> Pat:
        """A graph input (data, or a model parameter)."""
        return Pat("input", name, dtype=_dtype(dtype), shape=_shape(shape))

    @staticmethod
    def any_of(*choices: Pat, name: str | None = None) -> Pat:
        """The first of ``choices`` that matches (each may capture names)."""
        return Pat("any_of", name, choices=tuple(choices))


def _dtype(dtype: Any) -> Any:
    if dtype is None or isinstance(dtype, str):
        return dtype
    if isinstance(dtype, tuple):
        return tuple(np.dtype(d) for d in dtype)
    return np.dtype(dtype)


def _shape(shape: Any) -> tuple[int | None, ...] | None:
    return None if shape is None else tuple(shape)


class Match(Mapping[str, Symbol]):
    """A successful match: captured symbols by name, the matched root node.

    Attributes:
        root: the node whose output the pattern matched.
    """

    def __init__(self, source: Source, root: Node, bound: dict[str, int], rest: tuple[int, ...]):
        self.source = source
        self.root = root
        self._bound = bound
        self._rest = rest

    @property
    def rest(self) -> tuple[Symbol, ...]:
        """The root's inputs matched by a trailing ``...``."""
        return tuple(self.source.symbol(s) for s in self._rest)

    def __getitem__(self, name: str) -> Symbol:
        return self.source.symbol(self._bound[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._bound)

    def __len__(self) -> int:
        return len(self._bound)

    def node(self, name: str) -> Node:
        """The node that wrote the symbol captured as ``name`` by an op pattern."""
        node = self.source.producer(self._bound[name])
        if node is None:
            raise GraphError(f"Match.node({name!r}): the captured symbol is not a node output")
        return node

    def value(self, name: str) -> np.ndarray | None:
        """The value of the symbol captured as ``name`` when it is a known constant."""
        return self.source.value(self._bound[name])

    def exec(self, cmd: Command, *inputs: Symbol, name: str = "") -> Any:
        """In a rule's replacement: adds ``cmd(*inputs)`` before the root; returns its
        output symbol (a tuple for several). The node is named as the root unless
        ``name`` is given."""
        emit = getattr(self.source, "exec", None)
        if emit is None:
            raise GraphError("Match.exec: nodes are added only inside a rule's replacement")
        return emit(cmd, *inputs, name=name)

    def call(self, fn: Callable[..., Any], *inputs: Symbol) -> Any:
        """In a rule's replacement: the nodes of ``fn`` (a JAX function, which may call
        fnnc commands), traced on the inputs' shapes, applied to ``inputs``."""
        from fnnc.graph.pattern_functions import call_function

        return call_function(self.exec, fn, inputs)

    def constant(self, value: Any, dtype: Any = None) -> Symbol:
        """In a rule's replacement: a ``constant`` node holding ``value``."""
        from fnnc.ops.constant import constant

        return self.exec(constant(value, dtype))

    def __repr__(self) -> str:
        names = ", ".join(f"{k}=%{v}" for k, v in self._bound.items())
        return f"<Match {self.root.cmd.name}: {names}>"


def match(pat: Pat, source: Source | Graph, sid: int) -> Match | None:
    """The first match of ``pat`` at symbol ``sid`` (an op pattern: at its writer), or None."""
    return next(matches(pat, source, sid), None)


def matches(pat: Pat, source: Source | Graph, sid: int) -> Iterator[Match]:
    """Every match of op pattern ``pat`` at the node writing ``sid`` (alternative input
    orders of commutative nodes, alternatives of :meth:`Pat.any_of`)."""
    if isinstance(source, Graph):
        source = GraphSource(source)
    root = source.producer(sid)
    if root is None:
        return
    for bound in _match(pat, sid, source, {}):
        rest = bound.pop("\0rest", ())
        yield Match(source, root, bound, rest)


def _match(pat: Pat, sid: int, src: Source, bound: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if pat.kind == "any_of":
        for choice in pat.choices:
            for b in _match(choice, sid, src, bound):
                yield from _bind(pat.name, sid, b)
        return
    sym = src.symbol(sid)
    if not _fits(pat, sym):
        return
    if pat.kind == "var":
        yield from _bind(pat.name, sid, bound)
    elif pat.kind == "input":
        if src.is_input(sid):
            yield from _bind(pat.name, sid, bound)
    elif pat.kind == "const":
        value = src.value(sid)
        if value is not None and (pat.value is None or bool(np.all(value == pat.value))):
            yield from _bind(pat.name, sid, bound)
    else:
        node = src.producer(sid)
        if node is None or not _command_fits(pat, node.cmd):
            return
        if pat.index is not None and node.outputs.index(sid) != pat.index:
            return
        for b in _inputs(pat, node, src, bound):
            yield from _bind(pat.name, sid, b)


def _bind(name: str | None, sid: int, bound: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if name is None:
        yield bound
    elif name in bound:
        if bound[name] == sid:
            yield bound
    else:
        yield {**bound, name: sid}


def _fits(pat: Pat, sym: Symbol) -> bool:
    if pat.dtype is not None:
        if isinstance(pat.dtype, str):
            kind = np.floating if pat.dtype == "floating" else np.integer
            if not np.issubdtype(sym.dtype, kind):
                return False
        elif isinstance(pat.dtype, tuple):
            if np.dtype(sym.dtype) not in pat.dtype:
                return False
        elif np.dtype(sym.dtype) != pat.dtype:
            return False
    if pat.shape is not None:
        if len(pat.shape) != len(sym.shape):
            return False
        if any(w is not None and w != n for w, n in zip(pat.shape, sym.shape)):
            return False
    return pat.where is None or bool(pat.where(sym))


def _command_fits(pat: Pat, cmd: Command) -> bool:
    if pat.cmds is not None and cmd.name not in pat.cmds:
        return False
    for key, want in pat.params:
        have = dict(cmd.params).get(key, _MISSING)
        if have is _MISSING:
            return False
        if callable(want) and not isinstance(want, type):
            if not want(have):
                return False
        elif have != want:
            return False
    return all(_has(cmd, a) for a in pat.attrs)


_MISSING = object()

_DEEP = ("pure", "random", "has_effects")
"""Attributes that also look inside a command's sub-graphs."""


@functools.cache
def _deep() -> dict[str, Callable[[Command], bool]]:
    from fnnc.graph.passes._subgraphs import has_effects, is_pure, is_random

    return {"pure": is_pure, "random": is_random, "has_effects": has_effects}


def may_match(pat: Pat, name: str) -> bool:
    """Whether an op pattern can match a node of command ``name`` at all (its names and
    the attributes fixed per command); rule tables use it to index rules by command."""
    if pat.cmds is not None and name not in pat.cmds:
        return False
    from fnnc.ops import lookup

    attrs = lookup(name).attributes
    for a in pat.attrs:
        if a == "pure" and (attrs.random or attrs.has_effects):
            return False
        if a in ("elementwise", "idempotent") and not getattr(attrs, a):
            return False
    return True


def _has(cmd: Command, attribute: str) -> bool:
    if attribute in _DEEP:
        return _deep()[attribute](cmd)
    attrs = cmd.definition.attributes
    if attribute == "commutative":
        return attrs.is_commutative(cmd)
    return bool(getattr(attrs, attribute))


def _inputs(pat: Pat, node: Node, src: Source, bound: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if pat.each is not None:
        yield from _all((pat.each,) * len(node.inputs), node.inputs, src, bound)
        return
    if pat.inputs is None:
        yield bound
        return
    ins, n = node.inputs, len(pat.inputs)
    if len(ins) < n or (len(ins) > n and not pat.rest):
        return
    head, tail = ins[:n], ins[n:]
    orders: Any = (head,)
    permute = not pat.ordered and 1 < n <= MAX_PERMUTED and len(tail) == 0
    if permute and node.cmd.definition.attributes.is_commutative(node.cmd):
        orders = dict.fromkeys(itertools.permutations(head))
    for order in orders:
        for b in _all(pat.inputs, order, src, bound):
            yield {**b, "\0rest": tail} if pat.rest else b


def _all(pats: Sequence[Pat], sids: Sequence[int], src: Source, bound: dict[str, Any]):
    if not pats:
        yield bound
        return
    for b in _match(pats[0], sids[0], src, bound):
        yield from _all(pats[1:], sids[1:], src, b)


class GraphSource:
    """:class:`Source` over a frozen graph: producers are the nodes writing whole tensors."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._inputs = frozenset(graph.inputs)

    def symbol(self, sid: int) -> Symbol:
        return self.graph.symbols[sid]

    def producer(self, sid: int) -> Node | None:
        if self.graph.symbols[sid].is_alias:
            return None
        index = self.graph.producers.get(sid)
        return None if index is None else self.graph.nodes[index]

    def value(self, sid: int) -> np.ndarray | None:
        return constant_value(self, sid)

    def is_input(self, sid: int) -> bool:
        return sid in self._inputs


def constant_value(src: Source, sid: int) -> np.ndarray | None:
    """The value of ``sid`` when a ``constant`` node wrote it (or the tensor it views)."""
    sym = src.symbol(sid)
    root = sym.root if isinstance(sym, AliasSymbol) else sid
    node = src.producer(root)
    if node is None or node.cmd.name != "constant":
        return None
    value = node.cmd.param("value").numpy()
    if isinstance(sym, AliasSymbol):
        return value.reshape(-1)[sym.flat_indices()]
    return value
