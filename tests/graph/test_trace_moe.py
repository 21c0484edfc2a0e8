"""Top-k routed mixture-of-experts code in plain JAX traces to commands (``ragged_dot``
becomes ``segmented_gemm``), saves and loads, and differentiates as ``jax.grad`` does."""

from __future__ import annotations

import jax
import numpy as np
from jax import lax

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, compile, interpret, load, save, trace
from tests.helpers import assert_close, rand

E = 4


def experts(x, w_up, w_down, sizes):
    """Rows already sorted by expert: a grouped two-layer MLP."""
    h = jax.nn.relu(lax.ragged_dot(x, w_up, sizes))
    return lax.ragged_dot(h, w_down, sizes)


ARGS = (rand((6, 3)), rand((E, 3, 5), seed=1), rand((E, 5, 3), seed=2))
SIZES = np.array([2, 0, 3, 1], np.int32)


def test_ragged_dot_traces_to_segmented_gemm_saves_and_differentiates(tmp_path):
    graph = trace(experts, *ARGS, SIZES)
    names = [n.cmd.name for n in graph.nodes]
    assert names.count("segmented_gemm") == 2
    assert "primitive" not in names, graph
    want = experts(*ARGS, SIZES)
    assert_close(compile(graph)(*ARGS, SIZES), want, 1e-5, 1e-5)
    path = tmp_path / "moe.json"
    save(graph, str(path))
    loaded = load(str(path))
    assert_close(interpret(loaded, *ARGS, SIZES), want, 1e-5, 1e-5)
    want_grads = jax.grad(lambda *a: experts(*a, SIZES).sum(), argnums=(0, 1, 2))(*ARGS)
    b = GraphBuilder.from_graph(loaded)
    total = b.exec(ops.reduce_sum(axes=(0, 1)), loaded.symbols[loaded.outputs[0]])
    wrt = [loaded.symbols[i] for i in loaded.inputs[:3]]
    gg, _ = backward(b.build([total]), total, wrt)
    got = compile(gg)(*ARGS, SIZES)[-3:]
    for g, w in zip(got, want_grads):
        assert_close(g, w, 1e-5, 1e-5)


def test_transposed_expert_weights_trace_with_transpose_b():
    w = rand((E, 5, 3), seed=3)
    f = lambda x, w, s: lax.ragged_dot_general(
        x,
        w,
        s,
        lax.RaggedDotDimensionNumbers((((1,), (2,)), ((), ())), (0,), (0,)),
    )
    graph = trace(f, ARGS[0], w, SIZES)
    (node,) = [n for n in graph.nodes if n.cmd.name == "segmented_gemm"]
    assert node.cmd.param("transpose_b") is True
    assert_close(compile(graph)(ARGS[0], w, SIZES), f(ARGS[0], w, SIZES), 1e-5, 1e-5)
