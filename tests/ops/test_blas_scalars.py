"""add, mul and scalar_mul's scalars on integer inputs: whole numbers compute as NumPy
does, fractional ones are refused (computed in the input's type they were truncated
first: ``scalar_mul(a=0.5)`` of ``[0, 1, ..., 5]`` gave zeros, silently)."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import DTypeError
from fnnc.graph import DynamicGraph, GraphBuilder

X = np.arange(-3, 6, dtype=np.int32)


@pytest.mark.parametrize(
    "cmd, args, want",
    [
        (ops.scalar_mul(a=-3.0), (X,), -3 * X),
        (ops.mul(p=2.0), (X, X), 2 * X * X),
        (ops.add(p=2.0, q=-1.0), (X, X[::-1].copy()), 2 * X - X[::-1]),
    ],
)
def test_whole_scalars_on_integers_compute_as_numpy(cmd, args, want):
    got = np.asarray(cmd(*args))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "cmd, args, given",
    [
        (ops.scalar_mul(a=0.5), (X,), "a=0.5"),
        (ops.scalar_mul(a=float("inf")), (X,), "a=inf"),
        (ops.mul(p=2.7), (X, X), "p=2.7"),
        (ops.add(p=0.5, q=1.5), (X, X), "p=0.5, q=1.5"),
        (ops.add(q=0.25), (X > 0, X > 1), "q=0.25"),
    ],
)
def test_fractional_scalars_on_integers_are_refused_where_the_node_is_made(cmd, args, given):
    with pytest.raises(DTypeError, match=rf"{cmd.name}: {given} on .* would be truncated"):
        cmd(*args)
    b = GraphBuilder()
    inputs = [b.input(a.shape, a.dtype, name=f"x{i}") for i, a in enumerate(args)]
    with pytest.raises(DTypeError, match="convert the inputs to a float type first"):
        b.exec(cmd, *inputs, name="scaled")


def test_floats_take_any_scalar():
    x = X.astype(np.float32)
    np.testing.assert_allclose(np.asarray(ops.scalar_mul(a=0.5)(x)), 0.5 * x)
    np.testing.assert_allclose(np.asarray(ops.add(p=0.5, q=1.5)(x, x)), 2 * x)


def test_dynamic_graph_division_of_an_integer_variable_says_so():
    v = DynamicGraph().variable(X)
    np.testing.assert_array_equal(np.asarray(v * 2), 2 * X)
    with pytest.raises(DTypeError, match=r"/ with variable .* int32\[9\]: the quotient would"):
        v / 2
