"""NNC's ``signed_sqrt.tests.c`` and ``swish.tests.c``, translated."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError
from fnnc.graph import GraphBuilder, backward, compile
from tests.helpers import assert_close, rand

NAN, INF = float("nan"), float("inf")


def test_signed_sqrt_has_signed_floors_and_positive_gradients_on_both_sides():
    values = np.array(
        [0, -0.0, 1e-8, -1e-8, 1e-6, -1e-6, 1, -1, 4, -4, INF, -INF, NAN, -NAN], np.float32
    )
    expected = [0.001, -0.001, 0.001, -0.001, 0.001, -0.001, 1, -1, 2, -2, INF, -INF, 0.001, -0.001]
    slopes = np.array([0, 0, 0, 0, 500, 500, 0.5, 0.5, 0.25, 0.25, 0, 0, 0, 0], np.float32)
    g = np.where(np.arange(14) % 2 == 1, -2, 2).astype(np.float32)
    cmd = ops.signed_sqrt(floor=1e-6)
    b = np.asarray(cmd(values))
    (h,) = cmd.definition.backward((g,), (values,), (None,), **cmd.kwargs)
    np.testing.assert_array_equal(np.signbit(b), np.signbit(np.array(expected, np.float32)))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(b[finite], np.array(expected)[finite], atol=1e-7)
    assert np.all(np.isinf(b[~finite]))
    np.testing.assert_allclose(np.asarray(h), slopes * g, atol=1e-4)


@pytest.mark.parametrize("floor", [0.0, -1.0, INF, NAN])
def test_signed_sqrt_validates_floors(floor):
    with pytest.raises(CommandError, match="floor must be finite and positive"):
        ops.signed_sqrt(floor=floor)(np.zeros((0,), np.float32))


def test_signed_sqrt_empty_tensors():
    assert ops.signed_sqrt()(np.zeros((0,), np.float32)).shape == (0,)


def test_signed_sqrt_distinguishes_clamped_inputs_from_boundary_inputs():
    values = np.array([-4, -0.25, -0.125, -0.0, 0, 0.125, 0.25, 4], np.float32)
    cmd = ops.signed_sqrt(floor=0.25)
    (h,) = cmd.definition.backward((np.full(8, 2, np.float32),), (values,), (None,), **cmd.kwargs)
    np.testing.assert_allclose(cmd(values), [-2, -0.5, -0.5, -0.5, 0.5, 0.5, 0.5, 2], atol=1e-6)
    np.testing.assert_allclose(h, [0.5, 2, 0, 0, 0, 0, 2, 0.5], atol=1e-6)


def _value_and_gradient(build):
    b = GraphBuilder()
    x = b.input((10,), name="x")
    y = build(b, x)
    total = b.exec(
        ops.reshape(shape=()),
        b.exec(ops.reduce_sum(axes=(0,)), b.exec(ops.mul(), y, b.input((10,), name="dy"))),
    )
    graph, _ = backward(b.build([y, total]), total, [x])
    return compile(graph)


@pytest.mark.parametrize("beta", [1.0, 1.7])
def test_swish_gradient_matches_the_fine_grained_graph(beta):
    """``swish(beta)`` against ``mul(x, sigmoid(beta * x))`` built from commands (NNC's
    test at its default beta 1), values and gradients.

    NNC TEST_CASE covered here:
    "compare swish gradient with fine-grained symbolic graph".
    """

    def fine_grained(b, x):
        return b.exec(ops.mul(), x, b.exec(ops.sigmoid(), b.exec(ops.scalar_mul(a=beta), x)))

    fine = _value_and_gradient(fine_grained)
    fused = _value_and_gradient(lambda b, x: b.exec(ops.swish(beta=beta), x))
    x, dy = rand([10], lo=0, hi=1, seed=1), rand([10], seed=2)
    y_fine, _, dx_fine = fine(x, dy)
    y_fused, _, dx_fused = fused(x, dy)
    assert_close(y_fused, y_fine, atol=1e-6)
    assert_close(dx_fused, dx_fine, atol=1e-6)


def test_swish_beta_is_x_times_sigmoid_of_beta_x():
    x = rand([10], lo=-3, hi=3, seed=3)
    want = x / (1 + np.exp(-1.5 * x.astype(np.float64)))
    assert_close(ops.swish(beta=1.5)(x), want, atol=1e-6)
    assert math.isclose(
        float(ops.swish(beta=1.0)(np.float32(2.0))), 2 / (1 + math.exp(-2)), rel_tol=1e-6
    )
