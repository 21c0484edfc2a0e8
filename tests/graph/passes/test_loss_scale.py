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
