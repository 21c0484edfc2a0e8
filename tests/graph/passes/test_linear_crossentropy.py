"""fuse_linear_crossentropy: a dense layer feeding softmax_crossentropy becomes one
blockwise linear_softmax_crossentropy node, with the same loss and gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, interpret
from fnnc.graph.passes import fuse_linear_crossentropy
from fnnc.graph.passes.precision import cast_precision
from tests.helpers import assert_close, assert_pass_keeps_semantics, rand, randint

FUSE = functools.partial(fuse_linear_crossentropy, min_logits=0, row_chunk=3, class_chunk=16)


def _head(x_shape=(2, 5, 8), v=50, bias=True, label_dtype=np.int32, read_softmax=False):
    b = GraphBuilder()
    x, w = b.input(x_shape, name="x"), b.input((v, x_shape[-1]), name="w")
    args = [x, w] + ([b.input((v,), name="bias")] if bias else [])
    label = b.input(x_shape[:-1], label_dtype, name="label")
    logits = b.exec(ops.gemm(transpose_b=True), *args, name="logits")
    loss, p = b.exec(ops.softmax_crossentropy(), logits, label, name="xent")
    mean = b.exec(ops.reduce_mean(axes=tuple(range(len(x_shape)))), loss)
    out = b.exec(ops.reshape(shape=()), mean, name="loss")
    return b.build([out, p] if read_softmax else [out])


def _arrays(graph, v=50):
    return [
        randint(s.shape, v, seed=i) if np.issubdtype(s.dtype, np.integer) else rand(s.shape, seed=i)
        for i, s in enumerate(graph.input_specs)
    ]


def test_golden_listing():
    b = GraphBuilder()
    x, w = b.input((4, 8), name="x"), b.input((50, 8), name="w")
    label = b.input((4,), np.int32, name="label")
    loss, _ = b.exec(ops.softmax_crossentropy(), b.exec(ops.gemm(transpose_b=True), x, w), label)
    graph = b.build([loss])
    new = fuse_linear_crossentropy(graph, min_logits=0)
    assert str(new) == (
        "graph(%0:f32[4,8] x, %1:f32[50,8] w, %2:i32[4] label) {\n"
        "  tensor %3:f32[4,50]\n"
        "  %4:f32[4,1], %5:f32[4,1] = linear_softmax_crossentropy(%0, %1, %2)\n"
        "  return %4\n"
        "}"
    )


@pytest.mark.parametrize("bias", [True, False])
def test_keeps_the_loss_and_is_a_fixpoint(bias):
    graph = _head(bias=bias)
    new = assert_pass_keeps_semantics(FUSE, graph, _arrays(graph))
    assert new.nodes[0].cmd.name == "linear_softmax_crossentropy"
    assert "gemm" not in [n.cmd.name for n in new.nodes]


def test_keeps_the_gradients_of_every_input():
    graph = _head()
    wrt = list(graph.inputs[:3])

    def grads(g):
        return interpret(backward(g, g.outputs[0], wrt)[0], *_arrays(graph))

    assert_close(grads(FUSE(graph)), grads(graph), rtol=1e-5, atol=1e-6)


def test_matches_through_mixed_precision():
    low = cast_precision(_head(), "bfloat16")
    new = FUSE(low)
    names = [n.cmd.name for n in new.nodes]
    assert "linear_softmax_crossentropy" in names and "softmax_crossentropy" not in names
    fused = next(n for n in new.nodes if n.cmd.name == "linear_softmax_crossentropy")
    assert new.spec(fused.inputs[0]).dtype == jnp.bfloat16  # the product stays 16-bit
    assert new.spec(fused.outputs[0]).dtype == jnp.float32  # the statistics do not
    # The unfused graph rounds the logits to bfloat16 before the float32 loss reads
    # them; the fused command never materialises them, so the two agree to bfloat16's
    # resolution (2**-8), and the fused loss is the closer one to float32's.
    args = _arrays(low)
    fused, unfused = (float(interpret(g, *args)) for g in (new, low))
    exact = float(interpret(_head(), *args))
    assert_close(fused, unfused, 2**-8, 0)
    assert abs(fused - exact) <= abs(unfused - exact) + 1e-6, (fused, unfused, exact)


def test_leaves_what_it_cannot_fuse_alone():
    wanted = _head(read_softmax=True)  # the softmax is a graph output
    assert FUSE(wanted) is wanted
    graph = _head()
    assert fuse_linear_crossentropy(graph, min_logits=2 * 5 * 50 + 1) is graph  # too small
    for dtype in (np.float32, jnp.bfloat16):  # per-class targets are [N, V] themselves
        b = GraphBuilder()
        x, w = b.input((4, 8), name="x"), b.input((6, 8), name="w")
        targets = b.input((4, 6), dtype, name="targets")
        logits = b.exec(ops.gemm(transpose_b=True), x, w)
        loss, _ = b.exec(ops.softmax_crossentropy(), logits, targets)
        per_class = b.build([loss])
        assert FUSE(per_class) is per_class
    b = GraphBuilder()
    x, w = b.input((4, 8), name="x"), b.input((6, 8), name="w")
    label = b.input((4,), np.int32, name="label")
    logits = b.exec(ops.gemm(transpose_b=True), x, w)
    loss, _ = b.exec(ops.softmax_crossentropy(), logits, label)
    shared = b.build([loss, b.exec(ops.relu(), logits)])  # the logits are read elsewhere
    assert FUSE(shared) is shared


def test_fused_graph_compiles_to_the_same_values():
    from fnnc.graph import compile

    graph = _head()
    xs = _arrays(graph)
    assert_close(compile(FUSE(graph))(*xs), jax.jit(lambda *a: interpret(graph, *a))(*xs))
