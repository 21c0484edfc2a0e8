"""cast_precision of scan / pipeline loops: the blocks compute in the low type inside
the loop, the stacked parameters and their gradients stay float32."""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import GraphError
from fnnc.graph import GraphBuilder, backward, compile, interpret, pipeline, scan
from fnnc.graph.passes.precision import cast_precision

B, W, N, MICRO = 4, 8, 4, 2  # batch, width, blocks, microbatches of the pipeline
LOOPS = ("scan", "pipeline")


def _block(b, h, w, bias, gain):
    """``h + tanh(layer_norm(h) Wᵀ + bias) * gain``: a gemm (low) and a norm (float32)."""
    normed = b.exec(ops.layer_norm(), h)[0]
    z = b.exec(ops.gemm(transpose_b=True), normed, w, bias)
    return b.exec(ops.ewsum(), h, b.exec(ops.ewprod(), b.exec(ops.tanh(), z), gain))


@functools.cache
def _graph(loop: str, checkpoint: bool):
    """``sum(h * h)`` and ``h`` after N blocks of stacked ``ws``/``bs`` and a shared ``gain``."""
    body = GraphBuilder()
    rows = B if loop == "scan" else B // MICRO
    ins = [body.input(s) for s in ((rows, W), (W, W), (W,), (W,))]
    block = body.build([_block(body, *ins)])
    b = GraphBuilder()
    x, ws = b.input((B, W), name="x"), b.input((N, W, W), name="ws")
    bs, gain = b.input((N, W), name="bs"), b.input((W,), name="gain")
    if loop == "scan":
        (h,) = scan(b, block, [x], [ws, bs], [gain], checkpoint=checkpoint, name="blocks")
    else:
        (h,) = pipeline(b, block, [x], [ws, bs], [gain], stages=2, microbatches=MICRO,
                        checkpoint=checkpoint, name="blocks")  # fmt: skip
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.ewprod(), h, h))
    return b.build([loss, h])


def _oracle_loss(x, ws, bs, gain):
    """The same net as a float32 plain-JAX loop."""
    h = x
    for i in range(N):
        mu = h.mean(-1, keepdims=True)
        normed = (h - mu) / jnp.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
        h = h + jnp.tanh(normed @ ws[i].T + bs[i][None]) * gain[None]
    return jnp.sum(h * h)


def _args():
    rng = np.random.default_rng(0)
    return (
        rng.normal(size=(B, W)).astype(np.float32),
        rng.normal(scale=0.4, size=(N, W, W)).astype(np.float32),
        rng.normal(scale=0.1, size=(N, W)).astype(np.float32),
        rng.uniform(0.5, 1.0, size=(W,)).astype(np.float32),
    )


@functools.cache
def _float32_values():
    """The float32 graph's loss and output, run by the reference interpreter."""
    return tuple(np.asarray(v) for v in interpret(_graph("scan", False), *_args()))


@functools.cache
def _oracle_grads():
    return jax.jit(jax.grad(_oracle_loss, argnums=(0, 1, 2, 3)))(*_args())


def _close(got, want, tol=3e-2):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.abs(got - want).max() <= tol * np.abs(want).max(), (got, want)


def _returning(graph, outputs):
    """``graph`` returning ``outputs`` only (the gradients of a backward graph)."""
    return dataclasses.replace(graph, outputs=tuple(s.id for s in outputs), out_tree=None)


def _types(graph, name):
    return {graph.symbols[n.outputs[0]].dtype.name for n in graph.nodes if n.cmd.name == name}


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("checkpoint", [False, True])
def test_loop_blocks_compute_low_and_match_float32(loop, checkpoint):
    graph = _graph(loop, checkpoint)
    low = cast_precision(graph, "bfloat16")
    (node,) = [n for n in low.nodes if n.cmd.name == loop]
    forward, grad = node.cmd.param("forward"), node.cmd.param("backward")
    assert _types(forward, "gemm") == {"bfloat16"}  # the blocks' matmul, inside the loop
    assert _types(forward, "layer_norm") == {"float32"}  # keep_float32 holds inside too
    assert node.cmd.param("checkpoint") is checkpoint
    # the carry, stacked parameters and gain enter the loop low, converted once at its entry
    assert [low.symbols[s].dtype.name for s in node.inputs] == ["bfloat16"] * 4
    assert {grad.symbols[s].dtype.name for s in grad.outputs} == {"bfloat16"}
    args = _args()
    x, ws, bs, gain = (low.symbols[s] for s in low.inputs)
    step, grads = backward(low, low.outputs[0], [x, ws, bs, gain])
    program = compile(_returning(step, [*(low.symbols[s] for s in low.outputs), *grads]))
    loss, h, *got_grads = program(*args)
    for g, w in zip((loss, h), _float32_values()):
        assert g.dtype == np.float32
        _close(g, w)
    for g, w in zip(got_grads, _oracle_grads()):
        assert g.dtype == np.float32
        _close(g, w, tol=5e-2)  # measured <= 2.1e-2: bfloat16 gradients through 4 blocks
    # every matmul of the step, forward and backward loops alike, runs in bfloat16
    dots = re.findall(r"stablehlo\.dot_general[^\n]*-> tensor<([^>]*)>", program.lowered_text())
    assert dots and all(d.endswith("bf16") for d in dots), dots


@pytest.mark.parametrize("loop", LOOPS)
def test_float16_loop_matches_float32(loop):
    graph = _graph(loop, False)
    low = cast_precision(graph, "float16")
    (node,) = [n for n in low.nodes if n.cmd.name == loop]
    assert _types(node.cmd.param("forward"), "gemm") == {"float16"}
    args = _args()
    _close(interpret(low, *args)[0], _float32_values()[0], tol=5e-3)
    # a loop named in keep_float32 keeps its float32 bodies (the former policy)
    kept = cast_precision(graph, "float16", keep_float32={loop})
    assert [n.cmd for n in kept.nodes if n.cmd.name == loop] == [
        n.cmd for n in graph.nodes if n.cmd.name == loop
    ]


def test_tape_read_after_backward_is_a_clear_error():
    graph = _graph("scan", False)
    step, _ = backward(graph, graph.outputs[0], [graph.symbols[graph.inputs[1]]])
    with pytest.raises(GraphError, match="tape of loop node 'blocks'"):
        cast_precision(step, "bfloat16")


# -- loops sum gradients over iterations in float32 ---------------------------------------
STEPS = 300  # past 256, where a bfloat16 running sum of ones stops growing (256 + 1 -> 256)


def _sum_graph(loop: str):
    """``h <- h + w_i + c`` in bfloat16, STEPS times: d loss / d c (and d w for the
    pipeline, whose STEPS microbatches each add to it) is exactly STEPS."""
    bf = jnp.bfloat16
    body = GraphBuilder()
    h, w, c = (body.input((1, 1), bf) for _ in range(3))
    block = body.build([body.exec(ops.ewsum(), h, w, c)])
    b = GraphBuilder()
    if loop == "scan":
        x, ws = b.input((1, 1), bf, name="x"), b.input((STEPS, 1, 1), bf, name="ws")
        c = b.input((1, 1), bf, name="c")
        (out,) = scan(b, block, [x], [ws], [c])
    else:
        x, ws = b.input((STEPS, 1), bf, name="x"), b.input((1, 1, 1), bf, name="ws")
        c = b.input((1, 1), bf, name="c")
        (out,) = pipeline(b, block, [x], [ws], [c], stages=1, microbatches=STEPS)
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), out)
    step, grads = backward(b.build([loss]), loss, [ws, c])
    return _returning(step, grads)


@pytest.mark.parametrize("loop", LOOPS)
def test_loop_sums_gradients_in_float32(loop):
    bf = jnp.bfloat16
    graph = _sum_graph(loop)
    n_x = STEPS if loop == "pipeline" else 1
    dws, dc = compile(graph)(
        np.zeros((n_x, 1), bf), np.zeros(graph.spec(graph.inputs[1]).shape, bf),
        np.zeros((1, 1), bf),
    )  # fmt: skip
    assert dc.dtype == bf and float(dc[0, 0]) == STEPS
    if loop == "pipeline":
        assert float(dws[0, 0, 0]) == STEPS
