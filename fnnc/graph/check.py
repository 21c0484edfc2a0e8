"""check_pass: run a graph before and after a pass on random inputs; name where they part.

For pass authors: ``check_pass(my_pass, graph)`` applies the pass (verified, blamed by
name as :func:`~fnnc.graph.run_passes` does), draws random inputs, and interprets both
graphs with the reference backends, in float64 where every command of both graphs
accepts it (float32 otherwise). It then does the same with NNC-convention gradients:
the ``backward`` pass of both graphs, seeded with random output gradients, with respect
to every floating-point input. When values differ beyond the tolerance it raises
:class:`PassCheckError` naming the *first* node of the rewritten graph whose result
differs from the result it stands for in the original, with the listing around it.

Which original result a new node stands for: graph outputs stand for the original
outputs (by position), inputs for inputs; and where a paired symbol's writers run the
same command, their inputs pair up too, when written by the same command (or both
inputs). So the pairing follows the unchanged parts of the graph up to the rewritten
region, and the first bad node is where a wrong rewrite first shows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from fnnc.core.dtypes import is_floating, is_inexact
from fnnc.core.ir import Graph, Node
from fnnc.core.text import format_graph
from fnnc.errors import FnncError, GraphError
from fnnc.graph.builder import GraphBuilder
from fnnc.graph.interpret import interpret
from fnnc.graph.passes.backward import backward
from fnnc.graph.passes.pipeline import run_passes


class PassCheckError(FnncError, AssertionError):
    """A pass changed what a graph computes (raised by :func:`check_pass`)."""


@dataclasses.dataclass(frozen=True)
class PassCheck:
    """What :func:`check_pass` compared.

    Attributes:
        graph: the pass's result.
        dtype: ``"float64"`` or ``"float32"``, the precision both graphs ran in.
        max_error: the largest absolute difference over outputs (and gradients).
        gradients: whether gradients were compared (the graph is differentiable with
            respect to some floating-point input).
    """

    graph: Graph
    dtype: str
    max_error: float
    gradients: bool


def check_pass(
    graph_pass: Callable[[Graph], Graph],
    graph: Graph,
    *,
    args: Sequence[Any] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    grads: bool = True,
    seed: int = 0,
) -> PassCheck:
    """Checks that ``graph_pass`` keeps what ``graph`` computes (see the module doc).

    Args:
        graph_pass: a pass ``Graph -> Graph``.
        graph: a graph to run it on.
        args: input arrays; default random (normal floats, integers 0 or 1, bools).
        rtol: relative tolerance; default ``1e-6`` in float64, ``1e-4`` in float32.
        atol: absolute tolerance; default ``1e-7`` in float64, ``1e-5`` in float32.
        grads: also compare gradients.
        seed: seed of the random inputs and output gradients.

    Returns:
        A :class:`PassCheck` when they agree.

    Raises:
        PassCheckError: they differ; the message names the first differing node.
        GraphError: the pass produced an invalid graph (naming the pass).
    """
    if isinstance(graph_pass, Graph) or not isinstance(graph, Graph):
        raise GraphError(
            f"check_pass(graph_pass, graph): expected a pass then a Graph, got a "
            f"{type(graph_pass).__name__} then a {type(graph).__name__}"
        )
    name = getattr(graph_pass, "__name__", repr(graph_pass))
    new = run_passes(graph, (graph_pass,), verify_each=True, print_each=False)
    if new.input_specs != graph.input_specs or new.output_specs != graph.output_specs:
        raise PassCheckError(
            f"check_pass: pass {name} changed the graph's signature: inputs "
            f"{_specs(graph.input_specs)} -> {_specs(new.input_specs)}, outputs "
            f"{_specs(graph.output_specs)} -> {_specs(new.output_specs)}"
        )
    rng = np.random.default_rng(seed)
    values = list(args) if args is not None else [draw(rng, s) for s in graph.input_specs]
    with jax.enable_x64(True):
        wide = (_float64(graph), _float64(new))
        if args is None and wide[0] is not None and wide[1] is not None:
            pair, dtype = wide, "float64"
            values = [_widen(v) for v in values]
        else:
            pair, dtype = (graph, new), "float32"
        wide_tol = dtype == "float64"
        tol = (
            (1e-6 if wide_tol else 1e-4) if rtol is None else rtol,
            (1e-7 if wide_tol else 1e-5) if atol is None else atol,
        )
        error = _compare(name, *pair, values, tol, "", shown=(graph, new))
        checked = False
        if grads:
            seeded = _with_gradients(pair[0]), _with_gradients(pair[1])
            if seeded[0] is not None and seeded[1] is not None:
                extra = [draw(rng, s) for s in seeded[0].input_specs[len(values) :]]
                extra = [_widen(v) if wide_tol else v for v in extra]
                error = max(error, _compare(name, *seeded, values + extra, tol, "gradients: "))
                checked = True
    return PassCheck(new, dtype, error, checked)


def _specs(specs: Sequence[Any]) -> list[str]:
    return [f"{np.dtype(s.dtype).name}{list(s.shape)}" for s in specs]


def draw(rng: np.random.Generator, spec: Any) -> np.ndarray:
    """A random value of ``spec`` (anything with ``shape`` and ``dtype``): standard-normal
    floats, integers 0 or 1 (valid indices into any table of two rows or more), random
    booleans; not zeros, which hide most differences."""
    dtype = np.dtype(spec.dtype)
    if is_floating(dtype):
        return rng.standard_normal(spec.shape).astype(dtype)
    if dtype == np.bool_:
        return rng.random(spec.shape) < 0.5
    return rng.integers(0, 2, spec.shape).astype(dtype)


def _widen(value: Any) -> Any:
    value = np.asarray(value)
    return value.astype(np.float64) if value.dtype == np.float32 else value


def _values(graph: Graph, args: Sequence[Any]) -> tuple[dict[int, np.ndarray], list[np.ndarray]]:
    """Every symbol's value (node outputs and inputs) in one interpreted run, and the
    graph's outputs (views of a tensor among them, which no node output names)."""
    seen: dict[int, np.ndarray] = {s: np.asarray(a) for s, a in zip(graph.inputs, args)}

    def record(index: int, node: Node, inputs: tuple, outputs: tuple) -> None:
        seen.update((s, np.asarray(v)) for s, v in zip(node.outputs, outputs))

    outs = interpret(graph, *args, on_node=record)
    if graph.out_tree is not None:
        outs = jax.tree.leaves(outs)
    elif len(graph.outputs) == 1:
        outs = [outs]
    return seen, [np.asarray(v) for v in outs]


def _compare(
    name: str,
    old: Graph,
    new: Graph,
    args: Sequence[Any],
    tol: tuple[float, float],
    what: str,
    shown: tuple[Graph, Graph] | None = None,
) -> float:
    """The largest difference of the outputs; raises naming the first bad node.
    ``shown``: the graphs to name symbols in (``old``/``new`` may be float64 replays
    of them, node for node)."""
    (a, old_outs), (b, new_outs) = _values(old, args), _values(new, args)
    errors = [max_error(n, o) for n, o in zip(new_outs, old_outs)]
    bad = [not close(n, o, tol) for n, o in zip(new_outs, old_outs)]
    if not any(bad):
        return max(errors, default=0.0)
    pairs = _pairing(old, new)
    for index, node in enumerate(new.nodes):
        for sid in node.outputs:
            o = pairs.get(sid)
            if o is None or o not in a or new.symbols[sid].shape != old.symbols[o].shape:
                continue
            if not close(b[sid], a[o], tol):
                show_old, show_new = shown or (old, new)
                writer = old.producers.get(o)
                was = (
                    f" (written by node {writer}: {old.nodes[writer].cmd})"
                    if writer is not None
                    else ""
                )
                raise PassCheckError(
                    f"check_pass: {what}pass {name} changed the values: node {index} "
                    f"({node.name or node.cmd.name}) computes "
                    f"{show_new.label(_same(new, sid, show_new))}, which stands for the original "
                    f"{show_old.label(_same(old, o, show_old))}{was}; max |difference| "
                    f"{max_error(b[sid], a[o]):.3g} (rtol {tol[0]:g}, atol {tol[1]:g}); the paired "
                    f"results before it agree\n{format_graph(show_new, mark=index, window=3)}"
                )
    k = bad.index(True)
    raise PassCheckError(
        f"check_pass: {what}pass {name} changed output {k}: max |difference| {errors[k]:.3g}\n{new}"
    )


def _same(graph: Graph, sid: int, shown: Graph) -> int:
    """The symbol of ``shown`` at ``sid``'s place in ``graph`` (a node-for-node replay)."""
    if sid in graph.inputs:
        return shown.inputs[graph.inputs.index(sid)]
    node = graph.nodes[graph.producers[sid]]
    return shown.nodes[graph.producers[sid]].outputs[node.outputs.index(sid)]


def _pairing(old: Graph, new: Graph) -> dict[int, int]:
    """New symbol -> the original symbol it stands for (see the module doc)."""
    pairs: dict[int, int] = {}
    queue = list(zip(new.outputs, old.outputs)) + list(zip(new.inputs, old.inputs))
    while queue:
        n, o = queue.pop()
        if n in pairs:
            continue
        pairs[n] = o
        i, j = new.producers.get(n), old.producers.get(o)
        if i is None or j is None or new.symbols[n].is_alias or old.symbols[o].is_alias:
            continue
        p, q = new.nodes[i], old.nodes[j]
        same = p.cmd.name == q.cmd.name and len(p.inputs) == len(q.inputs)
        if same and p.outputs.index(n) == q.outputs.index(o):
            # an input stands for an input only where both come from the same kind of
            # node: a rewritten region's inputs stand for nothing in the original
            queue.extend((x, y) for x, y in zip(p.inputs, q.inputs) if _stands_for(new, x, old, y))
    return pairs


def _stands_for(new: Graph, x: int, old: Graph, y: int) -> bool:
    """Whether input ``x`` of a paired node stands for ``y``: both come from the same
    kind of node, or from a one-for-one swap (one node for one node, same arity, same
    output spec, inputs from the same kinds), as ``relu`` replaced by ``ewabs``; the
    swapped node then gets the blame, not its reader."""
    if _kind(new, x) == _kind(old, y):
        return True
    i, j = new.producers.get(x), old.producers.get(y)
    if i is None or j is None:
        return False
    p, q = new.nodes[i], old.nodes[j]
    return (
        len(p.inputs) == len(q.inputs)
        and len(p.outputs) == len(q.outputs)
        and p.outputs.index(x) == q.outputs.index(y)
        and new.spec(x) == old.spec(y)
        and all(_kind(new, a) == _kind(old, b) for a, b in zip(p.inputs, q.inputs))
    )


def _kind(graph: Graph, sid: int) -> str | None:
    index = graph.producers.get(sid)
    return graph.nodes[index].cmd.name if index is not None else None


def close(x: Any, y: Any, tol: tuple[float, float]) -> bool:
    """Whether arrays ``x`` and ``y`` agree: the same shape, and then equal (integers,
    booleans) or within ``tol = (rtol, atol)`` in float64 (NaNs where both have them)."""
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape:
        return False
    if not is_inexact(x.dtype):
        return bool(np.array_equal(x, y))
    return bool(np.allclose(_wide64(x), _wide64(y), rtol=tol[0], atol=tol[1], equal_nan=True))


def max_error(x: Any, y: Any) -> float:
    """The largest ``|x - y|`` over elements (NaNs skipped; 0 when empty), in float64;
    infinity when the shapes differ."""
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape or x.size == 0:
        return 0.0 if x.shape == y.shape else float("inf")
    diff = np.abs(_wide64(x) - _wide64(y))
    return float(np.nanmax(diff)) if not np.all(np.isnan(diff)) else 0.0


def _wide64(x: np.ndarray) -> np.ndarray:
    return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def _with_gradients(graph: Graph) -> Graph | None:
    """``graph`` returning the gradients of its float outputs (seeded by new inputs)
    with respect to its float inputs; ``None`` when it cannot be differentiated."""
    floats = [s for s in graph.inputs if is_floating(graph.symbols[s].dtype)]
    fs = [s for s in graph.outputs if is_floating(graph.symbols[s].dtype)]
    if not floats or not fs:
        return None
    b = GraphBuilder.from_graph(graph)
    dfs = [
        b.input(graph.symbols[s].shape, graph.symbols[s].dtype, name=f"df[{k}]")
        for k, s in enumerate(fs)
    ]
    seeded = b.build([graph.symbols[s] for s in graph.outputs])
    try:
        full, grads = backward(seeded, fs, floats, df=dfs)
    except FnncError:
        return None
    return dataclasses.replace(full, outputs=tuple(g.id for g in grads), out_tree=None)


def _float64(graph: Graph) -> Graph | None:
    """``graph`` with float32 replaced by float64 (inputs, constants, dtype
    hyper-parameters); ``None`` when some command does not take it, or the graph has
    views or sub-graphs. Call under ``jax.enable_x64``."""
    from fnnc.graph.passes._subgraphs import holds_subgraphs
    from fnnc.ops.constant import Literal, constant

    if any(s.is_alias for s in graph.symbols):
        return None
    b = GraphBuilder()
    env: dict[int, Any] = {}
    for sid in graph.inputs:
        sym = graph.symbols[sid]
        env[sid] = b.input(sym.shape, _wide(sym.dtype), name=sym.name)
    try:
        for node in graph.nodes:
            if holds_subgraphs(node.cmd):
                return None
            if node.cmd.name == "constant":
                value = node.cmd.param("value").numpy()
                cmd = constant(Literal.of(value.astype(_wide(value.dtype))))
            else:
                cmd = node.cmd.replace(
                    **{k: np.dtype(np.float64) for k, v in node.cmd.params if _is_f32(v)}
                )
            outs = b.exec(cmd, *(env[s] for s in node.inputs), name=node.name)
            env.update(zip(node.outputs, outs if isinstance(outs, tuple) else (outs,)))
        outs = [env[s] for s in graph.outputs]
        return b.build(outs, out_tree=graph.out_tree, in_paths=graph.in_paths)
    except (FnncError, TypeError, ValueError):
        return None


def _wide(dtype: Any) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dtype) == np.float32 else np.dtype(dtype)


def _is_f32(value: Any) -> bool:
    return isinstance(value, np.dtype) and value == np.float32


__all__ = ["GraphError", "PassCheck", "PassCheckError", "check_pass", "close", "draw", "max_error"]
