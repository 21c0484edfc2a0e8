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
>>> from fnnc.graph.matching import match
>>> from fnnc.graph.pattern import Pat
>>> b = GraphBuilder()
>>> x = b.input((2,), name="x")
>>> y = b.exec(ops.mul(), b.exec(ops.sigmoid(), x), x)
>>> g = b.build([y])
>>> silu = Pat.op("mul", Pat.var("x"), Pat.op("sigmoid", Pat.var("x")))
>>> m = match(silu, g, g.outputs[0])
>>> m["x"].name, m.root.cmd.name
('x', 'mul')

Matching (:mod:`fnnc.graph.matching`) only reads the graph; :mod:`fnnc.graph.rules`
turns a pattern and a replacement into a rewrite.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fnnc.core.ir import Symbol
from fnnc.core.opdef import lookup
from fnnc.errors import GraphError, UnknownCommandError

ATTRIBUTES = ("elementwise", "commutative", "idempotent", "random", "has_effects", "pure")
"""Command attributes a pattern may require (``pure``: neither random nor effectful)."""


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
            cmd: command name(s), each a registered command (a name
                :func:`fnnc.ops.registry` lacks is a :class:`~fnnc.errors.GraphError`);
                ``None`` matches any command (narrow it with ``attrs``).
            *inputs: one pattern per input; a trailing ``...`` lets further inputs be
                anything (``Match.rest`` holds them); no inputs at all means any inputs.
            name: capture the output under this name (``Match.node(name)`` is its node).
            attrs: command attributes that must hold (:data:`ATTRIBUTES`).
            ordered: match inputs in the given order even for a commutative command.
            dtype: as for :meth:`var`.
            shape: as for :meth:`var`.
            where: as for :meth:`var`.
            index: which output of the node the symbol must be (default any).
            each: a pattern every input must match (any number of inputs); instead
                of listing ``inputs``.
            **params: hyper-parameters that must be equal, or predicates
                ``value -> bool`` (``perm=lambda p: p == (1, 0)``); a command value
                (``of=ops.relu()``, what a ``gradient`` node holds) must be equal.
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
        cmds = None if cmd is None else _command_names(cmd)
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


def _command_names(cmd: Any) -> frozenset[str]:
    """``Pat.op``'s ``cmd`` as a set of registered names (a misspelt name would match
    nothing, silently: it is an error naming the close ones)."""
    names = [cmd] if isinstance(cmd, str) else cmd
    if not isinstance(names, (list, tuple, set, frozenset)) or not all(
        isinstance(c, str) for c in names
    ):
        raise GraphError(
            f"Pat.op: cmd is a command name, a list of names or None, got "
            f"{type(cmd).__name__} {cmd!r}; e.g. Pat.op('relu', Pat.var('x')), "
            f"hyper-parameters as keywords"
        )
    for c in sorted(names):
        try:
            lookup(c)
        except UnknownCommandError as e:
            raise GraphError(f"Pat.op: {e}") from None
    return frozenset(names)


def _dtype(dtype: Any) -> Any:
    if dtype is None or isinstance(dtype, str):
        return dtype
    if isinstance(dtype, tuple):
        return tuple(np.dtype(d) for d in dtype)
    return np.dtype(dtype)


def _shape(shape: Any) -> tuple[int | None, ...] | None:
    return None if shape is None else tuple(shape)
