"""Sub-graphs held in command hyper-parameters, and what passes need to know about them.

Commands such as ``fused_elementwise`` (and NNC's while / case..of) carry whole
:class:`~fnnc.graph.Graph` values among their hyper-parameters: a parameter that is a
graph, a tuple holding graphs (nested tuples too), or a command value holding them
(``gradient[of=fused_elementwise[...]]``). :func:`map_subgraphs` runs a pass over all
of them, so every pass applies inside sub-graphs without knowing any such command.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable, Container, Iterator
from typing import Any

from fnnc.core.ir import Graph
from fnnc.ops import Command

GraphPass = Callable[[Graph], Graph]


def map_subgraphs(graph: Graph, fn: GraphPass, *, skip: Container[str] = ()) -> Graph:
    """Applies ``fn`` to every sub-graph held in a node's command hyper-parameters.

    Commands are rebuilt with :func:`dataclasses.replace`; sub-graphs of sub-graphs are
    left to ``fn`` itself (a pass that calls ``map_subgraphs`` recurses naturally).

    Args:
        graph: the graph whose nodes' commands are searched.
        fn: a pass, ``Graph -> Graph``; it must keep a sub-graph's input and output
            specs (every simplifying pass does), and its values where a ``scan`` or
            ``pipeline`` holds a backward body derived from its block (a rewrite that
            changes values derives it again: :func:`~fnnc.graph.graph_rewrite`).
        skip: names of commands whose sub-graphs are left alone.

    Returns:
        ``graph`` itself when ``fn`` changed no sub-graph, else a graph whose nodes hold
        the rewritten commands.

    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.input((2,))
    >>> g = b.build([b.exec(ops.relu(), x)])
    >>> map_subgraphs(g, lambda sub: sub) is g
    True
    """
    nodes = []
    for node in graph.nodes:
        cmd = _map_command(node.cmd, fn, skip)
        nodes.append(node if cmd is node.cmd else dataclasses.replace(node, cmd=cmd))
    if all(new is old for new, old in zip(nodes, graph.nodes)):
        return graph
    return dataclasses.replace(graph, nodes=tuple(nodes))


@functools.lru_cache(maxsize=1 << 16)
def holds_subgraphs(cmd: Command) -> bool:
    """Whether any hyper-parameter of ``cmd`` holds a graph (cached per command value:
    passes ask for every node in every round, and most commands hold none)."""
    return next(subgraphs(cmd), None) is not None


def _map_command(cmd: Command, fn: GraphPass, skip: Container[str]) -> Command:
    if cmd.name in skip or not holds_subgraphs(cmd):
        return cmd
    params = tuple((key, _map_value(value, fn, skip)) for key, value in cmd.params)
    if all(new[1] is old[1] for new, old in zip(params, cmd.params)):
        return cmd
    return dataclasses.replace(cmd, params=params)


def _map_value(value: Any, fn: GraphPass, skip: Container[str]) -> Any:
    if isinstance(value, Graph):
        return fn(value)
    if isinstance(value, Command):
        return _map_command(value, fn, skip)
    if isinstance(value, tuple):
        items = tuple(_map_value(v, fn, skip) for v in value)
        return value if all(new is old for new, old in zip(items, value)) else items
    return value


def subgraphs(cmd: Command) -> Iterator[Graph]:
    """The graphs held in ``cmd``'s hyper-parameters (not their own sub-graphs)."""
    stack = collections.deque(v for _, v in cmd.params)
    while stack:
        value = stack.popleft()
        if isinstance(value, Graph):
            yield value
        elif isinstance(value, Command):
            stack.extend(v for _, v in value.params)
        elif isinstance(value, tuple):
            stack.extend(value)


def _any_node(cmd: Command, attribute: str) -> bool:
    if getattr(cmd.definition.attributes, attribute):
        return True
    if not holds_subgraphs(cmd):
        return False
    return any(_any_node(node.cmd, attribute) for g in subgraphs(cmd) for node in g.nodes)


def has_effects(cmd: Command) -> bool:
    """Whether ``cmd`` or any command inside its sub-graphs has effects (DCE keeps it)."""
    return _any_node(cmd, "has_effects")


def is_random(cmd: Command) -> bool:
    """Whether ``cmd`` or any command inside its sub-graphs draws random numbers."""
    return _any_node(cmd, "random")


def is_pure(cmd: Command) -> bool:
    """Neither random nor effectful: equal inputs give equal outputs, unused ones can go."""
    return not (is_random(cmd) or has_effects(cmd))
