"""NNC's "dynamic graph to evaluate cnnp model" tests, translated: ``evaluate`` compiles a
model that was never compiled from the inputs it is given (issue 25, item 8), also a
model without parameters."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import GraphError, ModelError
from fnnc.graph import DynamicGraph
from fnnc.models import BatchNorm, Dense, Dropout, Input, Model, Mul

F32 = np.float32


def _dense_1() -> Model:
    x = Input()
    return Model(x, Dense(1, name="linear")(x))


def _closed_form(params: dict, pids: list[str], x):
    """``Dense(1)`` in plain JAX: ``x @ w.T + b``."""
    by_ndim = {np.ndim(params[p]): p for p in pids}
    return x @ params[by_ndim[2]].T + params[by_ndim[1]][None]


def test_evaluate_compiles_a_model_never_compiled_and_trains_it() -> None:
    """NNC: "dynamic graph to evaluate cnnp model" (batches of 1 and 2 alternate)."""
    linear = _dense_1()
    with pytest.raises(ModelError, match="not compiled"):
        linear.parameters()
    dg = DynamicGraph()
    z = dg.constant(F32([[5.0]]))
    opt = optax.sgd(0.01)
    for i in range(100):
        x = dg.variable(np.full((2 if i % 2 else 1, 1), 10.0, F32), name="x")
        y = dg.evaluate(linear, [dg.exec(ops.ewlog(), x)])
        d = y - z
        params = dg.parameters(linear)
        if i == 0:  # the compiled model's forward and gradient against plain JAX
            values = {p: v.numpy() for p, v in params.items()}
            pids = list(values)
            np.testing.assert_allclose(
                y.numpy(), _closed_form(values, pids, np.log(x.numpy())), rtol=1e-6
            )

            def loss(xv, p):
                return jnp.sum((_closed_form(p, pids, jnp.log(xv)) - 5.0) ** 2)

            want_dx, want_dp = jax.grad(loss, argnums=(0, 1))(x.numpy(), values)
        grads = dg.backward((d * d).sum(), [x, *params.values()])
        if i == 0:
            np.testing.assert_allclose(grads[0].numpy(), want_dx, rtol=1e-5)
            for g, pid in zip(grads[1:], params):
                np.testing.assert_allclose(g.numpy(), want_dp[pid], rtol=1e-5)
        dg.apply_gradients(opt, list(params.values()))
    y = dg.evaluate(linear, [dg.exec(ops.ewlog(), dg.constant(F32([[10.0]])))])
    assert abs(float(y.numpy()[0, 0]) - 5.0) < 1e-2  # NNC's check
    # the model was compiled (for rank-2 float32 inputs) and holds the trained values
    np.testing.assert_allclose(
        np.asarray(linear.evaluate(np.log(F32([[10.0]])))), y.numpy(), rtol=1e-6
    )


def test_evaluate_compiles_a_model_without_parameters() -> None:
    """NNC: "dynamic graph to evaluate cnnp model without any parameters"."""
    a_in, b_in = Input(), Input()
    mul = Model([a_in, b_in], Mul(name="mul")(a_in, b_in))
    dg = DynamicGraph()
    a = dg.variable(F32([1.23]), name="a")
    b = dg.variable(F32([2.0]), name="b")
    c = dg.evaluate(mul, [a, b])
    (da,) = dg.backward(c, [a])
    np.testing.assert_allclose(c.numpy(), [2.46], rtol=1e-6)
    np.testing.assert_allclose(da.numpy(), [2.0], rtol=1e-6)
    assert dg.parameters(mul) == {}


def test_a_compiled_model_keeps_its_compile() -> None:
    """Evaluating a compiled model on another batch size does not compile it again."""
    linear = _dense_1()
    linear.compile([np.zeros((4, 3), F32)], loss="mse", minimizer=optax.sgd(0.1))
    before = linear.parameters()
    dg = DynamicGraph()
    y = dg.evaluate(linear, [dg.constant(np.ones((2, 3), F32))])
    assert y.shape == (2, 1)
    after = linear.parameters()
    assert all(np.array_equal(before[p], after[p]) for p in before)
    linear.fit(np.ones((4, 3), F32), np.zeros((4, 1), F32))  # loss and minimizer kept


def test_evaluate_sees_the_models_own_parameter_changes() -> None:
    """set_parameters / fit after the first evaluate: the dynamic graph uses the new
    values, and its next step does not write the stale ones back over fit's."""
    linear = _dense_1()
    linear.compile([np.zeros((4, 3), F32)], loss="mse", minimizer=optax.sgd(0.1))
    xs = np.arange(12, dtype=F32).reshape(4, 3) / 10
    dg = DynamicGraph()
    dg.evaluate(linear, [xs])
    new = {p: np.full_like(v, 0.5) for p, v in linear.parameters().items()}
    linear.set_parameters(new)
    pids = list(new)
    np.testing.assert_allclose(
        dg.evaluate(linear, [xs]).numpy(), _closed_form(new, pids, xs), rtol=1e-6
    )
    assert all(np.array_equal(v.numpy(), new[p]) for p, v in dg.parameters(linear).items())
    linear.fit(xs, np.full((4, 1), 5.0, F32))
    fitted = linear.parameters()
    assert not np.array_equal(fitted[pids[0]], new[pids[0]])
    out = dg.evaluate(linear, [xs])
    np.testing.assert_allclose(out.numpy(), _closed_form(fitted, pids, xs), rtol=1e-6)
    dg.minimize(optax.sgd(0.0), (out * out).sum(), list(dg.parameters(linear).values()))
    assert all(np.array_equal(v, fitted[p]) for p, v in linear.parameters().items())


def _batch_norm_model() -> Model:
    x = Input()
    return Model([x], [BatchNorm(name="bn")(Dense(4, name="d")(x))])


def test_evaluate_is_test_false_trains_batch_norm_as_fit_does() -> None:
    rng = np.random.default_rng(0)
    xs = (rng.standard_normal((8, 3)) * 5 + 10).astype(F32)
    ts = rng.standard_normal((8, 4)).astype(F32)
    model = _batch_norm_model()
    model.compile([xs], loss="mse", minimizer=optax.sgd(0.1))
    initial = model.parameters()
    reference = copy.deepcopy(model)
    dg = DynamicGraph()
    test_mode = dg.evaluate(model, [dg.constant(xs)]).numpy()
    assert np.abs(test_mode.mean(0)).min() > 1.0  # running statistics: not normalised
    for step in range(2):
        out = dg.evaluate(model, [dg.constant(xs)], is_test=False)
        if step == 0:  # batch statistics (gamma 1, beta 0): zero mean, unit variance
            np.testing.assert_allclose(out.numpy().mean(0), 0.0, atol=1e-5)
            np.testing.assert_allclose(out.numpy().var(0), 1.0, rtol=1e-3)
        d = out - dg.constant(ts)
        loss = (d * d).sum() * (1.0 / d.shape[0] / d.shape[1])  # "mse": the mean
        dg.minimize(optax.sgd(0.1), loss, list(dg.parameters(model).values()))
        reference.fit(xs, ts)
    got, want = model.parameters(), reference.parameters()
    assert [p for p in got if p.startswith("r-")]  # the running statistics are compared
    for pid in got:
        assert not np.array_equal(got[pid], initial[pid]), pid
        np.testing.assert_allclose(got[pid], want[pid], rtol=1e-5, atol=1e-6, err_msg=pid)


@pytest.mark.parametrize("lazy", [False, True])
def test_evaluate_is_test_false_updates_running_statistics(lazy: bool) -> None:
    xs = (np.random.default_rng(1).standard_normal((8, 3)) + 3).astype(F32)
    model = _batch_norm_model()
    model.compile([xs])
    reference = copy.deepcopy(model)
    dg = DynamicGraph(lazy=lazy)
    out = dg.evaluate(model, [dg.constant(xs)], is_test=False)
    want = np.asarray(reference.evaluate(xs, is_test=False))
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    if lazy:  # the statistics reach the model at the next step
        dg.minimize(optax.sgd(0.0), out.sum(), list(dg.parameters(model).values()))
    got, ref = model.parameters(), reference.parameters()
    for pid in got:
        np.testing.assert_allclose(got[pid], ref[pid], rtol=1e-6, err_msg=pid)
    # running mean = momentum * 0 + (1 - momentum) * the batch mean of the dense output
    dense = xs @ np.asarray(ref["t-d-0-0"]).T + np.asarray(ref["t-d-0-1"])[None]
    means = [
        v for p, v in got.items() if p.startswith("r-") and np.allclose(v, 0.1 * dense.mean(0))
    ]
    assert means, {p: v for p, v in got.items() if p.startswith("r-")}


def test_evaluate_is_test_false_drops_as_the_model_does() -> None:
    xs = np.ones((16, 8), F32)
    x = Input()
    model = Model([x], [Dropout(0.5)(x)])
    model.compile([xs])
    reference = copy.deepcopy(model)  # the same key stream
    dg = DynamicGraph()
    assert np.array_equal(dg.evaluate(model, [dg.constant(xs)]).numpy(), xs)
    out = dg.evaluate(model, [dg.constant(xs)], is_test=False).numpy()
    np.testing.assert_array_equal(out, np.asarray(reference.evaluate(xs, is_test=False)))
    assert 0 < int((out == 0).sum()) < xs.size
    np.testing.assert_allclose(np.unique(out), [0.0, 2.0])  # kept ones scaled by 1 / 0.5


def test_evaluate_is_test_false_needs_a_model() -> None:
    from fnnc.graph import trace

    graph = trace(lambda a: a * 2.0, jax.ShapeDtypeStruct((2,), F32))
    with pytest.raises(GraphError, match="is_test=False"):
        DynamicGraph().evaluate(graph, [np.ones(2, F32)], is_test=False)


def test_a_compiled_model_runs_with_its_precision_and_forward_passes() -> None:
    """A model compiled with precision="bfloat16" and a forward pass (relu made a leaky
    relu) computes in the dynamic graph what Model.evaluate computes, in test and in
    training mode (no dropout or batch norm: the two modes agree), not the float32
    layers' graph."""
    import dataclasses

    def leaky(graph):
        swap = lambda n: dataclasses.replace(n, cmd=ops.leaky_relu(negative_slope=0.5))
        nodes = tuple(swap(n) if n.cmd.name == "relu" else n for n in graph.nodes)
        return dataclasses.replace(graph, nodes=nodes)

    from fnnc.models import ReLU

    x = Input()
    model = Model(x, Dense(1, name="out")(ReLU()(Dense(8, name="hidden")(x))))
    xs = np.random.default_rng(0).standard_normal((4, 3)).astype(F32)
    model.compile(xs, loss="mse", minimizer=optax.sgd(0.1), precision="bfloat16", passes=[leaky])
    want = np.asarray(model.evaluate(xs))
    dg = DynamicGraph()
    for is_test in (True, False):
        got = dg.evaluate(model, [dg.constant(xs)], is_test=is_test).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    values = {p: np.asarray(v, np.float32) for p, v in model.parameters().items()}
    h = xs @ values["t-hidden-0-0"].T + values["t-hidden-0-1"]
    f32 = np.maximum(h, 0) @ values["t-out-0-0"].T + values["t-out-0-1"]
    assert np.abs(want - f32).max() > 1e-3  # the bfloat16 leaky model is another function
