"""Seeing inside values: tensor statistics and the numerics check.

:func:`tensor_stats` summarises any array (min, max, mean, std, NaN and infinity
counts); use it from an :func:`~fnnc.graph.interpret` ``on_node`` hook to step through a
graph. With ``config.override(numerics=True)`` (or ``FNNC_CHECKS=numerics``), compiled
programs, ``interpret``, the dynamic graph (each ``exec`` as it runs: :func:`checked`)
and ``Model.fit`` raise :class:`~fnnc.errors.NumericsError` naming the first node whose
output holds a NaN or an infinity, with its inputs' statistics. In a graph, the
non-finite values the graph writes itself (a ``-inf`` mask constant) and what flows on
from them are deliberate and not reported (:class:`Blame`); the dynamic graph cannot
tell a mask variable from data, so there every NaN or infinity is.

Cost: off, nothing (the check is compiled in, or a command's forward wrapped, only when
it is on). On, a compiled program computes one finiteness flag per node and reads them
back once per call, and nothing is donated; the dynamic graph reads every command's
outputs back to the host, so each ``exec`` waits for its result.

>>> import numpy as np
>>> from fnnc.graph import tensor_stats
>>> print(tensor_stats(np.array([1.0, np.nan, 3.0], np.float32)))
f32[3] min=1 max=3 mean=2 std=1 nan=1 inf=0
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fnnc.core.command import is_float
from fnnc.core.ir import AliasSymbol, Graph, Node
from fnnc.core.text import format_graph
from fnnc.errors import NumericsError


@dataclasses.dataclass(frozen=True)
class Stats:
    """Statistics of one tensor over its finite elements, plus NaN / infinity counts."""

    shape: tuple[int, ...]
    dtype: str
    min: float
    max: float
    mean: float
    std: float
    nan: int
    inf: int

    @property
    def finite(self) -> bool:
        """No NaN and no infinity."""
        return self.nan == 0 and self.inf == 0

    def __str__(self) -> str:
        short = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}
        ty = f"{short.get(self.dtype, self.dtype)}[{','.join(map(str, self.shape))}]"
        return (
            f"{ty} min={self.min:.6g} max={self.max:.6g} mean={self.mean:.6g} "
            f"std={self.std:.6g} nan={self.nan} inf={self.inf}"
        )


def tensor_stats(x: Any) -> Stats:
    """Statistics of ``x`` (any array): min/max/mean/std of its finite elements (of
    their magnitudes ``|z|`` for complex values, counted as NaN where either part is
    NaN, else as infinite where either part is)."""
    arr = np.asarray(x)
    complex_ = arr.dtype.kind == "c"
    wide = arr.astype(np.complex128 if complex_ else np.float64)
    nan = np.isnan(wide)  # complex: either part
    inf = np.isinf(wide) & ~nan
    finite = (np.abs(wide) if complex_ else wide)[~(nan | inf)]
    if finite.size == 0:
        lo = hi = mean = std = float("nan")
    else:
        lo, hi = float(finite.min()), float(finite.max())
        mean, std = float(finite.mean()), float(finite.std())
    return Stats(
        tuple(arr.shape), arr.dtype.name, lo, hi, mean, std, int(nan.sum()), int(inf.sum())
    )


def numerics_error(
    graph: Graph, index: int, inputs: Sequence[Any], outputs: Sequence[Any], where: str
) -> NumericsError:
    """The error for node ``index`` of ``graph`` making a NaN or infinity."""
    node = graph.nodes[index]
    lines = [
        f"{where}: node {index} ({node.name or node.cmd.name}, {node.cmd}) produced "
        "a NaN or an infinity (the first node to do so)"
    ]
    for sid, value in zip(node.outputs, outputs):
        lines.append(f"  output {graph.label(sid)}: {tensor_stats(value)}")
    for sid, value in zip(node.inputs, inputs):
        lines.append(f"  input  {graph.label(sid)}: {tensor_stats(value)}")
    lines.append(format_graph(graph, mark=index, window=3))
    stale = list(
        dict.fromkeys(  # a node reading one input twice names it once
            graph.label(sid)
            for sid, value in zip(node.inputs, inputs)
            if sid in graph.inputs and is_float(value) and not tensor_stats(value).finite
        )
    )
    if stale:
        lines.append(
            f"Input {', '.join(stale)} already held a NaN or an infinity: it came from outside "
            "the graph (the data, or a parameter set by hand), not from this node."
        )
    else:
        lines.append(
            "Look at the inputs above: a log or division of zero, an overflow in float16, "
            "or NaN already in the data are the usual causes."
        )
    return NumericsError("\n".join(lines))


def nonfinite_kinds(values: Sequence[Any], xp: Any = np) -> Any:
    """Which non-finite kinds the float arrays in ``values`` hold: a ``bool[3]`` of
    (NaN, +inf, -inf), in NumPy (``xp=np``) or traced (``xp=jax.numpy``)."""
    found = xp.zeros(3, bool)
    for value in values:
        if not is_float(value):
            continue
        parts = (value.real, value.imag) if np.dtype(value.dtype).kind == "c" else (value,)
        for v in parts:
            inf = xp.isinf(v)
            found = found | xp.stack(
                [xp.isnan(v).any(), (inf & (v > 0)).any(), (inf & (v < 0)).any()]
            )
    return found


class Blame:
    """Decides, node by node in graph order, whether a node is to blame for a NaN or an
    infinity: whether an output holds a non-finite kind (NaN, +inf, -inf) that is not
    *allowed* there.

    Allowed are the kinds of values the graph writes itself: a node without inputs (a
    ``constant``, such as the ``-inf`` of an attention mask, or what ``jnp.nan_to_num``
    and ``jnp.isinf`` trace to), and whatever flows on from those. A graph input (the
    data, a parameter) allows nothing, so a NaN in the data is reported at the first
    node whose output carries it on, and a node that cleans it (``where(isnan(x), 0, x)``)
    is not blamed. The same class runs on host values (``xp=np``: ``interpret``) and
    inside a compiled program (``xp=jax.numpy``: one flag per node).
    """

    def __init__(self, graph: Graph, xp: Any = np):
        self.graph, self.xp = graph, xp
        self.allowed: dict[int, Any] = {}  # root symbol id -> bool[3]

    def _root(self, sid: int) -> int:
        sym = self.graph.symbol(sid)
        return sym.root if isinstance(sym, AliasSymbol) else sid

    def __call__(self, node: Node, outputs: Sequence[Any]) -> Any:
        """Whether ``node``, which made ``outputs``, is to blame (a bool, or a traced
        ``bool[]``); it records what its outputs allow for the nodes after it."""
        xp = self.xp
        kinds = nonfinite_kinds(outputs, xp)
        if not node.inputs:
            allowed = kinds
        else:
            allowed = xp.zeros(3, bool)
            for sid in node.inputs:
                got = self.allowed.get(self._root(sid))
                if got is not None:
                    allowed = allowed | got
        for sid in node.outputs:
            root = self._root(sid)
            earlier = self.allowed.get(root) if root != sid else None  # a view's root
            self.allowed[root] = allowed if earlier is None else earlier | allowed
        return (kinds & ~allowed).any()


def check_node(
    graph: Graph,
    index: int,
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    where: str,
    blame: Blame,
) -> None:
    """Raises :class:`NumericsError` if node ``index`` is to blame (see :class:`Blame`,
    which keeps what earlier nodes allow) for a NaN or an infinity in its outputs."""
    if bool(blame(graph.nodes[index], outputs)):
        raise numerics_error(graph, index, inputs, outputs, where)


class NotFinite(NumericsError):
    """Raised by a :func:`checked` forward: its ``inputs`` and ``outputs`` (the caller,
    who knows the node's name and inputs, turns it into :func:`exec_error`)."""

    def __init__(self, inputs: Sequence[Any], outputs: Sequence[Any]):
        super().__init__("a command produced a NaN or an infinity")
        self.inputs, self.outputs = tuple(inputs), tuple(outputs)


def checked(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a command's forward) raising :class:`NotFinite` when a float output holds
    a NaN or an infinity; it reads the outputs back, so it waits for them."""

    def run(*args: Any) -> Any:
        out = fn(*args)
        outs = out if isinstance(out, tuple) else (out,)
        for value in outs:
            if is_float(value) and not bool(np.isfinite(np.asarray(value)).all()):
                raise NotFinite(args, outs)
        return out

    return run


def exec_error(label: str, cmd: Any, names: Sequence[str], found: NotFinite) -> NumericsError:
    """The error for one ``exec`` (``label``, e.g. ``exec ewlog ('y')``) whose outputs
    ``found`` holds a NaN or an infinity; ``names`` are its inputs' names."""
    lines = [f"{label} produced a NaN or an infinity (the first command to do so)"]
    for k, value in enumerate(found.outputs):
        lines.append(f"  output {k}: {tensor_stats(value)}")
    for name, value in zip(names, found.inputs):
        lines.append(f"  input  {name}: {tensor_stats(value)}")
    stale = [n for n, v in zip(names, found.inputs) if is_float(v) and not tensor_stats(v).finite]
    inner = None if stale else _inside(cmd, found.inputs)
    if stale:
        lines.append(
            f"Input {', '.join(stale)} already held a NaN or an infinity: it came from outside "
            "the checked commands (data, a variable set by hand, a command run before the "
            "check was on)."
        )
    elif inner is not None:
        lines.append(f"Inside it: {inner}")
    else:
        lines.append(
            f"{cmd} made it from finite inputs: a log or division of zero, an overflow in "
            "float16, or an input outside the command's domain are the usual causes."
        )
    return NumericsError("\n".join(lines))


def _inside(cmd: Any, inputs: Sequence[Any]) -> str | None:
    """For a command holding a sub-graph (``call``: an evaluated model or graph), the
    numerics report of the first node inside it that made the NaN or infinity."""
    graph = dict(getattr(cmd, "params", ())).get("graph")
    if not isinstance(graph, Graph):
        return None
    from fnnc import config
    from fnnc.graph.interpret import interpret  # interpret imports this module

    try:
        with config.override(numerics=True):
            interpret(graph, *inputs)
    except NumericsError as e:
        return str(e)
    return None
