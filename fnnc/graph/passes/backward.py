"""backward: NNC's symbolic reverse mode, as a pass that appends ordinary nodes.

``backward(graph, f, wrt)`` walks the nodes that lie between ``wrt`` and ``f`` in
reverse and, for each, adds one ``gradient[of=cmd]`` node built from the command's
own backward rule (never a hidden ``jax.grad``), so the result can be simplified,
fused, rematerialised and differentiated again like any graph.

Needs: ``f`` and ``wrt`` are tensor symbols of ``graph``; ``f`` is a scalar (or has
one element) unless a seed ``df`` is given.

Guarantees:
  * only nodes on a path from ``wrt`` to ``f`` get gradient nodes, and only for their
    inputs that depend on ``wrt`` (NNC: "only the inputs that are needed");
  * several contributions to one symbol are summed with one ``ewsum``;
  * a ``wrt`` that ``f`` does not depend on gets zeros (a ``set`` node);
  * a node reading a view (alias) sends its gradient into a zero tensor of the root's
    shape through the same view; views that read disjoint parts of the root share one
    such tensor (NNC's one gradient tensor), views that overlap each other are summed,
    and a view that reads an element more than once (stride 0, sliding windows) adds
    its contributions up (``scatter_add``);
    a node writing a view takes its gradient as that view of the root's gradient;
  * the returned graph's outputs are ``graph.outputs`` followed by the gradients.

Before (``z = x * x``)::

    graph(%0:f32[] x) {
      %1:f32[] = ewprod(%0, %0)
      return %1
    }

After ``backward(graph, z, [x])``::

    graph(%0:f32[] x) {
      %1:f32[] = ewprod(%0, %0)
      %2:f32[] = set[shape=(), value=1.0]()
      %3:f32[], %4:f32[] = ewprod.backward[wants=(0,1)](%2, %0, %0)
      %5:f32[] = ewsum(%3, %4)
      return %1, %5
    }
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fnnc import ops
from fnnc.core.ir import AliasSymbol, Graph, Node, Symbol, TensorSymbol
from fnnc.errors import DTypeError, GraphError, ShapeError
from fnnc.graph.builder import GraphBuilder
from fnnc.graph.passes._view_sets import disjoint_groups, size
from fnnc.ops.autodiff import gradient_command


def _ids(graph: Graph, items: Any, what: str) -> list[int]:
    """Symbol ids of ``items``: symbols of ``graph``, their integer ids or their names
    (one or a list; a name must name exactly one symbol)."""
    if isinstance(items, (int, np.integer, str)) or hasattr(items, "id"):
        items = [items]
    elif not hasattr(items, "__iter__"):
        raise GraphError(
            f"backward: {what} is a {type(items).__name__}; it takes a tensor symbol of the "
            "graph (what GraphBuilder.input/exec return), its integer id, or a list of them"
        )
    out = []
    for k, item in enumerate(items):
        if isinstance(item, str):
            out.append(_named(graph, item, what))
            continue
        if not hasattr(item, "id") and (
            isinstance(item, bool) or not isinstance(item, (int, np.integer))
        ):
            inputs = ", ".join(graph.label(s) for s in graph.inputs)
            raise GraphError(
                f"backward: {what}[{k}] is {item!r} (a {type(item).__name__}); {what} takes "
                "tensor symbols of the graph (what GraphBuilder.input/exec return) or their "
                f"integer ids, e.g. the graph inputs {inputs}"
            )
        sid = int(item.id if hasattr(item, "id") else item)
        if not 0 <= sid < len(graph.symbols) or (
            hasattr(item, "id") and not _held(graph.symbols[sid], item)
        ):
            raise GraphError(
                f"backward: {what} {item!r} is not a symbol of this graph "
                f"(it has {len(graph.symbols)} symbols); pass symbols of the graph you "
                "differentiate"
            )
        out.append(sid)
    return out


def _named(graph: Graph, name: str, what: str) -> int:
    """The id of the one symbol of ``graph`` named ``name``."""
    found = [i for i, sym in enumerate(graph.symbols) if getattr(sym, "name", None) == name]
    if len(found) != 1:
        inputs = ", ".join(graph.label(s) for s in graph.inputs)
        many = f"{len(found)} symbols ({', '.join(graph.label(i) for i in found)})"
        raise GraphError(
            f"backward: {what} names {name!r}, which "
            f"{'is no symbol of this graph' if not found else 'names ' + many}; pass the "
            f"symbol itself or its integer id (the graph inputs are {inputs})"
        )
    return found[0]


def _held(held: Symbol, item: Any) -> bool:
    """Whether ``item`` names the graph's symbol ``held``: the symbol itself, or the
    shape-less one a builder handed out before build gave it its shape (an auto
    ``tensor(None)`` or ``input(None)``, and what nodes reading those returned), which
    the builder itself keeps accepting."""
    if held == item:
        return True
    return (
        isinstance(item, TensorSymbol)
        and isinstance(held, TensorSymbol)
        and item.shape is None
        and item.name == held.name
        and (item.dtype is None or np.dtype(item.dtype) == np.dtype(held.dtype))
    )


def _relevant_nodes(graph: Graph, f: list[int], wrt: list[int]) -> tuple[set[int], list[int]]:
    """Roots that depend on ``wrt`` and the indices of nodes on a path wrt -> f."""
    sym = graph.symbols
    depends = {sym[s].root for s in wrt}
    for node in graph.nodes:
        if any(sym[s].root in depends for s in node.inputs):
            depends.update(sym[s].root for s in node.outputs)
    reaches = {sym[s].root for s in f}
    on_path = []
    for index in range(len(graph.nodes) - 1, -1, -1):
        node = graph.nodes[index]
        if not any(sym[s].root in reaches for s in node.outputs):
            continue
        reaches.update(sym[s].root for s in node.inputs)
        if node.cmd.definition.attributes.differentiable and any(
            sym[s].root in depends for s in node.inputs
        ):
            on_path.append(index)
    return depends, on_path


class _Grads:
    """Gradient contributions per root symbol, summed once when first needed."""

    def __init__(self, builder: GraphBuilder, graph: Graph):
        self.b = builder
        self.graph = graph
        self.parts: dict[int, list[tuple[AliasSymbol | None, Symbol]]] = {}
        self.done: dict[int, Symbol | None] = {}

    def add(self, target: Symbol, grad: Symbol) -> None:
        root = target.root
        if root in self.done:
            raise GraphError(
                f"backward: gradient of {self.graph.label(root)} is needed before all of its "
                "readers were processed; the graph's node order is not topological"
            )
        view = target if isinstance(target, AliasSymbol) else None
        self.parts.setdefault(root, []).append((view, grad))

    def of_root(self, root: int) -> Symbol | None:
        if root not in self.done:
            self.done[root] = self._sum(root)
        return self.done[root]

    def of(self, sym: Symbol) -> Symbol | None:
        """The gradient of a symbol; for a view, the same view of the root's gradient."""
        g = self.of_root(sym.root)
        if g is None or not isinstance(sym, AliasSymbol):
            return g
        return self.b.alias(g, sym.shape, stride=sym.stride, base=sym.base)

    def _sum(self, root: int) -> Symbol | None:
        parts = self.parts.pop(root, [])
        if not parts:
            return None
        spec = self.graph.spec(root)
        terms = [g for view, g in parts if view is None]
        views = [(view, g) for view, g in parts if view is not None]
        for repeats, group in disjoint_groups(views):
            terms.append(self._scattered(spec, group, repeats))
        return terms[0] if len(terms) == 1 else self.b.exec(ops.ewsum(), *terms)

    def _scattered(
        self, spec: Any, group: list[tuple[AliasSymbol, Symbol]], repeats: bool
    ) -> Symbol:
        """The root-shaped gradient of a group of views (:func:`disjoint_groups`): the
        gradients of disjoint views written through them into one zero tensor, or, for a
        view that reads an element more than once, its gradient added up per element."""
        (view, g), *_ = group
        if repeats:  # a write through the view would keep one contribution
            n = int(np.prod(spec.shape, dtype=np.int64))
            flat = self.b.exec(ops.reshape(shape=(size(view),)), g)
            where = self.b.constant(view.flat_indices().reshape(-1).astype(np.int32))
            total = self.b.exec(ops.scatter_add(bincount=n), flat, where)
            return self.b.exec(ops.reshape(shape=tuple(spec.shape)), total)
        whole = self.b.tensor(spec.shape, spec.dtype)
        for view, g in group:
            target = self.b.alias(whole, view.shape, stride=view.stride, base=view.base)
            self.b.exec(ops.data_transfer(), g, outputs=[target])
        return whole


def _seed_constant(b: GraphBuilder, graph: Graph, sid: int, seed: Any) -> Symbol:
    """An array seed as a constant of ``f``'s dtype (its shape is checked by _seed)."""
    spec = graph.spec(sid)
    value = np.asarray(seed)
    if not np.issubdtype(value.dtype, np.number) or value.shape != tuple(spec.shape):
        raise ShapeError(
            f"backward: df for f {graph.label(sid)} is an array of {value.dtype.name}"
            f"{list(value.shape)}, f is {np.dtype(spec.dtype).name}{list(spec.shape)}; "
            "pass an array of f's shape"
        )
    return b.constant(value.astype(spec.dtype))


def _seed(b: GraphBuilder, graph: Graph, sid: int, df: Symbol | None) -> Symbol:
    spec = graph.spec(sid)
    if df is not None:
        got = f"{np.dtype(df.dtype).name}{list(df.shape)}"
        want = f"{np.dtype(spec.dtype).name}{list(spec.shape)}"
        if tuple(df.shape) != tuple(spec.shape):
            raise ShapeError(f"backward: df for f {graph.label(sid)} is {got}, f is {want}")
        if np.dtype(df.dtype) != np.dtype(spec.dtype):
            raise DTypeError(
                f"backward: df for f {graph.label(sid)} is {got}, f is {want}; convert the "
                "seed to f's dtype (ops.datatype_conversion)"
            )
        return df
    if int(np.prod(spec.shape)) != 1:
        raise ShapeError(
            f"backward: f {graph.label(sid)} is {np.dtype(spec.dtype).name}{list(spec.shape)}, "
            "not a scalar; pass df= (a seed gradient of f's shape) or reduce f to one element"
        )
    return b.exec(ops.set(shape=spec.shape, dtype=np.dtype(spec.dtype), value=1.0))


def _differentiate_node(
    b: GraphBuilder, graph: Graph, node: Node, depends: set[int], grads: _Grads
) -> None:
    sym = graph.symbols
    out_grads = [grads.of(sym[o]) for o in node.outputs]
    if all(g is None for g in out_grads):
        return
    wants = tuple(
        i
        for i, s in enumerate(node.inputs)
        if sym[s].root in depends and jnp.issubdtype(sym[s].dtype, jnp.inexact)
    )
    if not wants:
        return
    uses = node.cmd.definition.backward_uses
    cmd = gradient_command(
        node.cmd,
        tuple(sym[s].spec for s in node.inputs),
        tuple(sym[s].spec for s in node.outputs),
        tuple(g is not None for g in out_grads),
        wants,
    )
    args = [g for g in out_grads if g is not None]
    args += [sym[s] for i, s in enumerate(node.inputs) if uses.input_used(i)]
    args += [sym[s] for i, s in enumerate(node.outputs) if i in uses.outputs]
    name = f"{node.name}.backward" if node.name else ""
    out = b.exec(cmd, *args, name=name)
    outs = out if isinstance(out, tuple) else (out,)
    for i, g in zip(wants, outs):
        grads.add(sym[node.inputs[i]], g)


def backward(
    graph: Graph,
    f: Any,
    wrt: Any,
    *,
    df: Sequence[Any] | Any | None = None,
) -> tuple[Graph, tuple[Symbol, ...]]:
    """Appends the gradient of ``f`` with respect to ``wrt`` to ``graph``.

    Args:
        graph: the forward graph.
        f: one symbol (or its id, or its name) or several; gradients of several ``f``
            add up.
        wrt: the symbols (or ids, or names) to differentiate with respect to.
        df: seed gradients, one per ``f`` (symbols of the graph, shaped like ``f``,
            or arrays of ``f``'s shape, which become constants: NNC's seed written into
            the gradient tensor); default ones, which requires each ``f`` to have one
            element.

    Returns:
        ``(new_graph, grads)``: the new graph returns ``graph.outputs`` then the
        gradients; ``grads[i]`` is the gradient symbol of ``wrt[i]`` in it.

    >>> import numpy as np
    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder, interpret
    >>> from fnnc.graph.passes.backward import backward
    >>> b = GraphBuilder()
    >>> x = b.input((), name="x")
    >>> w = b.exec(ops.ewprod(), x, x)
    >>> u = b.exec(ops.ewdiv(), b.constant(np.float32(1)), x)
    >>> z = b.exec(ops.ewsum(), w, b.exec(ops.ewlog(), u))
    >>> g, (dx,) = backward(b.build([z]), z, [x])
    >>> round(float(interpret(g, np.float32(0.84))[1]), 6)   # 2x - 1/x
    0.489524
    """
    fs, ws = _ids(graph, f, "f"), _ids(graph, wrt, "wrt")
    for sid in ws:
        s = graph.symbols[sid]
        if not jnp.issubdtype(s.dtype, jnp.inexact):
            raise DTypeError(
                f"backward: wrt {graph.label(sid)} is {np.dtype(s.dtype).name}, which has no "
                "gradient; differentiate with respect to floating-point tensors"
            )
    dfs: list[Any] = [None] * len(fs)
    if df is not None:
        dfs = list(df) if isinstance(df, (list, tuple)) else [df]
        if len(dfs) != len(fs):
            raise GraphError(f"backward: {len(fs)} f but {len(dfs)} df; pass one seed per f")
    b = GraphBuilder.from_graph(graph)
    grads = _Grads(b, graph)
    for sid, seed in zip(fs, dfs):
        if isinstance(seed, (np.ndarray, np.floating, float, jax.Array)):
            s = _seed_constant(b, graph, sid, seed)
        else:
            s = None if seed is None else graph.symbols[_ids(graph, seed, "df")[0]]
        grads.add(graph.symbols[sid], _seed(b, graph, sid, s))
    depends, on_path = _relevant_nodes(graph, fs, ws)
    for index in on_path:
        _differentiate_node(b, graph, graph.nodes[index], depends, grads)
    results = []
    for sid in ws:
        g = grads.of(graph.symbols[sid])
        if g is None:
            spec = graph.spec(sid)
            g = b.exec(ops.set(shape=spec.shape, dtype=np.dtype(spec.dtype), value=0.0))
        results.append(g)
    new = b.build([*(graph.symbols[o] for o in graph.outputs), *results])
    return new, tuple(results)
