"""Eager, lazy and compiled execution agree on random graphs replayed through a DynamicGraph.

A graph drawn by :func:`tests.graph.strategies.graphs` is replayed node by node: its
inputs become variables, its aliases alias variables, a node writing an alias writes
through it (a new version of the root). The values must equal ``compile(graph)``'s,
and the gradients of the first output must equal the ``backward`` pass applied to the
drawn graph directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import given, settings

from fnnc.core.ir import AliasSymbol
from fnnc.graph import DynamicGraph, Graph, GraphBuilder, compile, interpret
from fnnc.graph.passes.backward import backward
from tests.graph.strategies import graphs
from tests.helpers import assert_close

SETTINGS = settings(max_examples=25)


def replay(dg: DynamicGraph, graph: Graph, arrays: Any) -> Callable[[int], Any]:
    """Runs ``graph``'s nodes through ``dg``; returns the variable of a symbol id."""
    env: dict[int, Any] = {sid: dg.variable(a) for sid, a in zip(graph.inputs, arrays)}

    def var(sid: int) -> Any:
        if sid not in env:
            sym = graph.symbols[sid]
            if isinstance(sym, AliasSymbol):
                env[sid] = dg.alias(var(sym.root), sym.shape, stride=sym.stride, base=sym.base)
            else:  # a tensor written only through aliases: unwritten parts read as zeros
                env[sid] = dg.variable(np.zeros(sym.shape, sym.dtype))
        return env[sid]

    for node in graph.nodes:
        ins = [var(s) for s in node.inputs]
        if any(graph.symbols[o].is_alias for o in node.outputs):
            dg.exec(node.cmd, *ins, outputs=[var(o) for o in node.outputs])
            continue
        outs = dg.exec(node.cmd, *ins)
        for sid, v in zip(node.outputs, outs if isinstance(outs, tuple) else (outs,)):
            env[sid] = v
    return var


@SETTINGS
@given(graphs(max_nodes=8))
def test_eager_lazy_and_compiled_agree(case) -> None:
    graph, arrays = case
    want = compile(graph)(*arrays)
    want = want if isinstance(want, tuple) else (want,)
    for lazy in (False, True):
        dg = DynamicGraph(lazy=lazy)
        var = replay(dg, graph, arrays)
        got = [var(s).numpy() for s in graph.outputs]
        assert_close(got, list(want), rtol=1e-5, atol=1e-5, what=f"lazy={lazy}\n{graph}")


@SETTINGS
@given(graphs(max_nodes=6))
def test_gradients_agree_with_the_backward_pass(case) -> None:
    graph, arrays = case
    b = GraphBuilder.from_graph(graph)
    f = graph.symbols[graph.outputs[0]]
    seed = b.input(f.shape, f.dtype)
    seeded = b.build([graph.symbols[s] for s in graph.outputs])
    wrt = [graph.symbols[s] for s in graph.inputs]
    full, _ = backward(seeded, [f], wrt, df=[seed])
    ones = np.ones(f.shape, np.float32)
    want = interpret(full, *arrays, ones)[len(graph.outputs) :]
    dg = DynamicGraph()
    var = replay(dg, graph, arrays)
    got = dg.backward(var(f.id), [var(s) for s in graph.inputs], df=ones)
    assert_close([g.numpy() for g in got], list(want), rtol=1e-4, atol=1e-4, what=str(graph))
