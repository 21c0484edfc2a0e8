"""Running a graph's nodes in order: the semantics that ``interpret`` and ``compile`` share.

Values live in an environment keyed by *root* symbol id. Reading an alias views its
root; a node writing an alias updates its root functionally (so XLA can do it in
place). A root written only through aliases starts as zeros; its unwritten elements
stay zero (NNC leaves them uninitialised; fnnc makes them defined).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import Command, spec_text
from fnnc.core.ir import AliasSymbol, Graph, Node, contiguous_strides
from fnnc.core.text import format_graph
from fnnc.errors import GraphError

NodeRunner = Callable[[int, Node, list[Any]], Sequence[Any]]
AfterNode = Callable[[int, Node, list[Any], tuple[Any, ...]], Sequence[Any]]


@functools.lru_cache(maxsize=4096)
def _view_plan(sym: AliasSymbol, root_shape: tuple[int, ...]) -> tuple[str, Any]:
    """How to read/write this view: ("slice", starts), ("block", None), ("gather", idx)
    or ("empty", None) for a view of no elements (its base may be the root's end)."""
    size = int(np.prod(sym.shape, dtype=np.int64))
    if size == 0:
        return "empty", None
    if len(sym.shape) == len(root_shape) and sym.stride == contiguous_strides(root_shape):
        starts = (
            np.unravel_index(sym.base, root_shape)
            if np.prod(root_shape)
            else (0,) * len(root_shape)
        )
        starts = tuple(int(s) for s in starts)
        if all(s + n <= r for s, n, r in zip(starts, sym.shape, root_shape)):
            return "slice", starts
    if sym.stride == contiguous_strides(sym.shape) or size <= 1:
        return "block", None
    return "gather", sym.flat_indices()


def read_view(root: Any, sym: AliasSymbol) -> Any:
    """The values of view ``sym`` of array ``root``."""
    kind, plan = _view_plan(sym, tuple(root.shape))
    if kind == "empty":
        return jnp.zeros(sym.shape, root.dtype)
    if kind == "slice":
        return lax.slice(root, plan, tuple(s + n for s, n in zip(plan, sym.shape)))
    flat = jnp.reshape(root, (-1,))
    if kind == "block":
        size = int(np.prod(sym.shape, dtype=np.int64))
        return jnp.reshape(lax.slice(flat, (sym.base,), (sym.base + size,)), sym.shape)
    return jnp.reshape(flat[plan.reshape(-1)], sym.shape)


def write_view(root: Any, sym: AliasSymbol, value: Any) -> Any:
    """``root`` with view ``sym`` replaced by ``value``."""
    kind, plan = _view_plan(sym, tuple(root.shape))
    if kind == "empty":
        return root
    value = value.astype(root.dtype)
    if kind == "slice":
        return lax.dynamic_update_slice(root, value, plan)
    flat = jnp.reshape(root, (-1,))
    if kind == "block":
        flat = lax.dynamic_update_slice(flat, jnp.reshape(value, (-1,)), (sym.base,))
    else:
        flat = flat.at[plan.reshape(-1)].set(jnp.reshape(value, (-1,)))
    return jnp.reshape(flat, root.shape)


def run_nodes(
    graph: Graph,
    args: Sequence[Any],
    run_node: NodeRunner,
    *,
    where: str = "",
    after: AfterNode | None = None,
) -> list[Any]:
    """Evaluates ``graph`` on input values ``args``; returns the output values.

    ``run_node(index, node, input_values)`` computes one node's outputs, which are then
    checked against the node's output symbols (:func:`check_results`; ``where`` starts
    its message). ``after(index, node, input_values, outputs)``, if given, sees the
    checked outputs and returns those to keep (interpret's numerics check and hook).
    """
    env: dict[int, Any] = dict(zip(graph.inputs, args))
    symbols = graph.symbols

    def read(sid: int, index: int = -1) -> Any:
        sym = symbols[sid]
        if isinstance(sym, AliasSymbol):
            root = env.get(sym.root)
            if root is None:
                root = env[sym.root] = jnp.zeros(symbols[sym.root].shape, sym.dtype)
            return read_view(root, sym)
        if sid not in env:
            if not any(isinstance(s, AliasSymbol) and s.root == sid for s in symbols):
                raise GraphError(
                    f"{_reader(graph, index)} read {graph.label(sid)}, which is no graph "
                    "input and which no node writes (a pass that drops an input or a node "
                    "leaves such reads: verify(graph) after a pass finds them)"
                )
            env[sid] = jnp.zeros(sym.shape, sym.dtype)  # a root written only through views
        return env[sid]

    for index, node in enumerate(graph.nodes):
        ins = [read(s, index) for s in node.inputs]
        outs = run_node(index, node, ins)
        check_results(graph, index, outs, where, inputs=ins)
        if after is not None:
            outs = after(index, node, ins, tuple(outs))
        for sid, value in zip(node.outputs, outs):
            sym = symbols[sid]
            if isinstance(sym, AliasSymbol):
                root = env.get(sym.root)
                if root is None:
                    root = jnp.zeros(symbols[sym.root].shape, sym.dtype)
                env[sym.root] = write_view(root, sym, value)
            else:
                env[sid] = value
    return [read(s) for s in graph.outputs]


def check_results(
    graph: Graph,
    index: int,
    outs: Sequence[Any],
    where: str = "",
    inputs: Sequence[Any] | None = None,
) -> None:
    """Raises :class:`GraphError` unless node ``index``'s results ``outs`` are as many,
    and of the shapes and dtypes, as its output symbols declare (what its command's
    shape rule gave). Under ``jit`` it runs while tracing, so a compiled program pays
    nothing for it at run time. Given the node's ``inputs``, dtypes are compared only
    when those are the dtypes declared: a float32 graph replayed on float64 values (a
    finite-difference check, a sub-graph body fed wider values) computes in float64."""
    node = graph.nodes[index]
    declared = [graph.symbols[s] for s in node.outputs]
    if results_agree(outs, declared) or (
        inputs is not None
        and results_agree(outs, declared, same_dtype=lambda a, b: True)
        and not _as_declared(graph, node, inputs)
    ):
        return
    want = [f"{graph.label(s)}: {spec_text(graph.symbols[s])}" for s in node.outputs]
    raise GraphError(
        f"{where + ': ' if where else ''}node {index} ({node.name or node.cmd.name}): "
        f"{node.cmd} produced {disagreement(node.cmd, outs, want, 'declared')}"
        f"\n{format_graph(graph, mark=index, window=3)}"
    )


def _as_declared(graph: Graph, node: Node, inputs: Sequence[Any]) -> bool:
    return all(
        v is None or np.dtype(v.dtype) == np.dtype(graph.symbols[s].dtype)
        for s, v in zip(node.inputs, inputs)
    )


def results_agree(
    outs: Sequence[Any],
    want: Sequence[Any],
    same_dtype: Callable[[np.dtype, np.dtype], bool] = operator.eq,
) -> bool:
    """Whether ``outs`` are as many arrays as the specs ``want``, each of its spec's
    shape and (as ``same_dtype`` judges) dtype."""
    return len(outs) == len(want) and all(
        tuple(o.shape) == tuple(w.shape) and same_dtype(np.dtype(o.dtype), np.dtype(w.dtype))
        for o, w in zip(outs, want)
    )


def part_of(cmd: Command) -> str:
    """``"backward"`` for a command that differentiates another, else ``"forward"``."""
    return "backward" if cmd.definition.backward_node is not None else "forward"


def disagreement(cmd: Command, outs: Sequence[Any], want: Sequence[str], judge: str) -> str:
    """``N value(s) (what came), <judge> M (what ``want`` says): ...; what to do``: how
    :func:`check_results` and eager calls report results their shape rule did not give."""
    part = part_of(cmd)
    got = ", ".join(spec_text(o) for o in outs) or "nothing"
    return (
        f"{len(outs)} value(s) ({got}), {judge} {len(want)} ({', '.join(want)}): the "
        f"command's shape rule disagrees with its {part}; make the {part} return what the "
        "rule says"
    )


def as_tuple(out: Any) -> tuple[Any, ...]:
    return out if isinstance(out, tuple) else (out,)


def _reader(graph: Graph, index: int) -> str:
    if index < 0:
        return "the graph's outputs"
    node = graph.nodes[index]
    return f"node {index} ({node.name or node.cmd.name})"
