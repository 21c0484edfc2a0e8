"""minimize: a compiled training step equals a hand-written jax.jit(value_and_grad + optax)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import CommandError, GraphError
from fnnc.graph import GraphBuilder, compile, interpret, trace
from fnnc.graph.passes.minimize import minimize
from tests.helpers import assert_close, rand


def _loss(params, x, y):
    w1, b1, w2 = params
    h = jnp.tanh(x @ w1 + b1[None, :])
    return jnp.mean((h @ w2 - y) ** 2)


def _data():
    params = [rand([4, 8], seed=1) * 0.5, rand([8], seed=2) * 0.1, rand([8, 2], seed=3) * 0.5]
    return params, rand([16, 4], seed=4), rand([16, 2], seed=5)


@pytest.mark.parametrize(
    "optimizer",
    [
        optax.sgd(0.1),
        optax.adam(1e-2),
        optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(1e-2, weight_decay=0.1)),
    ],
    ids=["sgd", "adam", "clip+adamw"],
)
def test_step_matches_hand_written_optax(optimizer):
    params, x, y = _data()
    graph = trace(_loss, params, x, y)
    ins = [graph.symbols[i] for i in graph.inputs]
    step, layout = minimize(graph, graph.outputs[0], ins[:3], optimizer)
    program = compile(step)

    @jax.jit
    def reference(params, state, x, y):
        loss, grads = jax.value_and_grad(_loss)(params, x, y)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    ours_p, ours_s = list(params), layout.init(params)
    ref_p, ref_s = list(params), optimizer.init(params)
    for _ in range(3):
        ours_p, ours_s, ours_loss = layout.split(program(*ours_p, *ours_s, x, y))
        ref_p, ref_s, ref_loss = reference(ref_p, ref_s, x, y)
        assert_close(ours_loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert_close(ours_p, ref_p, rtol=1e-5, atol=1e-6)
    assert_close(ours_s, jax.tree.leaves(ref_s), rtol=1e-5, atol=1e-6)


def test_state_is_graph_inputs_and_outputs_and_interpret_agrees():
    params, x, y = _data()
    graph = trace(_loss, params, x, y)
    ins = [graph.symbols[i] for i in graph.inputs]
    step, layout = minimize(graph, graph.outputs[0], ins[:3], optax.adam(1e-3))
    assert layout.n_params == 3 and layout.n_state == len(layout.init(params))
    assert len(step.inputs) == 3 + layout.n_state + 2
    assert len(step.outputs) == 3 + layout.n_state + 1
    args = (*params, *layout.init(params), x, y)
    assert_close(interpret(step, *args), compile(step)(*args), rtol=1e-5, atol=1e-6)


def test_parameters_not_trained_get_no_gradient_nodes():
    b = GraphBuilder()
    w, frozen, x = b.input((3,), name="w"), b.input((3,), name="frozen"), b.input((3,), name="x")
    h = b.exec(ops.mul(), b.exec(ops.ewexp(), frozen), x)
    loss = b.exec(ops.reshape(shape=()), b.exec(ops.reduce_sum(axes=(0,)), b.exec(ops.mul(), w, h)))
    step, _ = minimize(b.build([loss]), loss, [w], optax.sgd(1.0))
    of = [str(n.cmd.param("of")) for n in step.nodes if n.cmd.name == "gradient"]
    assert "ewexp" not in of and of[-1] == "mul"
    mul_grads = [
        n for n in step.nodes if n.cmd.name == "gradient" and str(n.cmd.param("of")) == "mul"
    ]
    assert [n.cmd.param("wants") for n in mul_grads] == [(0,)]
    w0, fr, xs = rand([3]), rand([3], seed=1), rand([3], seed=2)
    new_w, _, _ = (lambda o: (o[0], o[1:-1], o[-1]))(compile(step)(w0, fr, xs))
    assert_close(new_w, w0 - np.exp(fr) * xs, rtol=1e-6)


def test_bad_input():
    b = GraphBuilder()
    w = b.input((), name="w")
    loss = b.exec(ops.ewprod(), w, w)
    inner = b.exec(ops.ewexp(), w, name="inner")
    graph = b.build([loss, inner])
    with pytest.raises(GraphError, match=r"%\d+ \(inner\) is not a graph input"):
        minimize(graph, loss, [inner], optax.sgd(0.1))
    with pytest.raises(CommandError, match=r"optax\.GradientTransformation"):
        minimize(graph, loss, [w], "sgd")
    # a parameter listed twice made a step whose inputs repeat it (verify refuses such a
    # graph), and compile ran it with the first value silently ignored
    with pytest.raises(GraphError, match=r"%\d+ \(w\) is listed twice \(positions 0 and 1\)"):
        minimize(graph, loss, [w, w], optax.sgd(0.1))
