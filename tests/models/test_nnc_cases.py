"""NNC's cnnp cases (test/unit/nnc/cnnp.core.tests.c), float32."""

from __future__ import annotations

import numpy as np

from fnnc import ops
from fnnc.models import CommandLayer, Dense, Input, Model, Parameter, minimizers


def _f(v):
    return np.array([[v]], np.float32)


def _shared_dense_l2():
    a0, a1, b0, b1 = Input(), Input(), Input(), Input()
    dense = Dense(1)
    o0, o1 = dense(a0), dense(a1)
    d0 = CommandLayer(ops.add(q=-1.0))(o0, b0)
    d1 = CommandLayer(ops.add(q=-1.0))(o1, b1)
    total = CommandLayer(ops.ewsum())(
        CommandLayer(ops.ewprod())(d0, d0), CommandLayer(ops.ewprod())(d1, d1)
    )
    return Model([a0, a1, b0, b1], [total])


def test_shared_dense_with_l2_loss_and_input_gradients():
    model = _shared_dense_l2()
    data = [_f(1), _f(3), _f(2), _f(3)]
    model.compile(data, loss=None, minimizer=minimizers.sgd(0.1, decay=0.1))
    for _ in range(10):
        model.fit(data)
    model.set_minimizer(minimizers.sgd(0.01, decay=0.01))
    for _ in range(100):
        model.fit(data)
    model.set_minimizer(minimizers.sgd(0.001, decay=0.001))
    for _ in range(1000):
        model.fit(data)
    # It regressed 1 -> 2, 3 -> 3: w = 0.5, b = 1.5; at a = (2, 2), b = (2, 3) the loss is 0.5.
    probe = [_f(2), _f(2), _f(2), _f(3)]
    assert abs(float(model.evaluate(probe).reshape(())) - 0.5) < 2e-2
    params = model.parameters()
    w = float(params["t-0-0"].reshape(()))
    bias = float(params["t-0-1"].reshape(()))
    model.evaluate(probe, requires_grad=True)
    da0, da1, db0, db1 = (float(g.reshape(())) for g in model.backward([_f(1)]))
    np.testing.assert_allclose(
        [da0, da1, db0, db1],
        [
            2 * w * (2 * w + bias - 2),
            2 * w * (2 * w + bias - 3),
            -2 * (2 * w + bias - 2),
            -2 * (2 * w + bias - 3),
        ],
        atol=1e-5,
    )


def test_freezing_trains_only_the_other_parameter():
    x = Parameter((1,), init=1.0, name="x")
    y = Parameter((1,), init=0.0, name="y")
    two, twelve = Input(), Input()
    xs, ys = x(), y()
    diff = CommandLayer(ops.add(q=-1.0))(
        CommandLayer(ops.ewsum())(CommandLayer(ops.ewprod())(two, xs), ys), twelve
    )
    model = Model([two, twelve], [CommandLayer(ops.ewprod())(diff, diff)])
    data = [np.array([2.0], np.float32), np.array([12.0], np.float32)]
    model.compile(data, loss=None, minimizer=minimizers.sgd(0.01, decay=0.01))
    # o = (2x + y - 12)^2 with weight decay 0.01 (NNC's SGD adds decay * w to the gradient):
    # with x frozen at 1, y settles where 2(2 + y - 12) + 0.01 y = 0.
    x.is_trainable = False
    for _ in range(2000):
        model.fit(data)
    params = model.parameters()
    assert float(params["t-x-0-0"][0]) == 1.0
    assert (
        abs(float(params["t-y-0-0"][0]) - 20 / 2.01) < 1e-2
        and abs(float(params["t-y-0-0"][0]) - 10) < 0.06
    )
    # Then y frozen at 2 and x trained: 4(2x + 2 - 12) + 0.01 x = 0, x = 40 / 8.01 = 4.994.
    model.set_parameters({"t-y-0-0": np.array([2.0], np.float32)})
    x.is_trainable, y.is_trainable = True, False
    for _ in range(2000):
        model.fit(data)
    params = model.parameters()
    assert float(params["t-y-0-0"][0]) == 2.0
    assert abs(float(params["t-x-0-0"][0]) - 5.0) < 1e-2


def test_dense_named_linear_has_nnc_ids():
    x = Input()
    model = Model([x], [Dense(2, name="linear")(x)])
    model.compile([np.zeros((1, 3), np.float32)])
    assert sorted(model.parameters()) == ["t-linear-0-0", "t-linear-0-1"]
    assert model.parameters()["t-linear-0-0"].shape == (2, 3)  # NNC's [out, in]
