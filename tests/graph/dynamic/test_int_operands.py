"""Operators on integer variables: a number the variable's type cannot hold, and true
division, raise the DTypeError ``v * 0.5`` raises, instead of computing in
the integer type with the fraction dropped (``v + 0.5`` was ``v``, ``v / w`` truncated).
Oracle: NumPy in int64 where the answer is an integer."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc.errors import DTypeError
from fnnc.graph import DynamicGraph

X = np.array([7, -7, 3, 0], np.int32)


def _var(x=X):
    return DynamicGraph().constant(x)


@pytest.mark.parametrize(
    "expr, numpy",
    [
        (lambda v: v + 2.0, lambda x: x + 2),
        (lambda v: 3.0 - v, lambda x: 3 - x),
        (lambda v: v - np.float64(-4.0), lambda x: x + 4),
        (lambda v: v + np.int64(5), lambda x: x + 5),
        (lambda v: v * 2.0, lambda x: 2 * x),
    ],
)
def test_whole_numbers_combine_with_integer_variables_as_numpy(expr, numpy):
    got = np.asarray(expr(_var()))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, numpy(X.astype(np.int64)))


@pytest.mark.parametrize(
    "expr, shown",
    [
        (lambda v: v + 0.5, r"\+ with variable .*: 0.5 would be truncated in an int32 tensor"),
        (lambda v: 2.5 + v, r"\+ with variable .*: 2.5 would be truncated"),
        (lambda v: v - 0.7, r"- with variable .*: 0.7 would be truncated"),
        (lambda v: np.float32(0.25) + v, r"\+ with variable .*: 0.25 would be truncated"),
        (lambda v: v + float("nan"), r"\+ with variable .*: nan is not finite"),
        (lambda v: v * 0.5, r"scalar_mul: a=0.5 on int32\[4\] would be truncated"),
    ],
)
def test_fractional_numbers_on_integer_variables_are_refused(expr, shown):
    with pytest.raises(DTypeError, match=shown) as info:
        expr(_var())
    assert "float type" in str(info.value) and "datatype_conversion" in str(info.value)


def test_numbers_outside_the_variable_type_are_refused():
    with pytest.raises(DTypeError, match=r"is outside int8's range \[-128, 127\]"):
        _var(X.astype(np.int8)) + 300


def test_float_variables_take_fractions():
    x = X.astype(np.float32)
    np.testing.assert_allclose(np.asarray(2.5 + _var(x) - 0.7), 2.5 + x - 0.7, rtol=1e-6)


W = np.full(4, 2, np.int32)


@pytest.mark.parametrize(
    "expr, shown",
    [
        (lambda v, w: v / w, r"/ with variable .* int32\[4\]: the quotient would be truncated"),
        (lambda v, w: 3 / w, r"/ with variable .* int32\[4\]: the quotient would be truncated"),
        (lambda v, w: X / w, r"/ with variable .*: the quotient would be truncated"),
        (lambda v, w: v**-1, r"\*\* -1 with variable .*: the quotient would be truncated"),
        (lambda v, w: v**-3, r"\*\* -3 with variable .*: the quotient would be truncated"),
        (lambda v, w: v / 2, r"/ with variable .* int32\[4\]: the quotient would be truncated"),
        (lambda v, w: v / 1, r"/ with variable .* int32\[4\]: the quotient would be truncated"),
    ],
)
def test_true_division_of_integer_variables_is_refused(expr, shown):
    dg = DynamicGraph()
    v, w = dg.constant(X), dg.constant(W)
    before = dg.num_nodes
    with pytest.raises(DTypeError, match=shown) as info:
        expr(v, w)
    assert "convert the inputs to a float type first (datatype_conversion)" in str(info.value)
    assert dg.num_nodes == before  # refused before anything is recorded (v**-3 squared first)


def test_float_division_and_integer_powers_still_compute():
    x, w = X.astype(np.float32) + 10, W.astype(np.float32)
    dg = DynamicGraph()
    np.testing.assert_allclose(np.asarray(dg.constant(x) / dg.constant(w)), x / w, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(dg.constant(x) ** -2), x**-2.0, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(_var() ** 3), X.astype(np.int64) ** 3)
