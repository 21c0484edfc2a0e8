"""The symbolic graph IR: three small frozen records and the graph that holds them.

* :class:`TensorSymbol` — a tensor with a spec (shape, dtype) and a name. It is
  written once: by being a graph input, by being a node output, or piecewise through
  disjoint alias writes (NNC's tensor symbol).
* :class:`AliasSymbol` — a strided view of a root tensor symbol (NNC's alias): element
  ``i`` of the view is element ``base + sum(i[d] * stride[d])`` of the root's flat,
  row-major buffer. Slices and reshapes are aliases; an alias of an alias is stored as
  an alias of the root.
* :class:`Node` — one command applied to input symbols, writing output symbols.

A :class:`Graph` holds symbols (``symbols[i].id == i``), nodes in a valid execution
order, graph inputs and outputs. No arrays live in the IR (constants are hashable
literals inside commands), so a graph is hashable and keys caches. Edit graphs with
:func:`dataclasses.replace` or a :class:`~fnnc.graph.GraphBuilder`; every pass returns
the same object when nothing changed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from fnnc.core.command import Command
from fnnc.errors import GraphError

Spec = jax.ShapeDtypeStruct


def unit_axes_apart(a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether shapes ``a`` and ``b`` differ, but only by axes of size 1: the same elements
    in the same order, which NNC writes from one tensor into the other."""
    return tuple(a) != tuple(b) and [n for n in a if n != 1] == [n for n in b if n != 1]


def _as_tuples(record: Any, *fields: str) -> None:
    """Turns the lists given for ``fields`` of a frozen IR record into the tuples it
    holds, so a record made by hand or with :func:`dataclasses.replace` stays hashable
    (compile caches on graphs). Anything else is kept as given, for
    :func:`~fnnc.graph.verify` to name (a string is no sequence of dimensions)."""
    for field in fields:
        value = getattr(record, field)
        if isinstance(value, list):
            object.__setattr__(record, field, tuple(value))


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides, in elements."""
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


@dataclasses.dataclass(frozen=True, slots=True)
class TensorSymbol:
    """A tensor of the graph: id, shape, dtype, name."""

    id: int
    shape: tuple[int, ...]
    dtype: np.dtype
    name: str = ""

    def __post_init__(self) -> None:
        _as_tuples(self, "shape")

    @property
    def spec(self) -> Spec:
        return Spec(self.shape, self.dtype)

    @property
    def root(self) -> int:
        return self.id

    @property
    def is_alias(self) -> bool:
        return False


@dataclasses.dataclass(frozen=True, slots=True)
class AliasSymbol:
    """A strided view of the root symbol ``root`` (see module doc for the rule)."""

    id: int
    root: int
    shape: tuple[int, ...]
    dtype: np.dtype
    base: int
    stride: tuple[int, ...]
    name: str = ""

    def __post_init__(self) -> None:
        _as_tuples(self, "shape", "stride")

    @property
    def spec(self) -> Spec:
        return Spec(self.shape, self.dtype)

    @property
    def is_alias(self) -> bool:
        return True

    def flat_indices(self) -> np.ndarray:
        """Root-buffer element indices of this view, shaped like the view."""
        idx = np.full(self.shape, self.base, dtype=np.int64)
        for d, (n, s) in enumerate(zip(self.shape, self.stride)):
            shape = [1] * len(self.shape)
            shape[d] = n
            idx = idx + np.arange(n, dtype=np.int64).reshape(shape) * s
        return idx

    def first_index(self) -> int:
        """The lowest root-buffer element the view reaches (below ``base`` where a
        stride is negative)."""
        return self.base + sum((n - 1) * s for n, s in zip(self.shape, self.stride) if n > 0 > s)

    def last_index(self) -> int:
        """The highest root-buffer element the view reaches."""
        return self.base + sum((n - 1) * s for n, s in zip(self.shape, self.stride) if n > 0 < s)

    def outside(self, size: int) -> bool:
        """Whether the view reaches outside a root of ``size`` elements: a negative
        ``base``, or (for a view holding any element) one below 0 or past ``size - 1``."""
        if self.base < 0:
            return True
        return 0 not in self.shape and (self.first_index() < 0 or self.last_index() >= size)


Symbol = TensorSymbol | AliasSymbol


@dataclasses.dataclass(frozen=True, slots=True)
class Node:
    """One command applied to symbols: ``outputs = cmd(*inputs)``."""

    cmd: Command
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    name: str = ""

    def __post_init__(self) -> None:
        _as_tuples(self, "inputs", "outputs")


@dataclasses.dataclass(frozen=True, eq=False)
class Graph:
    """An immutable SSA graph. Build one with :class:`~fnnc.graph.GraphBuilder` or
    :func:`~fnnc.graph.trace`.

    Attributes:
        symbols: every symbol, ``symbols[i].id == i``.
        nodes: nodes in execution order.
        inputs: ids of the graph inputs (what callers pass, in order).
        outputs: ids of the graph outputs.
        out_tree: optional pytree structure of the outputs (set by ``trace``);
            ``None`` means one output is returned bare and several as a tuple.
        in_paths: optional key path (``jax.tree_util.keystr``) of each input within
            the argument tuple, e.g. ``"[0]['scale']"`` (set by ``trace``): callers
            passing pytrees must pass this structure. ``None``: any structure whose
            leaves are the inputs in order.
    """

    symbols: tuple[Symbol, ...]
    nodes: tuple[Node, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    out_tree: Any = None
    in_paths: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        _as_tuples(self, "symbols", "nodes", "inputs", "outputs", "in_paths")

    def symbol(self, sid: int) -> Symbol:
        return self.symbols[sid]

    def spec(self, sid: int) -> Spec:
        return self.symbols[sid].spec

    def label(self, sid: int) -> str:
        """``%3`` or ``%3 (name)`` for messages."""
        name = self.symbols[sid].name
        return f"%{sid} ({name})" if name else f"%{sid}"

    @functools.cached_property
    def producers(self) -> dict[int, int]:
        """Symbol id -> index of the node that writes it (aliases map to their writer)."""
        return {o: i for i, node in enumerate(self.nodes) for o in node.outputs}

    @functools.cached_property
    def consumers(self) -> dict[int, list[int]]:
        """Symbol id -> indices of the nodes that read it, in order."""
        out: dict[int, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for s in node.inputs:
                out.setdefault(s, []).append(i)
        return out

    @functools.cached_property
    def _hash(self) -> int:
        return hash(
            (self.symbols, self.nodes, self.inputs, self.outputs, self.out_tree, self.in_paths)
        )

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return (
            isinstance(other, Graph)
            and hash(self) == hash(other)
            and (self.symbols, self.nodes, self.inputs, self.outputs, self.out_tree, self.in_paths)
            == (
                other.symbols,
                other.nodes,
                other.inputs,
                other.outputs,
                other.out_tree,
                other.in_paths,
            )
        )

    def __str__(self) -> str:
        from fnnc.core.text import format_graph

        return format_graph(self)

    def __repr__(self) -> str:
        n_in, n_nodes, n_out = len(self.inputs), len(self.nodes), len(self.outputs)
        return f"<Graph: {n_in} inputs, {n_nodes} nodes, {n_out} outputs>"

    @property
    def input_specs(self) -> tuple[Spec, ...]:
        return tuple(self.spec(i) for i in self.inputs)

    @property
    def output_specs(self) -> tuple[Spec, ...]:
        return tuple(self.spec(i) for i in self.outputs)


def require_graph(value: Any, where: str) -> Graph:
    """``value`` itself when it is a :class:`Graph`, else a :class:`GraphError` that says
    what came and how to get a graph (the check at the graph layer's entry points)."""
    if isinstance(value, Graph):
        return value
    try:
        inner = getattr(value, "graph", None)
    except Exception:  # a property that cannot answer (an uncompiled model): no hint
        inner = None
    if isinstance(inner, Graph):
        hint = f"pass its .graph ({type(value).__name__}.graph is one)"
    elif callable(value):
        hint = "trace the function into one first: fnnc.graph.trace(fn, *example_args)"
    else:
        hint = "build one with fnnc.graph.GraphBuilder or fnnc.graph.trace(fn, *example_args)"
    raise GraphError(
        f"{where}: expected a fnnc.graph.Graph, got {type(value).__name__} {_short(value)}; {hint}"
    )


def _short(value: Any) -> str:
    name = getattr(value, "__name__", None)
    text = repr(name if isinstance(name, str) else value)
    return text if len(text) <= 40 else text[:37] + "..."


def num_elements(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
