"""compile(g)(*xs) == interpret(g, *xs) == an independent NumPy evaluation, on random graphs.

The NumPy evaluator below shares nothing with fnnc's evaluator but the IR: it keeps one
float64 buffer per root symbol, reads and writes aliases through
``AliasSymbol.flat_indices()`` and runs each command from a table of NumPy functions.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import given, settings

from fnnc import ops
from fnnc.core.ir import AliasSymbol
from fnnc.graph import Graph, GraphBuilder, compile, interpret
from tests.graph.strategies import BOUND, OPS, graphs

SETTINGS = settings(max_examples=60)


def _gemm(a, b, bias=None, *, transpose_a, transpose_b):
    a = np.swapaxes(a, -1, -2) if transpose_a else a
    b = np.swapaxes(b, -1, -2) if transpose_b else b
    out = np.matmul(a, b)
    return out if bias is None else out + bias


def _clamp(x, *, min, max):
    lo = -np.inf if min is None else min
    hi = np.inf if max is None else max
    return np.minimum(np.maximum(x, lo), hi)


NUMPY: dict[str, Callable[..., np.ndarray]] = {
    "ewsum": lambda *xs: functools.reduce(np.add, xs),
    "ewprod": lambda *xs: functools.reduce(np.multiply, xs),
    "ewdiv": np.divide,
    "ewexp": np.exp,
    "ewlog": np.log,
    "ewsqrt": np.sqrt,
    "ewabs": np.abs,
    "clamp": _clamp,
    "min": lambda a, b, *, ties: np.minimum(a, b),  # ties: only the gradient's rule
    "max": lambda a, b, *, ties: np.maximum(a, b),
    "select": np.where,
    "gemm": _gemm,
    "add": lambda a, b, *, p, q: p * a + q * b,
    "mul": lambda a, b, *, p: p * a * b,
    "scalar_mul": lambda x, *, a: a * x,
    "constant": lambda *, value: np.array(value.numpy()),
}


def numpy_eval(graph: Graph, arrays: tuple[np.ndarray, ...]) -> list[np.ndarray]:
    """The graph's outputs computed in float64 NumPy, aliases through flat indices."""

    def wide(x: np.ndarray) -> np.ndarray:
        return x.astype(np.float64) if np.issubdtype(x.dtype, np.floating) else x

    buffers: dict[int, np.ndarray] = {}  # root id -> flat buffer
    for sid, x in zip(graph.inputs, arrays):
        buffers[sid] = wide(np.asarray(x)).reshape(-1).copy()

    def buffer(root: int) -> np.ndarray:
        sym = graph.symbols[root]
        if root not in buffers:  # written only through aliases: unwritten parts are 0
            dtype = np.float64 if np.issubdtype(sym.dtype, np.floating) else sym.dtype
            buffers[root] = np.zeros(int(np.prod(sym.shape)), dtype)
        return buffers[root]

    def read(sid: int) -> np.ndarray:
        sym = graph.symbols[sid]
        if isinstance(sym, AliasSymbol):
            return buffer(sym.root)[sym.flat_indices()]
        return buffer(sid).reshape(sym.shape)

    for node in graph.nodes:
        value = NUMPY[node.cmd.name](*(read(s) for s in node.inputs), **node.cmd.kwargs)
        (sid,) = node.outputs
        sym = graph.symbols[sid]
        value = wide(np.broadcast_to(value, sym.shape))
        if isinstance(sym, AliasSymbol):
            buffer(sym.root)[sym.flat_indices().reshape(-1)] = value.reshape(-1)
        else:
            buffers[sid] = value.reshape(-1).copy()
    return [read(s) for s in graph.outputs]


def _as_list(out: Any, n: int) -> list[Any]:
    return list(out) if n > 1 else [out]


def _check(got: list[Any], want: list[np.ndarray], rtol: float, atol: float, what: str) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert g.shape == w.shape, f"{what} output {i}: shape {g.shape} != {w.shape}"
        assert g.dtype == np.float32, f"{what} output {i}: dtype {g.dtype}"
        np.testing.assert_allclose(
            g.astype(np.float64), w, rtol=rtol, atol=atol, err_msg=f"{what} output {i}"
        )


def test_table_covers_every_numpy_command() -> None:
    assert {e.name for e in OPS} | {"constant"} == set(NUMPY)


def test_numpy_oracle_on_a_hand_built_graph() -> None:
    """The oracle itself against values worked out by hand."""
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    t = b.tensor((2, 4), name="t")
    left = b.alias(t, (2, 2), offset=(0, 0))
    right = b.alias(t, (2, 2), offset=(0, 2))
    b.exec(ops.scalar_mul(a=2.0), b.alias(x, (2, 2), offset=(0, 1)), outputs=[left])
    b.exec(ops.clamp(min=1.0), b.alias(x, (2, 2), offset=(0, 0)), outputs=[right])
    y = b.exec(ops.gemm(transpose_b=True), t, b.constant(np.ones((1, 4), np.float32)))
    graph = b.build([y, t])
    xs = (np.array([[0, 1, 2], [3, 4, 5]], np.float32),)
    want_t = np.array([[2, 4, 1, 1], [8, 10, 3, 4]], np.float64)
    got = numpy_eval(graph, xs)
    np.testing.assert_array_equal(got[1], want_t)
    np.testing.assert_array_equal(got[0], want_t.sum(1, keepdims=True))


@SETTINGS
@given(graphs())
def test_compile_equals_interpret_equals_numpy(case: tuple[Graph, tuple[np.ndarray, ...]]) -> None:
    graph, xs = case
    n = len(graph.outputs)
    want = numpy_eval(graph, xs)
    interpreted = _as_list(interpret(graph, *xs), n)
    compiled = _as_list(compile(graph)(*xs), n)
    # float32 against float64: errors stay near 1e-7 relative (measured over 1500 graphs)
    _check(interpreted, want, rtol=2e-5, atol=2e-5, what=f"interpret vs NumPy\n{graph}")
    _check(compiled, want, rtol=2e-5, atol=2e-5, what=f"compile vs NumPy\n{graph}")
    _check(
        compiled,
        [np.asarray(v, np.float64) for v in interpreted],
        rtol=2e-6,
        atol=2e-6,
        what=f"compile vs interpret\n{graph}",
    )
    for w in want:
        assert np.all(np.abs(w) <= BOUND), "the strategy's magnitude bound was broken"


def test_strategy_draws_every_feature() -> None:
    """The strategy really exercises the table, broadcasting, constants and aliases."""
    seen: collections.Counter[str] = collections.Counter()

    @settings(max_examples=500)  # 150 drew no constant over 16 elements in one test order
    @given(graphs())
    def collect(case: tuple[Graph, tuple[np.ndarray, ...]]) -> None:
        graph, xs = case
        assert [x.shape for x in xs] == [tuple(s.shape) for s in graph.input_specs]
        for node in graph.nodes:
            seen[node.cmd.name] += 1
            ins = [graph.symbols[i] for i in node.inputs]
            outs = [graph.symbols[i] for i in node.outputs]
            seen["alias read"] += any(s.is_alias for s in ins)
            seen["alias write"] += any(s.is_alias for s in outs)
            if node.cmd.name != "gemm":
                seen["broadcast"] += any(s.shape != outs[0].shape for s in ins)
            if node.cmd.name == "constant":
                seen["hoisted constant"] += node.cmd.param("value").size > 16

    collect()
    missing = [
        k
        for k in [*NUMPY, "alias read", "alias write", "broadcast", "hoisted constant"]
        if not seen[k]
    ]
    assert not missing, f"never drawn: {missing}; seen {dict(seen)}"
