"""fuse: NNC's fused losses and elementwise chains, checked against the unfused graphs."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from fnnc import ops
from fnnc.graph import GraphBuilder, compile, interpret
from fnnc.graph.passes import fuse
from tests.graph.strategies import graphs
from tests.helpers import assert_close, assert_pass_keeps_semantics, rand

SETTINGS = settings(max_examples=60)

LOGITS = np.array([[10, -1, -5], [12, 4, 24]], np.float32)
LABELS = np.array([2, 1], np.int32)


def _softmax_xent(label_dtype=np.int32, label_shape=(2,), **trims):
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    label = b.input(label_shape, label_dtype, name="label")
    p = b.exec(ops.softmax(), x, name="p")
    return b, p, b.exec(ops.categorical_crossentropy(**trims), p, label, name="loss")


def test_softmax_crossentropy_golden_and_nnc_values() -> None:
    b, _, loss = _softmax_xent()
    graph = b.build([loss])
    new = assert_pass_keeps_semantics(fuse, graph, [LOGITS, LABELS])
    assert str(new) == (
        "graph(%0:f32[2,3] x, %1:i32[2] label) {\n"
        "  %3:f32[2,1], %2:f32[2,3] = softmax_crossentropy(%0, %1)  # loss\n"
        "  return %3\n"
        "}"
    )
    want = np.array([[15.000017], [20.000006]], np.float32)
    assert_close(interpret(new, LOGITS, LABELS), want, rtol=1e-5)


def test_softmax_crossentropy_keeps_trims_that_sum_to_one() -> None:
    b, _, loss = _softmax_xent(label_shape=(2, 1), trim0=0.05, trim1=0.9)
    graph = b.build([loss])
    new = assert_pass_keeps_semantics(fuse, graph, [LOGITS, LABELS.reshape(2, 1)], rtol=1e-4)
    assert str(new.nodes[0].cmd) == "softmax_crossentropy[trim0=0.05, trim1=0.9]"


@pytest.mark.parametrize(
    "why",
    ["softmax is an output", "softmax read twice", "targets", "bf16 targets", "trims", "axis"],
)
def test_softmax_crossentropy_needs_a_private_softmax_and_index_labels(why) -> None:
    if why.endswith("targets"):
        b, p, loss = _softmax_xent(jnp.bfloat16 if why[:4] == "bf16" else np.float32, (2, 3))
    elif why == "trims":
        b, p, loss = _softmax_xent(trim0=0.1, trim1=0.9)
    elif why == "axis":
        b = GraphBuilder()
        x = b.input((3, 3), name="x")
        label = b.input((3,), np.int32, name="label")
        p = b.exec(ops.softmax(axis=0), x)
        loss = b.exec(ops.categorical_crossentropy(), p, label)
    else:
        b, p, loss = _softmax_xent()
    outputs = [loss, p] if why == "softmax is an output" else [loss]
    if why == "softmax read twice":
        outputs.append(b.exec(ops.relu(), p))
    graph = b.build(outputs)
    assert "softmax_crossentropy" not in [n.cmd.name for n in fuse(graph).nodes]


def test_sigmoid_binary_crossentropy() -> None:
    b = GraphBuilder()
    x = b.input((3, 4), name="x")
    y = b.input((3, 4), name="y")
    s = b.exec(ops.sigmoid(), x)
    graph = b.build([b.exec(ops.binary_crossentropy(pos_weight=2.5), s, y)])
    arrays = [rand((3, 4)) * 3, rand((3, 4), seed=1, lo=0.0, hi=1.0)]
    new = assert_pass_keeps_semantics(fuse, graph, arrays, rtol=1e-4)
    assert [str(n.cmd) for n in new.nodes] == ["sigmoid_binary_crossentropy[pos_weight=2.5]"]


def _dense_gelu():
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    w = b.input((4, 3), name="w")
    bias = b.input((4,), name="b")
    h = b.exec(ops.gemm(transpose_b=True), x, w)
    return b.build([b.exec(ops.gelu(), b.exec(ops.add(), h, bias))])


def test_gemm_bias_gelu_chain_golden_and_compile() -> None:
    graph = _dense_gelu()
    arrays = [rand((2, 3)), rand((4, 3), seed=1), rand((4,), seed=2)]
    new = assert_pass_keeps_semantics(fuse, graph, arrays)
    assert str(new) == (
        "graph(%0:f32[2,3] x, %1:f32[4,3] w, %2:f32[4] b) {\n"
        "  %3:f32[2,4] = gemm[transpose_b=True](%0, %1)\n"
        "  %4:f32[2,4] = fused_elementwise[add, gelu](%3, %2)\n"
        "  return %4\n"
        "}"
    )
    assert str(new.nodes[1].cmd.param("body")) == (
        "graph(%0:f32[2,4], %1:f32[4] b) {\n"
        "  %2:f32[2,4] = add(%0, %1)\n"
        "  %3:f32[2,4] = gelu(%2)\n"
        "  return %3\n"
        "}"
    )
    assert_close(compile(new)(*arrays), compile(graph)(*arrays))


def test_swish_by_hand_is_one_node() -> None:
    b = GraphBuilder()
    x = b.input((5,), name="x")
    graph = b.build([b.exec(ops.mul(), x, b.exec(ops.sigmoid(), x))])
    new = assert_pass_keeps_semantics(fuse, graph, [rand((5,))])
    assert [str(n.cmd) for n in new.nodes] == ["fused_elementwise[sigmoid, mul]"]
    assert new.nodes[0].inputs == (0,)


def test_chains_stop_at_shared_results_outputs_and_shape_changes() -> None:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    row = b.input((3,), name="row")
    shared = b.exec(ops.relu(), x)  # read by two nodes: ends a chain
    left = b.exec(ops.ewexp(), b.exec(ops.tanh(), shared))
    right = b.exec(ops.scalar_mul(a=2.0), shared)
    small = b.exec(ops.ewabs(), row)  # [3] feeds a [2,3] node: stays outside
    wide = b.exec(ops.add(), right, small)
    out = b.exec(ops.ewsqrt(), b.exec(ops.ewabs(), left))
    graph = b.build([out, wide, left])
    new = assert_pass_keeps_semantics(fuse, graph, [rand((2, 3)), rand((3,), seed=1)])
    assert [str(n.cmd) for n in new.nodes] == [
        "relu",
        "fused_elementwise[tanh, ewexp]",
        "ewabs",
        "fused_elementwise[scalar_mul[a=2.0], add]",
        "fused_elementwise[ewabs, ewsqrt]",
    ]


def test_a_fused_node_joins_a_longer_chain_flat() -> None:
    graph = _dense_gelu()
    once = fuse(graph)
    b = GraphBuilder.from_graph(once)
    tail = b.exec(ops.tanh(), once.symbols[once.outputs[0]])
    longer = b.build([tail])
    arrays = [rand((2, 3)), rand((4, 3), seed=1), rand((4,), seed=2)]
    new = assert_pass_keeps_semantics(fuse, longer, arrays)
    assert str(new.nodes[1].cmd) == "fused_elementwise[add, gelu, tanh]"


def test_single_commands_and_min_length() -> None:
    b = GraphBuilder()
    x = b.input((2,))
    graph = b.build([b.exec(ops.relu(), b.exec(ops.ewexp(), x))])
    assert fuse(graph) is not graph
    assert fuse(graph, min_length=3) is graph
    single = GraphBuilder()
    y = single.input((2,))
    one = single.build([single.exec(ops.relu(), y)])
    assert fuse(one) is one


def test_fused_backward_matches_the_chain() -> None:
    import jax

    graph = _dense_gelu()
    cmd = fuse(graph).nodes[1].cmd
    h, bias = rand((2, 4)), rand((4,), seed=1)
    g = rand((2, 4), seed=2)
    got = cmd.definition.backward((g,), (h, bias), (), **cmd.kwargs)
    _, pullback = jax.vjp(lambda a, c: ops.gelu()(ops.add()(a, c)), h, bias)
    assert_close(got, pullback(g))


@SETTINGS
@given(graphs(max_nodes=8, activations=True))
def test_random_graphs(case) -> None:
    graph, arrays = case
    assert_pass_keeps_semantics(fuse, graph, arrays)
