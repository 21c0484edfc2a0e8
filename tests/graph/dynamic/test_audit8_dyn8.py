"""Audit 8 of the dynamic graph: operators by numbers and misuse of ``backward``'s
arguments. Oracles: NumPy (float64 where it matters), ``jax.numpy`` and ``jax.grad``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from fnnc.errors import DTypeError
from fnnc.graph import DynamicGraph

X = np.float32([1.0, -3.0, 7.0, 0.1, 49.0, 0.0])


@pytest.mark.parametrize("c", [0, 0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-320])
def test_division_by_a_number_without_a_finite_reciprocal_is_numpys(c) -> None:
    """``x / 0`` raised Python's ZeroDivisionError (``/`` multiplied by ``1.0 / c``);
    it is inf / NaN as NumPy's, and so are ``x / inf`` and ``x / nan``."""
    dg = DynamicGraph()
    x = dg.variable(X, name="x")
    with np.errstate(divide="ignore", invalid="ignore"):
        want = X / np.float32(c)
    np.testing.assert_array_equal((x / c).numpy(), want)


@pytest.mark.parametrize("c", [3, 7.0, 0.3, -2.0, 0.125, np.float32(10)])
def test_division_by_a_number_is_x_over_c_with_its_gradient(c) -> None:
    """``x / c`` equals JAX's ``x / c`` exactly (a reciprocal only where it is exact)
    and is within an ulp of NumPy's; its gradient is ``1 / c`` (jax.grad)."""
    dg = DynamicGraph()
    x = dg.variable(X, name="x")
    y = x / c
    np.testing.assert_array_equal(y.numpy(), np.asarray(jnp.asarray(X) / jnp.float32(c)))
    np.testing.assert_allclose(y.numpy(), X.astype(np.float64) / float(c), rtol=2e-7)
    (dx,) = dg.backward(y.sum(), [x])
    want = jax.grad(lambda v: jnp.sum(v / jnp.float32(c)))(X)
    np.testing.assert_allclose(dx.numpy(), want, rtol=1e-6)


def test_16_bit_division_by_a_number_rounds_once() -> None:
    """A bfloat16 ``x / 3`` (float32 product, rounded once) is float64's quotient
    rounded to bfloat16; by 0 it is inf as NumPy's."""
    x0 = np.array([1.0, 3.0, 5.0, -7.0, 100.0], ml_dtypes.bfloat16)
    dg = DynamicGraph()
    x = dg.variable(x0)
    want = (x0.astype(np.float64) / 3.0).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal((x / 3).numpy(), want)
    assert np.isinf((x / 0).numpy().astype(np.float32)).all()


@pytest.mark.parametrize(
    "x0, c",
    [
        (np.int32([1, 2, -3]), 2**40),
        (np.int32([1, 2, -3]), np.int64(-(2**33))),
        (np.uint8([1, 2, 3]), -1),
        (np.int8([1, 2, 3]), 300.0),
    ],
)
def test_integer_variable_times_a_number_its_type_cannot_hold_is_refused(x0, c) -> None:
    """``int32 * 2**40`` gave [-2**31, 0, ...] (the factor converted out of range);
    NumPy refuses such a factor (OverflowError), and fnnc says so as for ``+``."""
    with pytest.raises(OverflowError):
        x0 * (c.item() if isinstance(c, np.generic) else int(c))
    dg = DynamicGraph()
    x = dg.variable(x0, name="n")
    for expr in (lambda: x * c, lambda: c * x):
        with pytest.raises(DTypeError, match=r"\* with variable 'n': .* is outside"):
            expr()


@pytest.mark.parametrize("x0, c", [(np.int32([1, -2, 3]), -3), (np.uint8([1, 2, 3]), 200)])
def test_integer_variable_times_a_number_it_holds_is_numpys_product(x0, c) -> None:
    """Whole factors in range keep working, wrapping as NumPy's integer product."""
    dg = DynamicGraph()
    x = dg.variable(x0)
    np.testing.assert_array_equal((x * c).numpy(), x0 * c)
    np.testing.assert_array_equal((float(c) * x).numpy(), x0 * c)
