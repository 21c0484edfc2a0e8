"""Hypothesis strategies for random valid graphs, shared by the graph and pass tests.

:func:`graphs` draws ``(graph, arrays)``: a graph built with
:class:`~fnnc.graph.GraphBuilder` from a table of commands (:data:`OPS`) and float32
arrays for its inputs. Graphs mix broadcasting operands, constants (some large
enough to be hoisted by ``compile``), slice and reshape aliases (aliases of aliases
too) read as node inputs, and disjoint alias writes that assemble a fresh
``builder.tensor`` piecewise (sometimes leaving a piece unwritten, which reads as
zeros). For the simplifying passes, options add work: activations (longer
elementwise chains, and ``f(s, g(s))``, one result read twice within a chain), repeated
nodes, constant-only subexpressions and no-op nodes such as ``x * 1`` or ``min(x, x)``
(with aliases, also views of such a no-op's result on a constant, read by a node).

Values stay finite and moderate: ``ewlog``, ``ewsqrt`` and the divisor of ``ewdiv``
read ``ewabs(x) + 1``; ``ewexp`` reads ``clamp(x, -3, 3)``; and every symbol carries a
bound on its magnitude, so a result that could exceed :data:`BOUND` is rescaled by an
exact power of two (``scalar_mul``). Float32 results then stay within about 1e-7
relative of a float64 NumPy evaluation (measured over 1500 graphs of up to 12 nodes),
so tests can use tight tolerances.

Example::

    @given(graphs(max_nodes=6))
    def test_pass_keeps_semantics(case):
        graph, arrays = case
        assert_close(interpret(my_pass(graph), *arrays), interpret(graph, *arrays))
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fnnc import ops
from fnnc.core.ir import AliasSymbol, Symbol, contiguous_strides
from fnnc.graph import Graph, GraphBuilder
from fnnc.ops import Command

BOUND = 64.0
"""Every symbol a drawn graph exposes has ``|value| <= BOUND`` (inputs in [-2, 2])."""

EXP_CLAMP = 3.0

Bounds = Callable[[Command, Sequence[Symbol], Sequence[float]], float]


@dataclasses.dataclass(frozen=True)
class OpEntry:
    """One row of the command table.

    Attributes:
        factory: the command's factory, e.g. ``ops.gemm``.
        arity: ``(least, most)`` value operands.
        operands: how operands are shaped: ``"unary"``, ``"broadcast"`` (NumPy
            broadcasting among all operands), ``"select"`` (a bool condition, then two
            broadcasting values) or ``"gemm"`` (matrix operands with a matching
            contraction size, an optional bias).
        params: draws the hyper-parameters.
        guard: ``""``; ``"positive"`` (operands listed in ``guarded`` become
            ``ewabs(x) + 1``); ``"exp"`` (operands become ``clamp(x, -3, 3)``).
        guarded: which operands the guard applies to.
        bound: a bound on ``|output|`` from the operands' bounds.
        weight: how often it is drawn relative to the others.
    """

    factory: Callable[..., Command]
    arity: tuple[int, int]
    operands: str
    params: Callable[[st.DrawFn], dict[str, Any]]
    bound: Bounds
    guard: str = ""
    guarded: tuple[int, ...] = (0,)
    weight: int = 1

    @property
    def name(self) -> str:
        return self.factory.__name__


def _none(draw: st.DrawFn) -> dict[str, Any]:
    return {}


def _choose(**options: Sequence[Any]) -> Callable[[st.DrawFn], dict[str, Any]]:
    def params(draw: st.DrawFn) -> dict[str, Any]:
        return {k: draw(st.sampled_from(v)) for k, v in options.items()}

    return params


def _clamp_params(draw: st.DrawFn) -> dict[str, Any]:
    lo, hi = draw(st.sampled_from([(None, 1.0), (-1.0, None), (-0.5, 0.5), (0.0, 2.0)]))
    return {"min": lo, "max": hi}


def _clamp_bound(cmd: Command, syms: Sequence[Symbol], bs: Sequence[float]) -> float:
    lo, hi = cmd.param("min"), cmd.param("max")
    if lo is None or hi is None:
        return bs[0]
    return min(bs[0], max(abs(lo), abs(hi)))


def _gemm_bound(cmd: Command, syms: Sequence[Symbol], bs: Sequence[float]) -> float:
    a = syms[0]
    k = a.shape[-2] if cmd.param("transpose_a") else a.shape[-1]
    return k * bs[0] * bs[1] + (bs[2] if len(bs) > 2 else 0.0)


OPS: tuple[OpEntry, ...] = (
    OpEntry(ops.gemm, (2, 3), "gemm", _none, _gemm_bound, weight=3),
    OpEntry(ops.ewsum, (1, 3), "broadcast", _none, lambda c, s, b: sum(b)),
    OpEntry(ops.ewprod, (2, 3), "broadcast", _none, lambda c, s, b: math.prod(b)),
    OpEntry(ops.ewdiv, (2, 2), "broadcast", _none, lambda c, s, b: b[0], "positive", (1,)),
    OpEntry(
        ops.ewexp, (1, 1), "unary", _none, lambda c, s, b: math.exp(min(b[0], EXP_CLAMP)), "exp"
    ),
    OpEntry(ops.ewlog, (1, 1), "unary", _none, lambda c, s, b: math.log(b[0]), "positive"),
    OpEntry(ops.ewsqrt, (1, 1), "unary", _none, lambda c, s, b: math.sqrt(b[0]), "positive"),
    OpEntry(ops.ewabs, (1, 1), "unary", _none, lambda c, s, b: b[0]),
    OpEntry(ops.clamp, (1, 1), "unary", _clamp_params, _clamp_bound),
    OpEntry(ops.min, (2, 2), "broadcast", _none, lambda c, s, b: max(b)),
    OpEntry(ops.max, (2, 2), "broadcast", _none, lambda c, s, b: max(b)),
    OpEntry(ops.select, (2, 2), "select", _none, lambda c, s, b: max(b[1:])),
    OpEntry(
        ops.add,
        (2, 2),
        "broadcast",
        _choose(p=(1.0, -1.0, 0.5, 2.0), q=(1.0, -1.0, 0.5)),
        lambda c, s, b: abs(c.param("p")) * b[0] + abs(c.param("q")) * b[1],
    ),
    OpEntry(
        ops.mul,
        (2, 2),
        "broadcast",
        _choose(p=(1.0, -0.5, 2.0)),
        lambda c, s, b: abs(c.param("p")) * b[0] * b[1],
    ),
    OpEntry(
        ops.scalar_mul,
        (1, 1),
        "unary",
        _choose(a=(2.0, -1.0, 0.5, -3.0)),
        lambda c, s, b: abs(c.param("a")) * b[0],
    ),
)
"""The commands :func:`graphs` draws from (plus ``constant``, always used)."""

ACTIVATIONS: tuple[OpEntry, ...] = (
    OpEntry(ops.relu, (1, 1), "unary", _none, lambda c, s, b: b[0]),
    OpEntry(
        ops.leaky_relu, (1, 1), "unary", _choose(negative_slope=(0.01, 0.2)), lambda c, s, b: b[0]
    ),
    OpEntry(ops.sigmoid, (1, 1), "unary", _none, lambda c, s, b: 1.0),
    OpEntry(ops.tanh, (1, 1), "unary", _none, lambda c, s, b: 1.0),
    OpEntry(ops.swish, (1, 1), "unary", _none, lambda c, s, b: b[0]),
    OpEntry(ops.gelu, (1, 1), "unary", _choose(approximate=(False, True)), lambda c, s, b: b[0]),
    OpEntry(ops.mish, (1, 1), "unary", _none, lambda c, s, b: b[0]),
)
"""Activations :func:`graphs` adds with ``activations=True`` (longer elementwise chains)."""

COMMUTATIVE = frozenset({"ewsum", "ewprod", "mul", "min", "max"})
"""Commands whose operands may be drawn in any order (``add`` too when ``p == q``)."""

_FLOATS = st.floats(
    -2.0, 2.0, width=32, allow_nan=False, allow_infinity=False, allow_subnormal=False
)


def input_arrays(graph: Graph, elements: st.SearchStrategy[float] = _FLOATS) -> st.SearchStrategy:
    """Arrays for ``graph``'s inputs: a tuple of float32 NumPy arrays, one per input.

    Args:
        graph: the graph whose ``input_specs`` the arrays follow.
        elements: the element values (default: finite floats in [-2, 2]).
    """
    return st.tuples(
        *(
            hnp.arrays(np.dtype(s.dtype), tuple(s.shape), elements=elements)
            for s in graph.input_specs
        )
    )


def _contiguous(sym: Symbol) -> bool:
    if not isinstance(sym, AliasSymbol):
        return True
    want = contiguous_strides(sym.shape)
    return all(s == w for n, s, w in zip(sym.shape, sym.stride, want) if n != 1)


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...], into: tuple[int, ...] | None) -> bool:
    try:
        out = np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return into is None or out == into


class _Drawer:
    """The state of one drawn graph: builder, readable symbols, magnitude bounds."""

    def __init__(
        self, draw: st.DrawFn, entries: Sequence[OpEntry], max_rank: int, max_dim: int
    ) -> None:
        self.draw = draw
        self.entries = tuple(entries)
        self.weighted = tuple(e for e in entries for _ in range(e.weight))
        self.max_rank, self.max_dim = max_rank, max_dim
        self.b = GraphBuilder()
        self.avail: list[Symbol] = []
        self.bound: dict[int, float] = {}  # root id -> bound on |value|
        self.count = 0
        self.made: list[tuple[Command, tuple[Symbol, ...], float]] = []  # for duplicates
        self.constants: list[Symbol] = []  # symbols computed from constants alone

    # -- small pieces ----------------------------------------------------------
    def dims(self, lo_rank: int = 0) -> tuple[int, ...]:
        rank = self.draw(st.integers(lo_rank, self.max_rank))
        return tuple(self.draw(st.integers(1, self.max_dim)) for _ in range(rank))

    def pick(self, where: Callable[[Symbol], bool] = lambda s: True) -> Symbol | None:
        cands = [s for s in self.avail if where(s)]
        return self.draw(st.sampled_from(cands)) if cands else None

    def exec(
        self, cmd: Command, *inputs: Symbol, outputs: Sequence[Symbol] | None = None, bound: float
    ) -> Symbol:
        out = self.b.exec(cmd, *inputs, outputs=outputs, name=f"n{self.count}")
        self.count += 1
        if outputs is None:
            self.made.append((cmd, tuple(inputs), bound))
        self.bound[out.root] = max(self.bound.get(out.root, 0.0), bound)
        return out

    def constant(self, shape: tuple[int, ...], dtype: Any = np.float32) -> Symbol:
        elements = st.booleans() if dtype == np.bool_ else _FLOATS
        value = self.draw(hnp.arrays(np.dtype(dtype), shape, elements=elements))
        top = float(np.max(np.abs(value), initial=0.0)) if dtype != np.bool_ else 1.0
        sym = self.b.constant(value, name=f"c{self.count}")
        self.count += 1
        self.bound[sym.id] = top
        return sym

    def partner_shape(
        self, shape: tuple[int, ...], into: tuple[int, ...] | None
    ) -> tuple[int, ...]:
        """A shape that broadcasts with ``shape`` (into ``into`` if given)."""
        rank = self.draw(st.integers(0, len(shape) if into is not None else self.max_rank))
        out = []
        for i in range(rank):
            j = len(shape) - rank + i
            if j < 0:
                out.append(self.draw(st.integers(1, self.max_dim)))
            elif shape[j] == 1 and into is None:
                out.append(self.draw(st.sampled_from([1, self.draw(st.integers(1, self.max_dim))])))
            else:
                out.append(self.draw(st.sampled_from([shape[j], 1])))
        return tuple(out)

    def operand(
        self, shape: tuple[int, ...], into: tuple[int, ...] | None, dtype: Any = np.float32
    ) -> Symbol:
        """An existing symbol or a fresh constant that broadcasts with ``shape``."""
        if dtype == np.float32 and self.draw(st.booleans()):
            sym = self.pick(lambda s: _broadcasts(shape, s.shape, into))
            if sym is not None:
                return sym
        return self.constant(self.partner_shape(shape, into), dtype)

    # -- guards and rescaling --------------------------------------------------
    def guard(self, sym: Symbol, kind: str) -> Symbol:
        b = self.bound[sym.root]
        if kind == "exp":
            return self.exec(ops.clamp(min=-EXP_CLAMP, max=EXP_CLAMP), sym, bound=min(b, EXP_CLAMP))
        magnitude = self.exec(ops.ewabs(), sym, bound=b)
        one = self.b.constant(np.float32(1.0), name=f"one{self.count}")
        self.count += 1
        self.bound[one.id] = 1.0
        return self.exec(ops.ewsum(), magnitude, one, bound=b + 1.0)

    @staticmethod
    def rescale_factor(bound: float) -> float:
        """A power of two that brings ``bound`` within :data:`BOUND` (1.0 if it is)."""
        k = 0
        while bound * 2.0**-k > BOUND:
            k += 1
        return 2.0**-k

    # -- nodes -----------------------------------------------------------------
    def operands(
        self,
        entry: OpEntry,
        first: Symbol,
        into: tuple[int, ...] | None,
        second: Symbol | None = None,
    ) -> list[Symbol]:
        if entry.operands == "unary":
            return [first]
        if second is not None:
            return [first, second]
        if entry.operands == "select":
            b = self.operand(first.shape, into)
            cond_into = np.broadcast_shapes(first.shape, b.shape) if into is not None else None
            cond = self.operand(np.broadcast_shapes(first.shape, b.shape), cond_into, np.bool_)
            return [cond, first, b]
        syms, shape = [first], first.shape
        for _ in range(self.draw(st.integers(*entry.arity)) - 1):
            sym = self.operand(shape, into)
            syms.append(sym)
            shape = np.broadcast_shapes(shape, sym.shape)
        return syms

    def gemm_operands(self, ta: bool, tb: bool) -> list[Symbol]:
        a = self.pick(lambda s: len(s.shape) >= 2)
        if a is None or self.draw(st.booleans()):
            a = self.reshape(self.pick(_contiguous), min_rank=2)
        m, k = (a.shape[-1], a.shape[-2]) if ta else (a.shape[-2], a.shape[-1])

        def fits(s: Symbol) -> bool:
            return (
                len(s.shape) >= 2
                and (s.shape[-1] if tb else s.shape[-2]) == k
                and _broadcasts(a.shape[:-2], s.shape[:-2], None)
            )

        b = self.pick(fits) if self.draw(st.booleans()) else None
        if b is None:
            n = self.draw(st.integers(1, self.max_dim))
            batch = self.draw(st.sampled_from([(), a.shape[:-2]]))
            b = self.constant(batch + ((n, k) if tb else (k, n)))
        n = b.shape[-2] if tb else b.shape[-1]
        bias = self.draw(st.sampled_from([None, (n,), (m, 1), ()]))
        return [a, b] if bias is None else [a, b, self.constant(bias)]

    def node(
        self,
        entry: OpEntry,
        first: Symbol | None = None,
        *,
        into: tuple[int, ...] | None = None,
        outputs: Sequence[Symbol] | None = None,
        second: Symbol | None = None,
    ) -> Symbol:
        """Adds one ``entry`` node (plus guards and a rescale if needed); returns its result.

        With ``outputs``, the node (or its rescale) writes those symbols and every
        operand broadcasts ``into`` the shape of ``first``. ``second`` fixes the second
        operand of a two-operand ``"broadcast"`` entry.
        """
        params = entry.params(self.draw)
        if entry.operands == "gemm":
            ta, tb = self.draw(st.booleans()), self.draw(st.booleans())
            params = {"transpose_a": ta, "transpose_b": tb}
            syms = self.gemm_operands(ta, tb)
        else:
            first = first if first is not None else self.pick()
            syms = self.operands(entry, first, into, second)
        if entry.guard:
            syms = [
                self.guard(s, entry.guard) if i in entry.guarded else s for i, s in enumerate(syms)
            ]
        cmd = entry.factory(**params)
        bound = entry.bound(cmd, syms, [self.bound[s.root] for s in syms])
        scale = self.rescale_factor(bound)
        if scale == 1.0:
            return self.exec(cmd, *syms, outputs=outputs, bound=bound)
        big = self.exec(cmd, *syms, bound=bound)
        return self.exec(ops.scalar_mul(a=scale), big, outputs=outputs, bound=bound * scale)

    # -- redundancy for the simplifying passes -----------------------------------
    def duplicate(self) -> Symbol:
        """An earlier node again (operands reordered when the command commutes)."""
        if not self.made:
            return self.node(self.draw(st.sampled_from(self.weighted)))
        cmd, inputs, bound = self.draw(st.sampled_from(self.made))
        commutes = cmd.name in COMMUTATIVE or (
            cmd.name == "add" and cmd.param("p") == cmd.param("q")
        )
        if commutes and self.draw(st.booleans()):
            inputs = inputs[::-1]
        return self.exec(cmd, *inputs, bound=bound)

    def constant_expression(self) -> Symbol:
        """A node reading only constants and results computed from constants alone."""
        outer, self.avail = self.avail, list(self.constants)
        if not self.avail:
            self.avail.append(self.constant(self.dims()))
        out = self.node(self.draw(st.sampled_from(self.weighted)))
        self.constants = [*self.avail, out]
        self.avail = outer + [s for s in self.constants if s not in outer]
        return out

    def identity(self, x: Symbol | None = None) -> Symbol:
        """A node that returns its operand (default: a drawn one) unchanged (``x * 1``, a
        reshape to its shape, ``min(x, x)``...)."""
        x = self.pick() if x is None else x
        shape, b = x.shape, self.bound[x.root]
        kind = self.draw(st.sampled_from(IDENTITY_KINDS))
        if kind in ("min", "max"):
            ties = self.draw(st.sampled_from(["split", "both"]))  # only "split" folds
            return self.exec(getattr(ops, kind)(ties=ties), x, x, bound=b)
        if kind == "scalar_mul":
            return self.exec(ops.scalar_mul(a=1.0), x, bound=b)
        if kind in ("mul", "ewprod", "ewdiv"):
            one = self.b.constant(np.ones(self.partner_shape(shape, shape), np.float32))
            self.bound[one.id] = 1.0
            cmd = {"mul": ops.mul(), "ewprod": ops.ewprod(), "ewdiv": ops.ewdiv()}[kind]
            pair = (one, x) if kind != "ewdiv" and self.draw(st.booleans()) else (x, one)
            return self.exec(cmd, *pair, bound=b)
        if kind in ("add", "ewsum"):
            zero = self.b.constant(np.zeros(self.partner_shape(shape, shape), np.float32))
            self.bound[zero.id] = 0.0
            if kind == "ewsum":
                return self.exec(ops.ewsum(), x, zero, bound=b)
            return self.exec(ops.add(q=self.draw(st.sampled_from([1.0, -1.0]))), x, zero, bound=b)
        cmd = {
            "ewsum1": ops.ewsum(),
            "reshape": ops.reshape(shape=shape),
            "transpose": ops.transpose(perm=tuple(range(len(shape)))),
            "datatype_conversion": ops.datatype_conversion(dtype=np.float32),
            "broadcast_to": ops.broadcast_to(shape=shape),
            "clamp": ops.clamp(),
        }[kind]
        return self.exec(cmd, x, bound=b)

    def folded_view(self) -> Symbol:
        """A view of a no-op's result on a constant, read by a node (``v = view(c + 0)``):
        ``fold`` drops the no-op and must see ``v`` as constant in the same run."""
        if not self.constants:
            self.constants.append(self.constant(self.dims(lo_rank=1)))
        same = self.identity(self.draw(st.sampled_from(self.constants)))
        view = self.slice(same) if same.shape and self.draw(st.booleans()) else self.reshape(same)
        readers = [e for e in self.entries if e.operands != "gemm"]
        return self.node(self.draw(st.sampled_from(readers)), view) if readers else view

    def shared_in_chain(self) -> Symbol:
        """``f(s, g(s))``: a result read twice within one elementwise chain (``fuse``
        must take ``s`` into the chain in one run)."""
        unary = [e for e in self.entries if e.operands == "unary"]
        binary = [
            e for e in self.entries if e.operands == "broadcast" and e.arity[0] <= 2 <= e.arity[1]
        ]
        if not unary or not binary:
            return self.node(self.draw(st.sampled_from(self.weighted)))
        s = self.node(self.draw(st.sampled_from(unary)))
        g = self.node(self.draw(st.sampled_from(unary)), s)
        pair = (s, g) if self.draw(st.booleans()) else (g, s)
        return self.node(self.draw(st.sampled_from(binary)), pair[0], second=pair[1])

    # -- aliases ---------------------------------------------------------------
    def reshape(self, sym: Symbol, min_rank: int = 0) -> Symbol:
        """A reshape alias of the contiguous symbol ``sym`` (dims may include 1s)."""
        size = math.prod(sym.shape)
        rank = self.draw(st.integers(max(min_rank, 0 if size == 1 else 1), self.max_rank))
        shape, rest = [], size
        for _ in range(rank - 1):
            d = self.draw(st.sampled_from([d for d in range(1, rest + 1) if rest % d == 0]))
            shape.append(d)
            rest //= d
        if rank:
            shape.append(rest)
        # Explicit strides: with the parent's rank, the default would be a slice.
        alias = self.b.alias(
            sym, tuple(shape), stride=contiguous_strides(tuple(shape)), name=f"r{self.count}"
        )
        self.avail.append(alias)
        return alias

    def slice(self, sym: Symbol) -> Symbol:
        """A slice alias of ``sym`` (an alias of an alias when ``sym`` is one)."""
        starts = [self.draw(st.integers(0, n - 1)) for n in sym.shape]
        shape = tuple(self.draw(st.integers(1, n - s)) for n, s in zip(sym.shape, starts))
        alias = self.b.alias(sym, shape, offset=starts, name=f"s{self.count}")
        self.avail.append(alias)
        return alias

    def alias_read(self) -> Symbol:
        """A slice or reshape alias, read at once by a node."""
        sym = self.pick(lambda s: len(s.shape) >= 1)
        if sym is None or self.draw(st.booleans()):
            view = self.reshape(self.pick(_contiguous))
        else:
            view = self.slice(sym)
        entry = self.draw(
            st.sampled_from([e for e in self.entries if e.operands != "gemm"] or self.entries)
        )
        first = view if entry.operands != "gemm" else None
        return self.node(entry, first)

    def alias_write(self) -> Symbol:
        """A fresh tensor written piecewise through disjoint slices along one axis."""
        src = self.pick(lambda s: len(s.shape) >= 1)
        writers = [e for e in self.entries if e.operands in ("unary", "broadcast", "select")]
        if src is None or not writers:
            return self.node(self.draw(st.sampled_from(self.weighted)))
        axis = self.draw(st.integers(0, len(src.shape) - 1))
        pieces = self.draw(st.integers(2, 3))
        shape = list(src.shape)
        shape[axis] *= pieces
        root = self.b.tensor(tuple(shape), name=f"t{self.count}")
        self.bound[root.id] = 0.0
        skip = self.draw(st.sampled_from([None] * 3 + list(range(pieces))))
        views = []
        for j in range(pieces):
            offset = [0] * len(shape)
            offset[axis] = j * src.shape[axis]
            view = self.b.alias(root, src.shape, offset=offset, name=f"p{self.count}_{j}")
            views.append(view)
            if j != skip:
                self.node(self.draw(st.sampled_from(writers)), src, into=src.shape, outputs=[view])
        self.avail.extend([root, *views])
        return root


IDENTITY_KINDS = (
    "scalar_mul",
    "mul",
    "ewprod",
    "ewdiv",
    "add",
    "ewsum",
    "ewsum1",
    "reshape",
    "transpose",
    "datatype_conversion",
    "broadcast_to",
    "clamp",
    "min",
    "max",
)
"""The no-op nodes :func:`graphs` draws with ``identities=True``."""


def graphs(
    *,
    max_inputs: int = 3,
    max_nodes: int = 8,
    max_rank: int = 3,
    max_dim: int = 4,
    commands: Sequence[str] | None = None,
    aliases: bool = True,
    alias_writes: bool = True,
    activations: bool = False,
    duplicates: bool = False,
    constant_exprs: bool = False,
    identities: bool = False,
) -> st.SearchStrategy[tuple[Graph, tuple[np.ndarray, ...]]]:
    """Random valid graphs over :data:`OPS`, with matching input arrays.

    Args:
        max_inputs: graph inputs, 1 to this many, float32, rank 0 to ``max_rank``.
        max_nodes: the graph is built until it has at least a drawn number, 1 to this
            many, of nodes (guards, constants and rescales count; the last step may
            go a few over).
        max_rank, max_dim: largest rank and axis size of inputs and constants.
        commands: names from :data:`OPS` to draw from (default: all). ``constant``,
            and the guards ``ewabs``, ``ewsum``, ``clamp`` and ``scalar_mul``, appear
            whatever this says.
        aliases: draw slice and reshape aliases read as node inputs.
        alias_writes: draw tensors assembled by disjoint alias writes.
        activations: also draw the commands of :data:`ACTIVATIONS` (longer
            elementwise chains for ``fuse``), and ``f(s, g(s))``: one result read twice
            within a chain.
        duplicates: draw earlier nodes again, commuting operands where allowed
            (work for ``cse``).
        constant_exprs: draw nodes that read only constants, and chains of them
            (work for ``fold``).
        identities: draw nodes that return their operand (:data:`IDENTITY_KINDS`:
            ``x * 1``, ``x + 0``, ``min(x, x)``, reshapes to the same shape...; work for
            ``fold``); with ``aliases``, also views of such a node's result on a
            constant, read by a node.

    Returns:
        A strategy of ``(graph, arrays)``: a verified graph whose outputs are 1 to 3
        of its symbols (the last result first), and one float32 array in [-2, 2] per
        graph input.
    """
    table = OPS + (ACTIVATIONS if activations else ())
    entries = [
        e
        for e in table
        if (commands is None or e.name in commands) and (e.operands != "gemm" or max_rank >= 2)
    ]
    if not entries:
        names = [e.name for e in table]
        raise ValueError(f"graphs: no command of {commands} is in the table {names}")

    @st.composite
    def draw_graph(draw: st.DrawFn) -> Graph:
        d = _Drawer(draw, entries, max_rank, max_dim)
        for i in range(draw(st.integers(1, max_inputs))):
            sym = d.b.input(d.dims(), name=f"x{i}")
            d.avail.append(sym)
            d.bound[sym.id] = 2.0
        steps = ["node"] + ["alias"] * aliases + ["write"] * alias_writes
        steps += ["duplicate"] * duplicates + ["constant"] * constant_exprs
        steps += ["identity"] * identities + ["folded_view"] * (identities and aliases)
        steps += ["shared"] * activations
        target = draw(st.integers(1, max_nodes))
        last: Symbol | None = None
        while d.count < target:
            step = draw(st.sampled_from(steps))
            if step == "alias":
                last = d.alias_read()
            elif step == "write":
                last = d.alias_write()
            elif step in ("duplicate", "constant", "identity", "folded_view", "shared"):
                last = {
                    "duplicate": d.duplicate,
                    "constant": d.constant_expression,
                    "identity": d.identity,
                    "folded_view": d.folded_view,
                    "shared": d.shared_in_chain,
                }[step]()
            else:
                last = d.node(draw(st.sampled_from(d.weighted)))
            if last is not None and last not in d.avail:
                d.avail.append(last)
        extra = draw(st.lists(st.sampled_from(d.avail), max_size=2, unique_by=lambda s: s.id))
        outputs = [last] + [s for s in extra if s.id != last.id]
        return d.b.build(outputs)

    return draw_graph().flatmap(lambda g: st.tuples(st.just(g), input_arrays(g)))
