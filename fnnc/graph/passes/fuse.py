"""fuse: NNC's fusions, as patterns (softmax + cross-entropy) and elementwise chains.

The loss fusions are written with the rewrite toolkit users get: a
:class:`~fnnc.graph.Pat` finds the pair, a :class:`~fnnc.graph.Rewriter` replaces the
loss node by the fused one (writing the activation's result too), removes the
activation and, after ``backward``, turns the pair's gradient nodes into one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from fnnc import ops
from fnnc.core.dtypes import is_floating
from fnnc.core.ir import AliasSymbol, Graph, Node, Symbol, require_graph
from fnnc.core.params import is_count
from fnnc.errors import GraphError
from fnnc.graph.builder import GraphBuilder
from fnnc.graph.matching import GraphSource, Match, match
from fnnc.graph.passes._subgraphs import is_pure, map_subgraphs
from fnnc.graph.passes.compact import compact
from fnnc.graph.pattern import Pat
from fnnc.ops.autodiff import gradient, gradient_command


@dataclasses.dataclass(frozen=True)
class Fusion:
    """A pattern's rewrite: ``node`` replaces the matched node, ``also`` replaces other
    nodes (index, node), and ``drop`` lists node indices that go (their outputs are
    written by the new nodes now or read by no one)."""

    node: Node
    drop: tuple[int, ...]
    also: tuple[tuple[int, Node], ...] = ()


Pattern = Callable[[Graph, int, Match], Fusion | None]


def private_producer(graph: Graph, sid: int, consumer: int, name: str) -> int | None:
    """Index of the ``name`` node writing ``sid`` when only node ``consumer`` reads it.

    ``sid`` must be a whole tensor (not a view, and with no views of it), not a graph
    output, and read by ``consumer`` alone, so the producer can be folded into it.
    """
    producer = _producer(graph, sid, name)
    private = set(graph.consumers.get(sid, ())) == {consumer}
    return producer if private else None


def _viewed(graph: Graph) -> set[int]:
    return {s.root for s in graph.symbols if isinstance(s, AliasSymbol)}


def _gradient_of(graph: Graph, index: int, of: Node) -> bool:
    """Whether node ``index`` is ``of``'s backward wanting only input 0's gradient from
    the gradient of ``of``'s only output (what the ``backward`` pass writes)."""
    node = graph.nodes[index]
    if node.cmd.name != gradient.definition.name:
        return False
    params = node.cmd.kwargs
    return (
        params["of"] == of.cmd
        and params["wants"] == (0,)
        and params["grad_mask"] == (True,)
        and len(of.outputs) == 1
    )


def _pair_backward(graph: Graph, index: int, act: int, fused: Node) -> Fusion | None:
    """The pair ``act(x) -> loss(p, label)`` after ``backward``: the activation's result
    ``p`` is read by the loss, by the loss's gradient node ``gl`` (``dp``) and by the
    activation's gradient node ``ga``, which reads ``dp`` alone. The fused node writes
    ``p`` and the loss, and ``ga`` becomes the fused command's gradient node, reading
    the loss's gradient: ``gl`` goes (NNC keeps both forward nodes' backwards instead).
    """
    loss, p = graph.nodes[index], graph.nodes[act].outputs[0]
    readers = [i for i in graph.consumers.get(p, ()) if i != index]
    if len(readers) != 2:
        return None
    for gl, ga in ((readers[0], readers[1]), (readers[1], readers[0])):
        g_loss, *read = graph.nodes[gl].inputs
        dp = graph.nodes[gl].outputs[0]
        if (
            _gradient_of(graph, gl, loss)
            and _gradient_of(graph, ga, graph.nodes[act])
            and tuple(read) == loss.inputs
            and graph.nodes[ga].inputs == (dp, p)
            and private_producer(graph, dp, ga, gradient.definition.name) == gl
            and index < ga
        ):
            break
    else:
        return None
    specs = tuple(graph.spec(s) for s in (*fused.inputs, *fused.outputs))
    n_in = len(fused.inputs)
    grad = gradient_command(fused.cmd, specs[:n_in], specs[n_in:], (True, False), (0,))
    uses = fused.cmd.definition.backward_uses
    args = [g_loss, *(s for i, s in enumerate(fused.inputs) if uses.input_used(i))]
    args += [s for i, s in enumerate(fused.outputs) if i in uses.outputs]
    old = graph.nodes[ga]
    return Fusion(fused, (act, gl), ((ga, Node(grad, tuple(args), old.outputs, old.name)),))


def _loss_pair(graph: Graph, index: int, act: int, fused: Node) -> Fusion | None:
    """The forward pair alone, or with its backward (:func:`_pair_backward`)."""
    if set(graph.consumers[graph.nodes[act].outputs[0]]) == {index}:
        return Fusion(fused, (act,))
    return _pair_backward(graph, index, act, fused)


def _producer(graph: Graph, sid: int, name: str) -> int | None:
    """The pure ``name`` node writing the whole tensor ``sid``, unviewed, not an output."""
    producer = graph.producers.get(sid)
    if producer is None or graph.nodes[producer].cmd.name != name:
        return None
    whole = not graph.symbol(sid).is_alias and sid not in _viewed(graph)
    ok = whole and sid not in graph.outputs and is_pure(graph.nodes[producer].cmd)
    return producer if ok else None


def _activation_loss(activation: str, loss: str) -> Pat:
    """``loss(activation(x), label)``, the activation a pure node (captured as ``p``)."""
    act = Pat.op(activation, Pat.var("x"), name="p", attrs=("pure",))
    return Pat.op(loss, act, Pat.var("label"), ordered=True)


def _private_activation(graph: Graph, m: Match) -> int | None:
    """The index of the node writing ``p`` when ``p`` is unviewed, not an output and not
    the label too (``binary_crossentropy(p, p)``, the entropy of ``p``: the fused node
    would read the ``p`` it writes)."""
    p = m["p"].id
    if p in graph.outputs or p in _viewed(graph) or m["label"].id == p:
        return None
    return graph.producers[p]


def _softmax_crossentropy(graph: Graph, index: int, m: Match) -> Fusion | None:
    """``categorical_crossentropy(softmax(x), label)`` -> ``softmax_crossentropy(x, label)``.

    Only for class-index labels whose targets sum to 1 (``trim1 + (C - 1) * trim0 ==
    1``): softmax_crossentropy's loss is ``logsumexp(x) - sum(t * x)``, which equals the
    pair's ``-sum(t * log softmax(x))`` exactly then, and its gradient ``softmax - t``
    equals the pair's backward.
    """
    node = graph.nodes[index]
    p, label = m["p"], m["label"]
    producer = _private_activation(graph, m)
    if producer is None:
        return None
    softmax = graph.nodes[producer]
    axis, rank = softmax.cmd.param("axis"), len(p.shape)
    trim0, trim1 = node.cmd.param("trim0"), node.cmd.param("trim1")
    targets = is_floating(label.dtype) and label.shape == p.shape
    if axis % rank != rank - 1 or targets:
        return None
    if not math.isclose(trim1 + (p.shape[-1] - 1) * trim0, 1.0, rel_tol=1e-6):
        return None
    cmd = ops.softmax_crossentropy(trim0=trim0, trim1=trim1)
    fused = Node(cmd, (softmax.inputs[0], label.id), (node.outputs[0], p.id), node.name)
    return _loss_pair(graph, index, producer, fused)


def _sigmoid_binary_crossentropy(graph: Graph, index: int, m: Match) -> Fusion | None:
    """``binary_crossentropy(sigmoid(x), y)`` -> ``sigmoid_binary_crossentropy(x, y)``."""
    node = graph.nodes[index]
    producer = _private_activation(graph, m)
    if producer is None:
        return None
    cmd = ops.sigmoid_binary_crossentropy(pos_weight=node.cmd.param("pos_weight"))
    fused = Node(cmd, (m["x"].id, m["label"].id), (node.outputs[0], m["p"].id), node.name)
    return _loss_pair(graph, index, producer, fused)


PATTERNS: dict[str, tuple[Pat, Pattern]] = {
    "binary_crossentropy": (
        _activation_loss("sigmoid", "binary_crossentropy"),
        _sigmoid_binary_crossentropy,
    ),
    "categorical_crossentropy": (
        _activation_loss("softmax", "categorical_crossentropy"),
        _softmax_crossentropy,
    ),
}
"""Per command, a pattern ending at a node of that command (NNC's fused losses) and the
fusion it makes of a match."""

Inline = Callable[[GraphBuilder, Node, list[Symbol]], Symbol]


def _exec(b: GraphBuilder, node: Node, inputs: list[Symbol]) -> Symbol:
    return b.exec(node.cmd, *inputs, name=node.name)


def _inline_body(b: GraphBuilder, node: Node, inputs: list[Symbol]) -> Symbol:
    """A fused node joins a longer chain with its body's nodes, not nested."""
    body = node.cmd.param("body")
    env: dict[int, Symbol] = dict(zip(body.inputs, inputs))
    for inner in body.nodes:
        env[inner.outputs[0]] = _exec(b, inner, [env[s] for s in inner.inputs])
    return env[body.outputs[0]]


def _flat_body(node: Node) -> bool:
    body = node.cmd.param("body")
    return len(body.outputs) == 1 and all(
        len(n.outputs) == 1 and not body.symbol(n.outputs[0]).is_alias for n in body.nodes
    )


MEMBERS: dict[str, tuple[Callable[[Node], bool], Inline]] = {
    "fused_elementwise": (_flat_body, _inline_body),
}
"""Commands that may sit in a chain besides the ``elementwise`` ones (the command
attribute, :class:`fnnc.ops.Attributes`): when they may, and how they enter the body."""


def _inline_rule(node: Node) -> Inline | None:
    """How ``node`` enters a chain's body, or ``None`` if it cannot join one."""
    rule = MEMBERS.get(node.cmd.name)
    if rule is not None:
        return rule[1] if rule[0](node) else None
    return _exec if node.cmd.definition.attributes.elementwise else None


FUSED = frozenset({"fused_elementwise"})
"""Commands whose sub-graphs are already fused chains; ``fuse`` does not enter them."""


def fuse(graph: Graph, *, min_length: int = 2) -> Graph:
    """Fuses NNC's patterns (:data:`PATTERNS`) and maximal elementwise chains.

    1. Patterns, e.g. ``softmax`` whose only reader is ``categorical_crossentropy``
       becomes one ``softmax_crossentropy`` node (it writes the loss and, for free, the
       softmax), and ``sigmoid`` + ``binary_crossentropy`` becomes
       ``sigmoid_binary_crossentropy``. The intermediate must not be a graph output or
       be read by anything else, except, after ``backward``, by the pair's gradient
       nodes: those two become the fused command's one gradient node.
    2. Chains: nodes of ``elementwise`` commands (pure, one output) join the node
       that reads their result when every reader of it is in the same tree (so
       ``s = sigmoid(x); ewdiv(s, ewabs(s))`` is one node), it is not a graph output
       and has that node's output shape. Each maximal tree of at least
       ``min_length`` nodes becomes one ``fused_elementwise`` node, placed where the
       tree's last node was, whose ``body`` is the tree as a sub-graph; its inputs are
       the tree's outside inputs (biases broadcast inside the body).

    Sub-graphs are fused too, except the bodies of fused nodes (:data:`FUSED`).

    Needs: a verified graph.

    Guarantees: the same graph object when nothing fused; otherwise a compacted graph
    with the same inputs and outputs and the same values (up to the rounding of a
    fused computation). ``fuse(fuse(g)) is fuse(g)``.

    Before / after (a dense layer with a bias and gelu)::

        graph(%0:f32[2,3] x, %1:f32[4,3] w, %2:f32[4] b) {
          %3:f32[2,4] = gemm[transpose_b=True](%0, %1)
          %4:f32[2,4] = add(%3, %2)
          %5:f32[2,4] = gelu(%4)
          return %5
        }
        graph(%0:f32[2,3] x, %1:f32[4,3] w, %2:f32[4] b) {
          %3:f32[2,4] = gemm[transpose_b=True](%0, %1)
          %4:f32[2,4] = fused_elementwise[add, gelu](%3, %2)
          return %4
        }

    Args:
        graph: the graph.
        min_length: fewest nodes a fused chain has.
    """
    require_graph(graph, "fuse")
    if not is_count(min_length, 1):
        raise GraphError(
            f"fuse: min_length is the fewest nodes a chain has, an int >= 1; got {min_length!r}"
        )
    graph = map_subgraphs(graph, lambda sub: fuse(sub, min_length=min_length), skip=FUSED)
    fused = _chains(_patterns(graph), min_length)
    return graph if fused is graph else compact(fused)


def _patterns(graph: Graph) -> Graph:
    from fnnc.graph.rewrite import Rewriter  # it uses passes; this package loads it later

    source = GraphSource(graph)
    edit = Rewriter(graph, name="fuse")
    touched_so_far: set[int] = set()
    for index, node in enumerate(graph.nodes):
        entry = PATTERNS.get(node.cmd.name)
        m = match(entry[0], source, node.outputs[0]) if entry is not None else None
        fusion = entry[1](graph, index, m) if m is not None else None  # type: ignore[index]
        if fusion is None:
            continue
        touched = {index, *fusion.drop, *(i for i, _ in fusion.also)}
        if touched.isdisjoint(touched_so_far):
            touched_so_far |= touched
            for i, new in ((index, fusion.node), *fusion.also):
                edit.replace_node(i, new.cmd, *new.inputs, outputs=new.outputs)
            for i in fusion.drop:
                edit.remove(i)
    return edit.finish(dead_code=False, check=False)  # run_passes verifies


def _member(graph: Graph, node: Node) -> bool:
    return (
        len(node.outputs) == 1
        and not graph.symbol(node.outputs[0]).is_alias
        and is_pure(node.cmd)
        and _inline_rule(node) is not None
    )


def _chains(graph: Graph, min_length: int) -> Graph:
    viewed = _viewed(graph)
    groups: dict[int, list[int]] = {}  # index of a tree's last node -> its node indices
    for index, node in enumerate(graph.nodes):
        if not _member(graph, node):
            continue
        shape = graph.symbol(node.outputs[0]).shape
        group = {index}
        # A producer joins when every reader of its result is in the group; merging one
        # can make another's readers all members (``f(s, g(s))``: s joins after g), so
        # candidates are looked at again until none joins: one run reaches the fixpoint.
        grown = True
        while grown:
            grown = False
            for sid in dict.fromkeys(s for i in sorted(group) for s in graph.nodes[i].inputs):
                producer = graph.producers.get(sid)
                if (
                    producer in groups
                    and not graph.symbol(sid).is_alias
                    and sid not in viewed
                    and sid not in graph.outputs
                    and set(graph.consumers[sid]) <= group
                    and graph.symbol(sid).shape == shape
                ):
                    group.update(groups.pop(producer))
                    grown = True
        groups[index] = sorted(group)
    trees = {last: g for last, g in groups.items() if len(g) >= max(min_length, 2)}
    if not trees:
        return graph
    inside = {i for g in trees.values() for i in g}
    nodes = [
        _fused_node(graph, trees[i]) if i in trees else node
        for i, node in enumerate(graph.nodes)
        if i in trees or i not in inside
    ]
    return dataclasses.replace(graph, nodes=tuple(nodes))


def _fused_node(graph: Graph, tree: list[int]) -> Node:
    """One ``fused_elementwise`` node computing the nodes ``tree`` (the last is the root)."""
    members = [graph.nodes[i] for i in tree]
    written = {n.outputs[0] for n in members}
    outside = list(dict.fromkeys(s for n in members for s in n.inputs if s not in written))
    b = GraphBuilder()
    env: dict[int, Symbol] = {}
    for sid in outside:
        sym = graph.symbol(sid)
        env[sid] = b.input(sym.shape, sym.dtype, name=sym.name)
    for node in members:
        inline = _inline_rule(node)
        env[node.outputs[0]] = inline(b, node, [env[s] for s in node.inputs])
    root = members[-1]
    body = b.build([env[root.outputs[0]]])
    return Node(ops.fused_elementwise(body=body), tuple(outside), root.outputs, root.name)
