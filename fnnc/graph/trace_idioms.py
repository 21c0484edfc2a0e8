"""Idioms: patterns of several traced commands that are one NNC command.

:func:`~fnnc.graph.trace` maps JAX equations one at a time
(:mod:`fnnc.graph.trace_rules`); code that spells an NNC command out in several
primitives is rewritten here, after the replay, on the graph:

* rotate-half, ``concatenate([-x2, x1])`` of the halves of ``x``'s last axis (RoPE):
  ``rotate_half(x)`` (NNC's swap) times a constant sign row ``[-1.., 1..]``;
* SiLU, ``a * sigmoid(a)`` (``jax.nn.silu``): ``swish(a)``;
* SwiGLU, ``silu(a) * u`` where the SiLU is read by that product alone:
  ``swish_mul(u, a)``;
* logsumexp as ``jax.nn.logsumexp`` / ``jax.scipy.special.logsumexp`` emit it (the
  maximum over ``axes``, made finite, held by ``stop_gradient``, subtracted, ``exp``,
  ``sum``, ``log``, added back): ``reduce_logsumexp(x, axes)`` (and a reshape
  unless ``keepdims=True``);
* JAX's descending sorts, reversals (``rev``, traced as ``index_select``) of an
  ascending stable sort: ``jnp.argsort(x, descending=True)`` as
  ``argsort(descending=True)``, and ``jnp.sort`` of integers as
  ``sort(descending=True)``.

Each rule is a function ``rule(rw, index) -> list[Node] | None`` of the node that ends
the pattern (:data:`IDIOMS`, keyed by its command); the nodes it returns replace that
node and write its outputs, and the pattern's other nodes are dropped by ``dce`` when
nothing else reads them. A rule matches only where the replacement computes the same
values (and the same gradient) as the code it replaces.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from fnnc.core.command import make_command
from fnnc.core.dtypes import is_floating
from fnnc.core.ir import Graph, Node, TensorSymbol
from fnnc.graph.passes.dce import dce
from fnnc.ops.constant import constant as constant_cmd


@dataclasses.dataclass
class Rewriter:
    """The graph being rewritten: what rules read (producers, constants) and make."""

    graph: Graph
    symbols: list[Any]
    writer: dict[int, Node]

    def node(self, sid: int, *names: str) -> Node | None:
        """The node writing ``sid`` if its command is one of ``names``."""
        node = self.writer.get(sid)
        return node if node is not None and node.cmd.name in names else None

    def value(self, sid: int) -> np.ndarray | None:
        node = self.node(sid, "constant")
        return None if node is None else node.cmd.param("value").numpy()

    def private(self, sid: int, reader: int) -> bool:
        """Whether node ``reader`` alone reads ``sid`` (and it is no graph output)."""
        return self.graph.consumers.get(sid) == [reader] and sid not in self.graph.outputs

    def shape(self, sid: int) -> tuple[int, ...]:
        return tuple(self.symbols[sid].shape)

    def dtype(self, sid: int) -> np.dtype:
        return np.dtype(self.symbols[sid].dtype)

    def tensor(self, shape: tuple[int, ...], dtype: Any) -> int:
        sid = len(self.symbols)
        self.symbols.append(TensorSymbol(sid, tuple(shape), np.dtype(dtype)))
        return sid


def command_node(
    name: str, inputs: tuple[int, ...], outputs: tuple[int, ...], label: str, **params: Any
) -> Node:
    """A node running command ``name(**params)``."""
    return Node(make_command(name, params), tuple(inputs), tuple(outputs), label)


def _rotate_half(rw: Rewriter, index: int) -> list[Node] | None:
    node = rw.graph.nodes[index]
    if len(node.inputs) != 2:
        return None
    neg, first = node.inputs
    (out,) = node.outputs
    shape = rw.shape(out)
    if not shape or node.cmd.param("axis") % len(shape) != len(shape) - 1 or shape[-1] % 2:
        return None
    scaled = rw.node(neg, "scalar_mul")
    if scaled is None or scaled.cmd.param("a") != -1.0:
        return None
    lo, hi = rw.node(first, "slice"), rw.node(scaled.inputs[0], "slice")
    if lo is None or hi is None or lo.inputs != hi.inputs:
        return None
    (x,) = lo.inputs
    half = shape[-1] // 2
    whole = rw.shape(x)
    if whole != shape or not is_floating(rw.dtype(x)):
        return None
    lead = (0,) * (len(shape) - 1)
    if not (_slice_is(lo, (*lead, 0), (*whole[:-1], half)) and _slice_is(hi, (*lead, half), whole)):
        return None
    sign = np.concatenate([-np.ones(half), np.ones(half)]).astype(rw.dtype(x))
    swapped, row = rw.tensor(shape, rw.dtype(x)), rw.tensor((shape[-1],), rw.dtype(x))
    return [
        command_node("rotate_half", (x,), (swapped,), node.name),
        Node(constant_cmd(sign), (), (row,), node.name),
        command_node("mul", (swapped, row), (out,), node.name),
    ]


def _slice_is(node: Node, start: tuple[int, ...], limit: tuple[int, ...]) -> bool:
    strides = node.cmd.param("strides")
    return (
        tuple(node.cmd.param("start")) == start
        and tuple(node.cmd.param("limit")) == limit
        and (strides is None or set(strides) == {1})
    )


def _silu_of(rw: Rewriter, a: int, s: int) -> bool:
    sig = rw.node(s, "sigmoid")
    return sig is not None and sig.inputs == (a,)


def _swish(rw: Rewriter, index: int) -> list[Node] | None:
    """``a * sigmoid(a)``, or ``swish(a) * u`` as ``swish_mul(u, a)``."""
    node = rw.graph.nodes[index]
    if len(node.inputs) != 2 or node.cmd.param("p") != 1.0:
        return None
    (out,) = node.outputs
    for a, s in (node.inputs, node.inputs[::-1]):
        if _silu_of(rw, a, s) and rw.shape(a) == rw.shape(out):
            return [command_node("swish", (a,), (out,), node.name, beta=1.0)]
    for p, u in (node.inputs, node.inputs[::-1]):
        gate = rw.node(p, "swish")
        if gate is None or gate.cmd.param("beta") != 1.0 or not rw.private(p, index):
            continue
        (a,) = gate.inputs
        if rw.shape(a) == rw.shape(u) == rw.shape(out) and rw.dtype(a) == rw.dtype(u):
            return [command_node("swish_mul", (u, a), (out,), node.name)]
    return None


def _through_reshape(rw: Rewriter, sid: int) -> int:
    """The tensor ``sid`` reshapes or broadcasts (through several), else ``sid``."""
    while (node := rw.node(sid, "reshape", "broadcast_to")) is not None:
        sid = node.inputs[0]
    return sid


def _logsumexp(rw: Rewriter, index: int) -> list[Node] | None:
    """``log(|sum(exp(x - f))|) + f`` with ``f = stop_gradient(m if finite else 0)``
    and ``m`` the maximum of ``x`` over the summed axes: ``reduce_logsumexp``."""
    node = rw.graph.nodes[index]
    if len(node.inputs) != 2 or (node.cmd.param("p"), node.cmd.param("q")) != (1.0, 1.0):
        return None
    (out,) = node.outputs
    for logged, f in (node.inputs, node.inputs[::-1]):
        match = _logsumexp_parts(rw, logged, f)
        if match is not None:
            x, axes = match
            kept = tuple(1 if d in axes else n for d, n in enumerate(rw.shape(x)))
            if kept == rw.shape(out):  # keepdims=True
                return [command_node("reduce_logsumexp", (x,), (out,), node.name, axes=axes)]
            y = rw.tensor(kept, rw.dtype(x))
            return [
                command_node("reduce_logsumexp", (x,), (y,), node.name, axes=axes),
                command_node("reshape", (y,), (out,), node.name, shape=rw.shape(out)),
            ]
    return None


def _logsumexp_parts(rw: Rewriter, logged: int, f: int) -> tuple[int, tuple[int, ...]] | None:
    log = rw.node(logged, "ewlog")
    if log is None:
        return None
    total = log.inputs[0]
    absolute = rw.node(total, "ewabs")
    total = _through_reshape(rw, absolute.inputs[0] if absolute is not None else total)
    summed = rw.node(total, "reduce_sum")
    exp = summed and rw.node(summed.inputs[0], "ewexp")
    shifted = exp and rw.node(exp.inputs[0], "add")
    if shifted is None or (shifted.cmd.param("p"), shifted.cmd.param("q")) != (1.0, -1.0):
        return None
    x, held = shifted.inputs
    axes = tuple(sorted(int(a) % len(rw.shape(x)) for a in summed.cmd.param("axes")))
    # The shift must line up with the summed axes: kept as size 1, the others in place.
    while (spread := rw.node(held, "broadcast_to")) is not None:
        held = spread.inputs[0]
    kept = tuple(1 if d in axes else n for d, n in enumerate(rw.shape(x)))
    if rw.shape(held) != kept:
        return None
    if _through_reshape(rw, held) != f or not _finite_max_of(rw, f, x, axes):
        return None
    return x, axes


def _finite_max_of(rw: Rewriter, f: int, x: int, axes: tuple[int, ...]) -> bool:
    """``f = stop_gradient(select(|m| < inf, m, 0))``, ``m`` the maximum of ``x`` over
    ``axes`` (possibly through ``max(-inf, .)`` and reshapes): finite, so the shift
    cancels exactly in ``log(sum(exp(x - f))) + f``."""
    held = rw.node(f, "stop_gradient")
    chosen = held and rw.node(held.inputs[0], "select")
    if chosen is None:
        return False
    cond, m, fallback = chosen.inputs
    zero = rw.value(_through_reshape(rw, fallback))
    if zero is None or not np.all(np.isfinite(zero)):
        return False
    test = rw.node(cond, "compare")
    size = test and rw.node(test.inputs[0], "ewabs")
    bound = rw.value(test.inputs[1]) if test is not None else None
    if size is None or test.cmd.param("op") != "lt" or size.inputs != (m,) or bound is None:
        return False
    if not np.all(np.isposinf(bound)):
        return False
    m = _through_reshape(rw, m)  # keepdims: the maximum reshaped to the kept shape
    top = rw.node(m, "max")
    if top is not None:
        low = [i for i in top.inputs if (v := rw.value(i)) is not None and np.all(np.isneginf(v))]
        if len(low) != 1:
            return False
        m = next(i for i in top.inputs if i != low[0])
    peak = rw.node(_through_reshape(rw, m), "reduce_max")
    return (
        peak is not None
        and peak.inputs == (x,)
        and tuple(sorted(int(a) % len(rw.shape(x)) for a in peak.cmd.param("axes"))) == axes
    )


def _reversed_along(rw: Rewriter, node: Node) -> tuple[int, int] | None:
    """``(x, axis)`` when ``node`` is ``index_select(x, [n-1, ..., 0], axis)``: ``x``
    reversed along ``axis`` (how the trace spells JAX's ``rev``)."""
    if node.cmd.name != "index_select" or len(node.inputs) != 2:
        return None
    x, idx = node.inputs
    shape = rw.shape(x)
    if not shape:
        return None
    axis = int(node.cmd.param("axis")) % len(shape)
    back = rw.value(idx)
    n = shape[axis]
    if back is None or back.shape != (n,) or not np.issubdtype(back.dtype, np.integer):
        return None
    return (x, axis) if np.array_equal(back, np.arange(n - 1, -1, -1)) else None


def _sorted_by(rw: Rewriter, sid: int, output: int, axis: int) -> Node | None:
    """The ascending ``sort`` along ``axis`` whose output ``output`` is ``sid``."""
    node = rw.node(sid, "sort")
    if node is None or node.outputs[output] != sid or node.cmd.param("descending"):
        return None
    rank = len(rw.shape(node.inputs[0]))
    return node if int(node.cmd.param("axis")) % rank == axis else None


def _descending_sort(rw: Rewriter, index: int) -> list[Node] | None:
    """JAX's descending sorts, ``rev`` of an ascending stable sort along its axis.

    * ``jnp.argsort(x, descending=True)``: ``rev(n - 1 - sort(rev(x)).indices)``, the
      indices of a stable descending sort (ties in input order): one
      ``argsort(descending=True)``, which computes exactly that (including NaNs).
    * ``jnp.sort(x, descending=True)`` of integers: ``rev(sort(x).values)``, equal
      entries being indistinguishable: ``sort(descending=True)``'s values. Floats stay
      ``sort`` then a reversal: ``-0.0`` and ``0.0`` (and NaNs) tie, and so do equal
      values for the gradient, which reaches the entry JAX's reversal picked.
    """
    node = rw.graph.nodes[index]
    rev = _reversed_along(rw, node)
    if rev is None:
        return None
    sid, axis = rev
    (out,) = node.outputs
    n = rw.shape(sid)[axis]
    flipped = rw.node(sid, "add")
    if flipped is not None and (flipped.cmd.param("p"), flipped.cmd.param("q")) == (1.0, -1.0):
        last, perm = flipped.inputs
        value = rw.value(last)
        order = _sorted_by(rw, perm, 1, axis)
        inner = order and rw.node(order.inputs[0], "index_select")
        source = inner and _reversed_along(rw, inner)
        last_is = value is not None and value.size == 1 and int(value.reshape(())) == n - 1
        if last_is and source is not None and source[1] == axis:
            x = source[0]
            return [command_node("argsort", (x,), (out,), node.name, axis=axis, descending=True)]
    order = _sorted_by(rw, sid, 0, axis)
    if order is None or not np.issubdtype(rw.dtype(sid), np.integer):
        return None
    unused = rw.tensor(rw.shape(sid), np.int32)
    return [
        command_node("sort", order.inputs, (out, unused), node.name, axis=axis, descending=True)
    ]


Idiom = Callable[[Rewriter, int], "list[Node] | None"]

IDIOMS: dict[str, tuple[Idiom, ...]] = {
    "concat": (_rotate_half,),
    "mul": (_swish,),
    "add": (_logsumexp,),
    "index_select": (_descending_sort,),
}
"""Per command, the idioms that end at a node of that command."""


def rewrite_idioms(graph: Graph) -> Graph:
    """``graph`` with every :data:`IDIOMS` pattern replaced by its command.

    Needs: a graph from :func:`~fnnc.graph.trace` (no aliases among the matched nodes).

    Guarantees: the same object when no idiom matched; otherwise a graph with the same
    inputs, outputs and values, the replaced patterns' dead nodes removed (``dce``).
    ``rewrite_idioms(rewrite_idioms(g)) is rewrite_idioms(g)``.

    Before / after (``jax.nn.silu(a) * u``, SwiGLU)::

        graph(%0:f32[2,3] a, %1:f32[2,3] u) {     graph(%0:f32[2,3] a, %1:f32[2,3] u) {
          %2:f32[2,3] = sigmoid(%0)                  %2:f32[2,3] = swish_mul(%1, %0)
          %3:f32[2,3] = mul(%0, %2)                  return %2
          %4:f32[2,3] = mul(%3, %1)                }
          return %4
        }
    """
    rw = Rewriter(graph, list(graph.symbols), {})
    nodes: list[Node] = []
    changed = False
    for index, node in enumerate(graph.nodes):
        replacement = None
        for idiom in IDIOMS.get(node.cmd.name, ()):
            replacement = idiom(rw, index)
            if replacement is not None:
                break
        for new in replacement or [node]:
            nodes.append(new)
            rw.writer.update(dict.fromkeys(new.outputs, new))
        changed = changed or replacement is not None
    if not changed:
        return graph
    return dce(dataclasses.replace(graph, symbols=tuple(rw.symbols), nodes=tuple(nodes)))
