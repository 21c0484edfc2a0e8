"""evaluate(requires_grad=True) keeps residuals; backward runs from them (NNC's outgrad)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import ModelError
from fnnc.graph import GraphBuilder, backward, interpret
from fnnc.models import Add, Conv, Dense, Flatten, Input, Model, ReLU
from fnnc.models.residuals import ResidualForward, ResidualGradient, split_at_seeds
from tests.helpers import assert_close, rand


def _two_input_model() -> Model:
    """out = Dense(Flatten(ReLU(Conv(x)))) + Dense(z): one convolution, two gemms."""
    x, z = Input(), Input()
    h = Flatten()(ReLU()(Conv(4, 3, name="c")(x)))
    return Model([x, z], [Add()(Dense(3, name="fx")(h), Dense(3, name="fz")(z))])


def _oracle(p, x, z):
    y = jax.lax.conv_general_dilated(
        x, p["t-c-0-0"], (1, 1), "SAME", dimension_numbers=("NHWC", "OHWI", "NHWC")
    )
    h = jax.nn.relu(y + p["t-c-0-1"][None, None, None]).reshape(x.shape[0], -1)
    return h @ p["t-fx-0-0"].T + p["t-fx-0-1"][None] + z @ p["t-fz-0-0"].T + p["t-fz-0-1"][None]


@jax.jit
def _oracle_vjp(p, x, z, g):
    out, vjp = jax.vjp(_oracle, p, x, z)
    return out, vjp(g)


def _count(program, op: str) -> int:
    return program.program.lowered_text().count(f"stablehlo.{op}")


def test_backward_runs_from_residuals_and_matches_vjp_with_and_without_outgrad():
    model = _two_input_model()
    x, z = rand([2, 5, 5, 2]), rand([2, 3], seed=1)
    model.compile([x, z], minimizer=optax.sgd(0.1))
    params = model.parameters()
    params["t-c-0-1"] = rand([4], seed=2)  # a nonzero conv bias: relu's mask matters
    model.set_parameters(params)
    g = rand([2, 3], seed=3)
    want, (gp, gx, gz) = _oracle_vjp(params, x, z, g)

    out = model.evaluate([x, z], requires_grad=True)
    assert_close(out, want, rtol=1e-6, atol=1e-6)
    got_x, got_z = model.backward([g])
    assert_close([got_x, got_z], [gx, gz], rtol=1e-6, atol=1e-6)
    assert_close(model.engine.grads, gp, rtol=1e-6, atol=1e-6)
    assert model.backward([g], outgrad=False) == []  # parameter gradients only; they add up
    assert_close(model.engine.grads, jax.tree.map(lambda a: 2 * a, gp), rtol=1e-6, atol=1e-6)
    (only_z,) = model.backward(g, outgrad=[1])  # one array: the list of one, as fit takes it
    assert_close(only_z, gz, rtol=1e-6, atol=1e-6)
    with pytest.raises(ModelError, match="the output gradients go first, as ingrads"):
        model.backward(outgrads=g)  # the output gradient passed as outgrads

    progs = {k[0]: [] for k in model.engine._programs}
    for k, p in model.engine._programs.items():
        progs[k[0]].append(p)
    (fwd,) = progs["evaluate"]
    assert isinstance(fwd, ResidualForward) and fwd.n_residuals > 0
    assert (_count(fwd, "convolution"), _count(fwd, "dot_general")) == (1, 2)
    every, none, z_only = progs["backward"]
    assert all(isinstance(p, ResidualGradient) for p in (every, none, z_only))
    for p in (every, none, z_only):  # gradient nodes only: no forward command runs again
        names = {n.cmd.name for n in p.program.graph.nodes}
        assert not names & {"convolution", "gemm"}, names
    # dW and dx of each layer; without input gradients the conv's dx and fz's dz go
    assert (_count(every, "convolution"), _count(every, "dot_general")) == (2, 4)
    assert (_count(none, "convolution"), _count(none, "dot_general")) == (1, 3)
    assert (_count(z_only, "convolution"), _count(z_only, "dot_general")) == (1, 4)


def test_outgrad_naming_an_input_without_gradient_says_which_have_one():
    x, n = Input(), Input()
    model = Model([x, n], [Dense(2, name="d")(x)])
    xs, ns = rand([3, 4]), np.zeros((3,), np.int32)
    model.compile([xs, ns], minimizer=optax.sgd(0.1))
    model.evaluate([xs, ns], requires_grad=True)
    with pytest.raises(ModelError, match=r"outgrads=\[1\] names inputs \[1\].*inputs are \[0\]"):
        model.backward([np.ones((3, 2), np.float32)], outgrad=[1])


def test_split_keeps_only_what_the_backward_reads_and_recomputes_nothing():
    # y = relu(x @ w^T) * 2 (a constant); backward seeded by df; dw and dx.
    b = GraphBuilder()
    x, w = b.input((3, 4), name="x"), b.input((2, 4), name="w")
    df = b.input((3, 2), name="df")
    y = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w))
    y = b.exec(ops.ewprod(), y, b.constant(np.full((3, 2), 2.0, np.float32)))
    graph = b.build([y])
    full, _ = backward(graph, y, [w, x], df=df)
    halves = split_at_seeds(full, 2, 1)
    fwd, bwd = halves.forward, halves.backward
    assert "gemm" in {n.cmd.name for n in fwd.nodes}
    assert "gemm" not in {n.cmd.name for n in bwd.nodes}
    assert halves.from_feed == (0, 1)  # the backward reads x and w from the feed
    xs, ws, dfs = rand([3, 4]), rand([2, 4], seed=1), rand([3, 2], seed=2)
    y_val, *kept = interpret(fwd, xs, ws)
    dw, dx = interpret(bwd, xs, ws, *kept, dfs)

    def f(w, x):
        return 2 * jax.nn.relu(x @ w.T)

    want, vjp = jax.vjp(f, jnp.asarray(ws), jnp.asarray(xs))
    assert_close(y_val, want, rtol=1e-6, atol=1e-6)
    assert_close([dw, dx], list(vjp(dfs)), rtol=1e-6, atol=1e-6)
