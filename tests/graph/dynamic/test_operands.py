"""Variable operators take NumPy and JAX arrays and Python numbers on either side, with
``.T``, ``.mean()`` and ``**`` recorded as commands (issue 25, item 5). Oracles: the same
expression in NumPy for values, ``jax.grad`` for gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc.errors import DTypeError, FnncError, ShapeError
from fnnc.graph import DynamicGraph
from fnnc.graph.dynamic import Variable
from tests.helpers import rand

A = rand((2, 3), seed=1) + 2.0  # positive: real powers and logs are defined
B = np.linspace(0.5, 1.5, 6).reshape(2, 3)  # float64, as NumPy makes it
W = rand((3, 4), seed=2)

# name: expression, or (expression, the same for NumPy and JAX where they spell it
# otherwise); ``x`` is a variable, or for the oracles a NumPy or JAX array, of A
EXPRESSIONS = {
    "x + ndarray": lambda x: x + B,
    "ndarray + x": lambda x: B + x,
    "x - ndarray": lambda x: x - B,
    "ndarray - x": lambda x: B - x,
    "x * ndarray": lambda x: x * B,
    "ndarray * x": lambda x: B * x,
    "x / ndarray": lambda x: x / B,
    "ndarray / x": lambda x: B / x,
    "x @ ndarray": lambda x: x @ W,
    "ndarray @ x": lambda x: W.T @ x.T,
    "x + jax array": lambda x: x + jnp.asarray(B, jnp.float32),
    "jax array * x": lambda x: jnp.asarray(B, jnp.float32) * x,
    "x + row (broadcast)": lambda x: x + B[0],
    "x + int array": lambda x: x + np.arange(3),
    "x * list": (lambda x: x * [1.0, -2.0, 0.5], lambda x: x * np.array([1.0, -2.0, 0.5])),
    "np.float32 * x": lambda x: np.float32(3) * x,
    "x ** 2": lambda x: x**2,
    "x ** 3": lambda x: x**3,
    "x ** 5": lambda x: x**5,
    "x ** -2": lambda x: x**-2,
    "x ** 0.5": lambda x: x**0.5,
    "x ** -0.5": lambda x: x**-0.5,
    "x ** 1.7": lambda x: x**1.7,
    "x ** np.float32(2)": lambda x: x ** np.float32(2),
    "2 ** x": lambda x: 2.0**x,
    "x ** ndarray": lambda x: x**B,
    "ndarray ** x": lambda x: B**x,
    "x.T": lambda x: x.T @ B,
    "mean()": lambda x: x.mean(),
    "mean(axis=0)": lambda x: x.mean(axis=0),
    "mean(axis=-1, keepdims)": lambda x: x.mean(axis=-1, keepdims=True),
    "mean(axis=(0, 1))": lambda x: x.mean(axis=(0, 1)),
    "mixed": lambda x: ((x - B) ** 2).mean(axis=1) * np.array([2.0, 3.0]),
    "sum(axis=0, keepdims=False)": lambda x: x.sum(axis=0, keepdims=False),
    "sum(axis=(0, 1), keepdims=False)": lambda x: x.sum(axis=(0, 1), keepdims=False),
    "sum(axis=-1)": (lambda x: x.sum(axis=-1), lambda x: x.sum(axis=-1, keepdims=True)),
    "sum()": (lambda x: x.sum(), lambda x: x.sum(keepdims=True)),  # NNC's [1, 1]
    "max(axis=1)": lambda x: x.max(axis=1),
    "max(axis=0, keepdims)": lambda x: x.max(axis=0, keepdims=True),
    "min()": lambda x: x.min(),
    "min(axis=-1)": lambda x: x.min(axis=-1),
}


@pytest.mark.parametrize("name", list(EXPRESSIONS))
def test_value_equals_numpy_and_gradient_equals_jax(name):
    f = oracle = EXPRESSIONS[name]
    if isinstance(f, tuple):
        f, oracle = f
    dg = DynamicGraph()
    x = dg.variable(A, name="x")
    y = f(x)
    assert isinstance(y, Variable), f"{name} gave a {type(y).__name__}"
    want = oracle(A.astype(np.float64)).astype(np.float32)
    assert y.shape == want.shape and y.dtype == np.float32
    np.testing.assert_allclose(y.numpy(), want, rtol=2e-5, atol=1e-6, err_msg=name)
    seed = rand(y.shape, seed=3)
    (dx,) = dg.backward(y, [x], df=[seed])
    with jax.numpy_rank_promotion("allow"):  # NumPy's broadcasting, as the operators do
        want_dx = jax.grad(lambda v: jnp.sum(oracle(v) * seed))(jnp.asarray(A))
    np.testing.assert_allclose(dx.numpy(), want_dx, rtol=2e-5, atol=1e-5, err_msg=name)


def test_transpose_of_three_axes_and_of_a_vector():
    dg = DynamicGraph()
    c = rand((2, 3, 4), seed=4)
    np.testing.assert_array_equal(dg.variable(c).T.numpy(), c.T)
    v = dg.variable(c[0, 0])
    assert v.T is v  # NumPy: .T of a vector is the vector


def test_other_ufuncs_still_compute_in_numpy():
    dg = DynamicGraph()
    x = dg.variable(A)
    got = np.exp(x)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, np.exp(A), rtol=1e-6)


def test_integer_variable_with_float_array_is_a_dtype_error():
    dg = DynamicGraph()
    n = dg.variable(np.arange(3, dtype=np.int32), name="n")
    np.testing.assert_array_equal((n + np.arange(3)).numpy(), [0, 2, 4])
    with pytest.raises(DTypeError, match="share one dtype"):
        n + np.ones(3, np.float32)


@pytest.mark.parametrize(
    ("operand", "shown"),
    [("abc", "str 'abc'"), (["a", "b"], "list"), ({"k": 1}, "dict"), (object(), "object")],
)
@pytest.mark.parametrize("op", ["+", "-", "*", "/", "@", "**", "r+", "r*", "r**"])
def test_anything_else_is_an_fnnc_error_naming_the_operand(operand, shown, op):
    dg = DynamicGraph()
    x = dg.variable(A, name="x")
    run = {
        "+": lambda: x + operand,
        "-": lambda: x - operand,
        "*": lambda: x * operand,
        "/": lambda: x / operand,
        "@": lambda: x @ operand,
        "**": lambda: x**operand,
        "r+": lambda: operand + x,
        "r*": lambda: operand * x,
        "r**": lambda: operand**x,
    }[op]
    with pytest.raises(FnncError, match=rf"variable 'x'.*{shown}.*not a tensor"):
        run()


def test_mean_over_a_missing_axis_names_the_variable():
    dg = DynamicGraph()
    x = dg.variable(A, name="x")
    with pytest.raises(ShapeError, match=r"variable 'x': mean over axis 2 of a 2-d"):
        x.mean(axis=2)


@pytest.mark.parametrize("kind", ["sum", "max", "min"])
def test_reductions_over_a_missing_axis_name_the_variable(kind):
    dg = DynamicGraph()
    x = dg.variable(A, name="x")
    with pytest.raises(ShapeError, match=rf"variable 'x': {kind} over axis 2 of a 2-d"):
        getattr(x, kind)(axis=2)
    with pytest.raises(ShapeError, match=rf"variable 'x': {kind}\(keepdims='no'\)"):
        getattr(x, kind)(axis=0, keepdims="no")
