"""A long eager training loop keeps the recorded graph, memory and compiled programs flat;
a step updates in place only the arrays no other variable holds."""

from __future__ import annotations

import gc
import itertools

import jax
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.core.dispatch import _compiled
from fnnc.graph import DynamicGraph

DENSE = ops.gemm(transpose_b=True)
RELU = ops.relu()
LOSS = ops.softmax_crossentropy()
MEAN = ops.reduce_mean(axes=(0, 1))


def _mlp(dg: DynamicGraph, sizes=(8, 16, 4), seed=0):
    rng = np.random.default_rng(seed)
    params = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        w = rng.normal(0, 1 / np.sqrt(n_in), (n_out, n_in)).astype(np.float32)
        params += [dg.variable(w, name=f"w{i}"), dg.variable(np.zeros(n_out, np.float32))]
    return params


def _batch(step: int, n: int = 8):
    rng = np.random.default_rng(step % 7)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + 2 * (x[:, 1] > 0).astype(np.int32)
    return x, y


def _loss(dg: DynamicGraph, params, x, y):
    w0, b0, w1, b1 = params
    h = dg.exec(RELU, dg.exec(DENSE, dg.constant(x), w0, b0))
    loss, _ = dg.exec(LOSS, dg.exec(DENSE, h, w1, b1), dg.constant(y))
    return dg.exec(MEAN, loss)


@pytest.mark.parametrize("lazy", [False, True])
def test_long_loop_keeps_graph_memory_and_programs_flat(lazy: bool) -> None:
    dg = DynamicGraph(lazy=lazy)
    params = _mlp(dg)
    opt = optax.adam(1e-2)
    steps = 1000 if not lazy else 300
    counts, losses = [], []
    # live_arrays() counts the whole process: collect earlier tests' garbage first, and
    # keep the cyclic collector out of the loop, so the counts move only with this loop
    # (and memory must stay flat by reference counting alone).
    gc.collect()
    gc.disable()
    try:
        _train(dg, params, opt, steps, counts, losses)
    finally:
        gc.enable()
    assert len(set(counts)) == 1, f"not flat: first {counts[0]}, last {counts[-1]}"
    assert np.mean(losses[-20:]) < 0.5 * np.mean(losses[:20])


def _train(dg, params, opt, steps, counts, losses) -> None:
    for step in range(steps):
        loss = _loss(dg, params, *_batch(step))
        dg.backward(loss, params)
        dg.apply_gradients(opt, params)
        losses.append(float(loss.numpy().reshape(())))
        if step >= 3:
            counts.append(
                (
                    dg.num_nodes,
                    dg.num_tensors,
                    dg.num_compiled,
                    _compiled.cache_info().currsize,
                    len(jax.live_arrays()),
                )
            )


def test_minimize_matches_backward_then_apply() -> None:
    runs = []
    for fused in (False, True):
        dg = DynamicGraph()
        params = _mlp(dg)
        opt = optax.sgd(0.1, momentum=0.9)
        for step in range(5):
            loss = _loss(dg, params, *_batch(step))
            if fused:
                dg.minimize(opt, loss, params)
            else:
                dg.backward(loss, params)
                dg.apply_gradients(opt, params)
        runs.append([p.numpy() for p in params])
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_free_variables_each_step_leaves_nothing_recorded() -> None:
    dg = DynamicGraph()
    params = _mlp(dg)
    for step in range(3):
        loss = _loss(dg, params, *_batch(step))
        dg.backward(loss, params)
        dg.free(loss)
        assert dg.num_nodes == 0
        dg.zero_grad()


W0 = np.float32([1.0, 2.0, 3.0])
STEPPED = W0 - 0.1 * 2 * W0  # one SGD step of sum(w * w), lr 0.1


def _step(dg: DynamicGraph, w, fused: bool):
    loss = (w * w).sum()
    if fused:
        dg.minimize(optax.sgd(0.1), loss, [w])
    else:
        dg.backward(loss, [w])
        dg.apply_gradients(optax.sgd(0.1), [w])
    return loss


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("make", ["constant", "variable", "set"])
def test_step_never_donates_an_array_another_variable_holds(make: str, fused: bool) -> None:
    # both variables share one array; the step must not update it in place
    dg = DynamicGraph()
    if make == "constant":  # a frozen snapshot of the parameter
        w = dg.variable(W0, name="w")
        other = dg.constant(w, name="snapshot")
    elif make == "variable":  # a parameter made from a parameter
        other = dg.variable(W0, name="other")
        w = dg.variable(other, name="w")
    else:
        other = dg.variable(W0, name="other")
        w = dg.variable(np.zeros(3, np.float32), name="w")
        dg.set(w, other)
    _step(dg, w, fused)
    np.testing.assert_allclose(other.numpy(), W0)
    np.testing.assert_allclose(w.numpy(), STEPPED, rtol=1e-6)
    _step(dg, w, fused)  # w's array is its own now: updated in place again
    np.testing.assert_allclose(w.numpy(), STEPPED - 0.1 * 2 * STEPPED, rtol=1e-6)
    np.testing.assert_allclose(other.numpy(), W0)


@pytest.mark.parametrize("fused", [False, True])
def test_memoised_result_is_computed_again_after_its_array_was_donated(fused: bool) -> None:
    dg = DynamicGraph()
    w = dg.variable(W0, name="w")
    w2 = dg.variable(np.zeros(3, np.float32), name="w2")
    dg.write(w2, w * 2.0)  # w2 holds the memoised version of w * 2.0
    loss = _step(dg, w2, fused)  # kept, as a loop keeps its loss: so is what it read
    np.testing.assert_allclose((w * 2.0).numpy(), 2 * W0)
    np.testing.assert_allclose(w2.numpy(), 2 * W0 - 0.1 * 4 * W0, rtol=1e-6)
    np.testing.assert_allclose(loss.numpy(), [np.sum((2 * W0) ** 2)])


@pytest.mark.parametrize("fused", [False, True])
def test_step_still_updates_a_parameter_it_alone_holds_in_place(fused: bool) -> None:
    dg = DynamicGraph()
    w = dg.variable(W0, name="w")
    before = w.value
    _step(dg, w, fused)
    assert before.is_deleted()  # its buffer holds the new values: memory stays flat
    np.testing.assert_allclose(w.numpy(), STEPPED, rtol=1e-6)


@pytest.mark.parametrize("fused", [False, True])
def test_variable_left_out_of_some_steps_steps_again_as_optax_does(fused: bool) -> None:
    # Adam over [a, b], then [b] twice, then [a, b]: the first step's shared count must
    # stay readable in a's view, and a takes the newest count (4), never b's going back
    a0, b0 = np.float32([1.0, -2.0]), np.float32([3.0])
    dg = DynamicGraph()
    a, b = dg.variable(a0, name="a"), dg.variable(b0, name="b")
    steps = [[a, b], [b], [b], [a, b]]
    for ws in steps:
        loss = sum(((w * w).sum() for w in ws[1:]), (ws[0] * ws[0]).sum())
        if fused:
            dg.minimize(optax.adam(0.1), loss, ws)
        else:
            dg.backward(loss, ws)
            dg.apply_gradients(optax.adam(0.1), ws)
    tx = optax.adam(0.1)  # the oracle: one Adam state, a step moving the listed ones
    p = {"a": jax.numpy.asarray(a0), "b": jax.numpy.asarray(b0)}
    adam, rest = tx.init(p)
    for names in (["a", "b"], ["b"], ["b"], ["a", "b"]):
        sub = (adam._replace(mu={k: adam.mu[k] for k in names}, nu={k: adam.nu[k] for k in names}),)
        u, (new, rest) = tx.update({k: 2 * p[k] for k in names}, (*sub, rest), None)
        adam = adam._replace(mu={**adam.mu, **new.mu}, nu={**adam.nu, **new.nu}, count=new.count)
        p = {**p, **optax.apply_updates({k: p[k] for k in names}, u)}
    np.testing.assert_allclose(a.numpy(), p["a"], rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), p["b"], rtol=1e-6)
    assert [int(s[0].count) for s in dg.optimizer_states(a).values()] == [4]
