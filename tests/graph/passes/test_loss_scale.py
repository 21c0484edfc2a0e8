"""minimize_scaled: minimize's step when gradients are finite, a skipped step when not."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import GraphError
from fnnc.graph import GraphBuilder, interpret
from fnnc.graph.passes.loss_scale import LossScale, minimize_scaled
from fnnc.graph.passes.minimize import minimize


def _graph():
    b = GraphBuilder()
    x, w, y = b.input((6, 4), name="x"), b.input((3, 4), name="w"), b.input((6, 3), name="y")
    out = b.exec(ops.tanh(), b.exec(ops.gemm(transpose_b=True), x, w))
    per = b.exec(ops.mse(), out, y)
    loss = b.exec(ops.reshape(shape=()), b.exec(ops.reduce_mean(axes=(0, 1)), per))
    return b.build([loss, out]), loss, w


def test_finite_step_equals_minimize_and_an_overflow_is_skipped():
    rng = np.random.default_rng(0)
    x, w, y = (rng.normal(size=s).astype(np.float32) for s in ((6, 4), (3, 4), (6, 3)))
    graph, loss, wsym = _graph()
    opt = optax.adam(0.1)
    step, layout = minimize_scaled(graph, loss, [wsym], opt, scaling=LossScale(growth_interval=2))
    ref, ref_layout = minimize(graph, loss, [wsym], opt)
    state = ref_layout.init([w])
    assert layout.n_params == 1 and layout.n_state == ref_layout.n_state == len(state)
    names = [step.symbols[i].name for i in step.inputs]
    assert names[-2:] == ["loss_scale", "good_steps"] and names[1 + len(state) :][:2] == ["x", "y"]

    want = interpret(ref, w, *state, x, y)  # (w', state', loss)
    got = interpret(step, w, *state, x, y, np.float32(2.0**15), np.int32(1))
    n = 1 + len(state)
    for a, b in zip(got[: n + 1], want):  # a power-of-two scale is exact in float32
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert [float(v) for v in got[n + 2 :]] == [2.0**16, 0]  # the 2nd good step: doubled
    assert got[n + 1].shape == (6, 3)  # the graph's other output is kept

    huge = np.float32(3e38)  # gradients of ~100 times it overflow float32: Inf/NaN
    got = interpret(step, w, *state, x, y + 1e3, huge, np.int32(1))
    for a, b in zip(got[:n], [w, *state]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bitwise unchanged
    assert [float(v) for v in got[n + 2 :]] == [np.float32(huge / 2), 0.0]
    bad = x.copy()
    bad[0, 0] = np.nan  # NaN gradients at the minimum scale: skipped, the scale stays
    stuck = interpret(step, w, *state, bad, y, np.float32(1.0), np.int32(1))
    np.testing.assert_array_equal(np.asarray(stuck[0]), w)
    assert [float(v) for v in stuck[n + 2 :]] == [1.0, 0]


def test_bad_policies_say_what_is_expected():
    with pytest.raises(GraphError, match=r"initial=0 \(a positive finite number\); factor=1"):
        LossScale(initial=0, factor=1)


@pytest.mark.parametrize("order", ["loss_first", "loss_last", "loss_not_an_output"])
def test_other_outputs_are_every_output_but_the_loss_in_order(order):
    b = GraphBuilder()
    w, x = b.input((3,), name="w"), b.input((3,), name="x")
    h = b.exec(ops.ewprod(), w, x, name="h")
    g = b.exec(ops.ewsum(), h, x, name="g")
    loss = b.exec(ops.reduce_sum(axes=(0,)), b.exec(ops.ewprod(), h, h), name="loss")
    outs = {"loss_first": [loss, h, g], "loss_last": [h, g, loss], "loss_not_an_output": [h, g]}
    step, layout = minimize_scaled(b.build(outs[order]), loss, [w], optax.sgd(0.5))
    wv, xv = np.array([1.0, 2.0, -1.0], np.float32), np.array([0.5, -1.0, 2.0], np.float32)
    got = interpret(step, wv, *layout.init([wv]), xv, np.float32(8.0), np.int32(0))
    n = 1 + layout.n_state
    assert len(got) == n + 1 + 2 + 2  # params', state', loss, h, g, scale, good_steps
    hv = wv * xv  # NumPy: h = w * x, loss = sum(h^2), d loss / d w = 2 h x
    np.testing.assert_allclose(np.asarray(got[0]), wv - 0.5 * 2 * hv * xv, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got[n]), [np.sum(hv * hv)], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got[n + 1]), hv, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got[n + 2]), hv + xv, rtol=1e-6)
    assert [float(v) for v in got[n + 3 :]] == [8.0, 1]
