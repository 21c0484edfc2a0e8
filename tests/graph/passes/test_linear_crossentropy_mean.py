"""fuse_linear_crossentropy_mean: a fused dense + cross-entropy loss reduced by a mean
over every row becomes one linear_softmax_crossentropy_mean node, with the same loss
and, through ``backward``, the same gradients (fixed cases and random ones)."""

import functools

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, interpret
from fnnc.graph.passes import fuse_linear_crossentropy, fuse_linear_crossentropy_mean
from fnnc.graph.passes.linear_crossentropy_mean import BLOCK_BYTES
from fnnc.graph.passes.precision import cast_precision
from tests.graph.passes.test_linear_crossentropy import _arrays, _head
from tests.helpers import assert_close, assert_pass_keeps_semantics

FUSE = functools.partial(fuse_linear_crossentropy, min_logits=0, row_chunk=3, class_chunk=16)
MEAN = functools.partial(fuse_linear_crossentropy_mean, block_logits=150)  # 3 rows of 50


def _both(graph):
    return MEAN(FUSE(graph))


def _grads(graph, arrays, n_wrt):
    return interpret(backward(graph, graph.outputs[0], list(graph.inputs[:n_wrt]))[0], *arrays)


def test_golden_listing():
    b = GraphBuilder()
    x, w = b.input((4, 8), name="x"), b.input((50, 8), name="w")
    label = b.input((4,), np.int32, name="label")
    loss, _ = b.exec(ops.linear_softmax_crossentropy(), x, w, label)
    graph = b.build([b.exec(ops.reduce_mean(axes=(0, 1)), loss)])
    new = fuse_linear_crossentropy_mean(graph)
    assert str(new) == (
        "graph(%0:f32[4,8] x, %1:f32[50,8] w, %2:i32[4] label) {\n"
        "  tensor %3:f32[4,1]\n"
        "  tensor %4:f32[4,1]\n"
        "  %5:f32[1,1], %6:f32[4,8], %7:f32[50,8], %8:f32[50] = "
        "linear_softmax_crossentropy_mean[row_chunk=1](%0, %1, %2)\n"
        "  return %5\n"
        "}"
    )


@pytest.mark.parametrize(
    "x_shape, bias", [((2, 5, 8), True), ((2, 5, 8), False), ((7, 4), True)], ids=str
)
def test_keeps_the_loss_and_the_gradients_of_every_input(x_shape, bias):
    graph = _head(x_shape=x_shape, bias=bias)
    arrays = _arrays(graph)
    fused = FUSE(graph)
    new = assert_pass_keeps_semantics(MEAN, fused, arrays)
    names = [n.cmd.name for n in new.nodes]
    assert "linear_softmax_crossentropy_mean" in names and "reduce_mean" not in names
    n_wrt = 3 if bias else 2
    assert_close(_grads(new, arrays, n_wrt), _grads(graph, arrays, n_wrt), rtol=1e-5, atol=1e-6)


def test_the_backward_multiplies_nothing_of_the_logits_size():
    graph = FUSE(_head())
    new = MEAN(graph)
    grads = backward(new, new.outputs[0], list(new.inputs[:3]))[0]
    assert "gemm" not in [n.cmd.name for n in grads.nodes]  # the backward only scales
    names = [n.cmd.name for n in backward(graph, graph.outputs[0], list(graph.inputs[:3]))[0].nodes]
    assert names.count("linear_softmax_crossentropy") == 1  # (its backward recomputes them)


def test_matches_through_mixed_precision():
    low = FUSE(cast_precision(_head(), "bfloat16"))
    new = MEAN(low)
    fused = next(n for n in new.nodes if n.cmd.name == "linear_softmax_crossentropy_mean")
    assert new.spec(fused.inputs[0]).dtype == jnp.bfloat16  # the product stays 16-bit
    assert new.spec(fused.outputs[0]).dtype == jnp.float32  # the mean does not
    args = _arrays(low)
    assert_close(interpret(new, *args), interpret(low, *args), rtol=2**-7, atol=0)
    assert_close(_grads(new, args, 3), _grads(low, args, 3), rtol=2e-2, atol=1e-4)


def test_leaves_what_it_cannot_fuse_alone():
    def graph_with(reduce, read_rows=False, read_lse=False):
        b = GraphBuilder()
        x, w = b.input((4, 8), name="x"), b.input((50, 8), name="w")
        label = b.input((4,), np.int32, name="label")
        loss, lse = b.exec(ops.linear_softmax_crossentropy(), x, w, label)
        out = b.exec(reduce, loss)
        return b.build([out, *([loss] if read_rows else []), *([lse] if read_lse else [])])

    for g in (
        graph_with(ops.reduce_mean(axes=(0, 1)), read_rows=True),  # the rows' losses are read
        graph_with(ops.reduce_mean(axes=(0, 1)), read_lse=True),  # so is the logsumexp
        graph_with(ops.reduce_mean(axes=(0,))),  # not a mean over every axis
        graph_with(ops.reduce_sum(axes=(0, 1))),  # a sum: not a mean
    ):
        assert fuse_linear_crossentropy_mean(g) is g


@settings(max_examples=12, deadline=None)
@given(
    rows=st.integers(1, 9),
    width=st.integers(1, 6),
    classes=st.integers(2, 40),
    bias=st.booleans(),
    trims=st.sampled_from([(0.0, 1.0), (0.05, 0.8)]),
    block=st.integers(1, 120),
)
def test_random_heads_keep_their_loss_and_gradients(rows, width, classes, bias, trims, block):
    b = GraphBuilder()
    x, w = b.input((rows, width), name="x"), b.input((classes, width), name="w")
    args = [x, w] + ([b.input((classes,), name="bias")] if bias else [])
    label = b.input((rows,), np.int32, name="label")
    cmd = ops.linear_softmax_crossentropy(trim0=trims[0], trim1=trims[1], class_chunk=7)
    loss, _ = b.exec(cmd, *args[:2], label, *args[2:])
    mean = b.exec(ops.reduce_mean(axes=(0, 1)), loss)
    graph = b.build([b.exec(ops.reshape(shape=()), mean)])
    arrays = _arrays(graph, v=classes)
    new = assert_pass_keeps_semantics(
        functools.partial(fuse_linear_crossentropy_mean, block_logits=block), graph, arrays
    )
    assert "linear_softmax_crossentropy_mean" in [n.cmd.name for n in new.nodes]
    n_wrt = len(args)
    assert_close(_grads(new, arrays, n_wrt), _grads(graph, arrays, n_wrt), rtol=1e-5, atol=1e-6)


def test_float16_heads_keep_the_blockwise_command():
    low = FUSE(cast_precision(_head(), "float16"))
    assert "linear_softmax_crossentropy" in [n.cmd.name for n in low.nodes]
    assert MEAN(low) is low


@pytest.mark.parametrize(
    "rows, classes, block_logits, want",
    [(4096, 32768, 2**26, 1024), (16384, 32768, 2**26, 2048), (7, 50, 2**26, 2), (3, 5, 1, 1)],
)
def test_row_blocks_fill_block_logits_but_never_hold_all_the_logits(
    rows, classes, block_logits, want
):
    b = GraphBuilder()
    x, w = b.input((rows, 8), name="x"), b.input((classes, 8), name="w")
    label = b.input((rows,), np.int32, name="label")
    loss, _ = b.exec(ops.linear_softmax_crossentropy(), x, w, label)
    graph = b.build([b.exec(ops.reduce_mean(axes=(0, 1)), loss)])
    new = fuse_linear_crossentropy_mean(graph, block_logits=block_logits)
    assert new.nodes[0].cmd.param("row_chunk") == want


@pytest.mark.parametrize("dtype, want", [(np.float32, 2048), (jnp.bfloat16, 4096)])
def test_by_default_a_block_holds_256_mib_of_logits_in_the_heads_dtype(dtype, want):
    """Issue 24's head (16 x 1024 rows, 32768 classes): 2048-row blocks in float32, and
    4096 in bfloat16, whose logits are half the bytes (four blocks, not eight)."""
    b = GraphBuilder()
    x = b.input((16384, 8), dtype, name="x")
    w = b.input((32768, 8), dtype, name="w")
    label = b.input((16384,), np.int32, name="label")
    loss, _ = b.exec(ops.linear_softmax_crossentropy(), x, w, label)
    graph = b.build([b.exec(ops.reduce_mean(axes=(0, 1)), loss)])
    new = fuse_linear_crossentropy_mean(graph)
    cmd = next(n.cmd for n in new.nodes if n.cmd.name == "linear_softmax_crossentropy_mean")
    assert cmd.param("row_chunk") == want
    assert want * 32768 * np.dtype(dtype).itemsize == BLOCK_BYTES
