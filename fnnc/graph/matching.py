"""Matching a :class:`~fnnc.graph.pattern.Pat` against a graph: captures, alternatives.

:func:`matches` yields every way a pattern fits at a node (the input orders of a
commutative node, the choices of :meth:`~fnnc.graph.pattern.Pat.any_of`), each a
:class:`Match`: the captured symbols by name, the root node, and, inside a rule's
replacement, the emitter of new nodes (``m.exec``). Matching reads a :class:`Source`:
a frozen graph (:class:`GraphSource`), or the live state of a rewrite.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from fnnc.core.dtypes import is_floating
from fnnc.core.ir import AliasSymbol, Graph, Node, Symbol
from fnnc.errors import GraphError
from fnnc.graph.pattern import Pat
from fnnc.ops import Command

MAX_PERMUTED = 4
"""Commutative nodes with more inputs than this match in the given order only."""


class Source(Protocol):
    """What matching reads: a frozen graph, or the live state of a rewrite."""

    def symbol(self, sid: int) -> Symbol: ...

    def producer(self, sid: int) -> Node | None: ...

    def value(self, sid: int) -> np.ndarray | None: ...

    def is_input(self, sid: int) -> bool: ...


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
        if value is not None and (pat.value is None or all_equal(value, pat.value)):
            yield from _bind(pat.name, sid, bound)
    else:
        node = src.producer(sid)
        if node is None or not _command_fits(pat, node.cmd):
            return
        if pat.index is not None and node.outputs.index(sid) != pat.index:
            return
        for b in _inputs(pat, node, src, bound):
            yield from _bind(pat.name, sid, b)


def all_equal(value: np.ndarray, want: Any) -> bool:
    """Whether every element of ``value`` equals ``want`` (broadcast against it); a
    ``want`` of a shape that does not broadcast with ``value`` is not equal (NumPy raised
    ValueError from inside the match)."""
    try:
        return bool(np.all(np.equal(value, want)))
    except (ValueError, TypeError):
        return False


def _bind(name: str | None, sid: int, bound: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if name is None:
        yield bound
    elif name in bound:
        if bound[name] == sid:
            yield bound
    else:
        yield {**bound, name: sid}


def _is_integer(dtype: Any) -> bool:
    return bool(np.issubdtype(dtype, np.integer))


def _fits(pat: Pat, sym: Symbol) -> bool:
    if pat.dtype is not None:
        if isinstance(pat.dtype, str):
            kind = is_floating if pat.dtype == "floating" else _is_integer
            if not kind(sym.dtype):
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
        if callable(want) and not isinstance(want, (type, Command)):  # a Command is a value
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
    return cmd.definition.attributes.holds(attribute, cmd)


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
