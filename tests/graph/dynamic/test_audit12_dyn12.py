"""Audit 12 of the dynamic graph: regression tests, each against an independent oracle
(NumPy, jax.grad, Optax) or the error a user must get."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc.errors import GraphError
from fnnc.graph import DynamicGraph


@pytest.mark.parametrize("lazy", [False, True])
def test_a_variable_of_another_graph_is_refused_and_left_intact(lazy: bool) -> None:
    # d2.free(a) freed d1's variable and d2.set(b, ...) wrote d1's slot through d2's
    # record (lazily, silently); both now say whose variable it is and change nothing
    d1, d2 = DynamicGraph(lazy=lazy), DynamicGraph(lazy=lazy)
    a = d1.variable(np.float32([1.0, 2.0]), name="a")
    b = a * 2.0
    for call in (
        lambda: d2.set(b, np.float32([0.0, 0.0])),
        lambda: d2.free(a),
        lambda: d2.grad(a),
        lambda: d2.zero_grad([a]),
        lambda: d2.value_of(b),
        lambda: d2.alias(a, (1,)),
    ):
        with pytest.raises(GraphError, match="belongs to another DynamicGraph"):
            call()
    np.testing.assert_array_equal(a.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(b.numpy(), [2.0, 4.0])
    (da,) = d1.backward((b * a).sum(), [a])
    np.testing.assert_allclose(da.numpy(), 4 * np.float32([1.0, 2.0]))  # d(2a²)/da
    # copying the value in is the documented way, lazily too (it read None before)
    c = d2.variable(b)
    np.testing.assert_array_equal((c * 3.0).numpy(), [6.0, 12.0])
