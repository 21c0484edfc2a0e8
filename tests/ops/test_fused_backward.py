"""Fusing before the backward pass keeps every member's own backward: the gradients of
a graph fused by ``fuse`` (or a model compiled with ``passes=["fuse"]``) are those of
the unfused graph, hand-written backwards included (NNC's relu gradient 0 at 0, where
``jnp.maximum``'s VJP gives 0.5; a straight-through estimator, where ``round``'s VJP
gives 0)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, compile, fuse, interpret

Spec = jax.ShapeDtypeStruct


@pytest.fixture
def ste_round(restore_registries):
    @ops.defcommand(family="elementwise", shape=lambda x: Spec(x.shape, x.dtype), elementwise=True)
    def test_ste_round(x):
        return jnp.round(x)

    @test_ste_round.backward
    def _straight_through(grads, inputs, outputs):
        return (grads[0],)

    return test_ste_round


def _input_gradient(graph, x):
    grad_graph, _ = backward(graph, graph.outputs[0], [graph.inputs[0]])
    return np.asarray(compile(grad_graph)(x)[-1]), np.asarray(interpret(grad_graph, x)[-1])


def _chain(*cmds):
    b = GraphBuilder()
    x = b.input((1, 3), np.float32, "x")
    h = x
    for cmd in cmds:
        h = b.exec(cmd, h)
    return b.build([b.exec(ops.reduce_sum(axes=(0, 1)), h)])


def test_relu_at_zero_gets_nnc_gradient_after_fuse():
    """d/dx sum(exp(relu(x))) at x = (-1, 0, 2): NNC's relu passes no gradient at 0."""
    graph = _chain(ops.relu(), ops.ewexp())
    fused = fuse(graph)
    assert any(n.cmd.name == "fused_elementwise" for n in fused.nodes)
    x = np.array([[-1.0, 0.0, 2.0]], np.float32)
    want = np.array([[0.0, 0.0, np.exp(2.0)]], np.float32)  # closed form, g = 0 at 0
    for got in (*_input_gradient(graph, x), *_input_gradient(fused, x)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_straight_through_backward_survives_fuse(ste_round):
    """d/dx sum(exp(ste_round(3x))) = 3 exp(round(3x)) with the straight-through rule."""
    graph = _chain(ops.scalar_mul(a=3.0), ste_round(), ops.ewexp())
    fused = fuse(graph)
    assert fused.nodes[0].cmd.name == "fused_elementwise"
    x = np.array([[0.2, 1.7, -0.6]], np.float32)
    want = 3 * np.exp(np.round(3 * x))
    for got in _input_gradient(fused, x):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_model_with_fuse_pass_trains_as_without(ste_round):
    """Three SGD steps of a dense layer followed by 2x -> ste_round -> tanh (fused into
    one node by passes=["fuse"]): the same parameters as the unfused model, and
    parameters that move (round's own VJP is 0 and would leave them in place)."""
    from fnnc.models import CommandLayer, Dense, Input, Model

    xs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    ys = np.random.default_rng(1).normal(size=(8, 3)).astype(np.float32)
    trained = []
    for passes in (None, ["fuse"]):
        i = Input()
        h = CommandLayer(ops.scalar_mul(a=2.0))(Dense(3, name="d")(i))
        m = Model([i], [CommandLayer(ops.tanh())(CommandLayer(ste_round())(h))], name="m")
        m.compile(xs, loss="mse", minimizer=optax.sgd(0.1), passes=passes, seed=0)
        before = {k: np.asarray(v) for k, v in m.parameters().items()}
        for _ in range(3):
            m.fit(xs, ys)
        trained.append({k: np.asarray(v) for k, v in m.parameters().items()})
    unfused, fused = trained
    assert unfused.keys() == fused.keys()
    for k in unfused:
        assert np.abs(unfused[k] - before[k]).max() > 1e-3
        np.testing.assert_allclose(fused[k], unfused[k], rtol=1e-5, atol=1e-6)
