"""Audit 8 of the dynamic graph: operators by numbers and misuse of ``backward``'s
arguments. Oracles: NumPy (float64 where it matters), ``jax.numpy`` and ``jax.grad``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import DTypeError, GraphError, ShapeError
from fnnc.graph import DynamicGraph
from fnnc.models import Dense, Input, Model

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


def _square():
    dg = DynamicGraph()
    w = dg.variable(np.float32([1.0, 2.0]), name="w")
    return dg, w, w * w


def test_a_seed_or_into_of_another_dtype_or_shape_names_backwards_arguments() -> None:
    """A df variable of another dtype and an into of another shape or dtype failed in
    the compiled program ('Program: input %1 expects float32[2]'), naming neither the
    argument nor f / wrt; a df that is no array raised a bare ValueError."""
    dg, w, y = _square()
    for df in (dg.constant(np.ones(2, ml_dtypes.bfloat16)), dg.constant(np.ones(2, np.int32))):
        with pytest.raises(DTypeError, match=r"backward: df for f .* is a variable of \w+, f is"):
            dg.backward(y, [w], df=df)
    for df in ("a", [[None, None]]):
        with pytest.raises(DTypeError, match=r"backward: df for f .* not an array of numbers"):
            dg.backward(y, [w], df=df)
    for into, error in (
        (dg.constant(np.zeros(3, np.float32), name="acc"), ShapeError),
        (dg.constant(np.zeros(2, np.int32), name="acc"), DTypeError),
    ):
        with pytest.raises(error, match=r"backward: into 0 'acc' is \w+\[\d\], .* wrt 'w'"):
            dg.backward(y.sum(), [w], into=[into])
    with pytest.raises(GraphError, match="backward: into is an array"):
        dg.backward(y.sum(), [w], into=[np.zeros(2, np.float32)])
    # what is right still works: an array seed of another float type, an into
    acc = dg.constant(np.float32([10.0, 10.0]))
    (g,) = dg.backward(y, [w], df=np.float16([1.0, 2.0]), into=[acc])
    assert g is acc
    np.testing.assert_array_equal(acc.numpy(), [12.0, 18.0])  # 10 + df * 2 w


def test_apply_gradients_with_no_optimizer_says_so_before_looking_for_gradients() -> None:
    """apply_gradients('sgd', [w]) said 'w has no gradient; call backward first'."""
    dg, w, _ = _square()
    for step in (
        lambda: dg.apply_gradients("sgd", [w]),
        lambda: dg.minimize(lambda g: g, (w * w).sum(), [w]),
    ):
        with pytest.raises(GraphError, match=r"optimizer must be an optax\.GradientTransformation"):
            step()
    dg.minimize(optax.sgd(0.5), (w * w).sum(), [w])  # w - 0.5 * 2 w = 0
    np.testing.assert_array_equal(w.numpy(), [0.0, 0.0])


def test_evaluate_takes_numbers_as_constants_and_refuses_a_bare_variable() -> None:
    """dg.evaluate(model, [[[1, 2], ...]]) raised AttributeError ('list' has no shape)
    and dg.evaluate(model, x) ran on x's rows as inputs ('takes 1 inputs, got 4')."""
    inp = Input()
    model = Model([inp], Dense(3, name="fc")(inp))
    model.compile([jax.ShapeDtypeStruct((4, 2), jnp.float32)])
    rows = [[1.0, 2.0], [0.5, -1.0], [0.0, 3.0], [2.0, 2.0]]
    dg = DynamicGraph()
    y = dg.evaluate(model, [rows])
    params = model.parameters()
    want = np.asarray(rows, np.float64) @ np.asarray(params["t-fc-0-0"], np.float64).T
    want += np.asarray(params["t-fc-0-1"], np.float64)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5)
    x = dg.variable(np.asarray(rows, np.float32))
    with pytest.raises(GraphError, match=r"inputs is a list .* got Variable; pass \[x\]"):
        dg.evaluate(model, x)


def test_a_reduction_over_a_float_axis_is_a_shape_error_and_axis_sequences_work() -> None:
    """y.sum(axis=1.0) raised a bare TypeError ('float' object is not iterable)."""
    y0 = np.float32([[1, 2, 3], [4, 5, 6]])
    y = DynamicGraph().variable(y0, name="y")
    for kind in ("sum", "mean", "max", "min"):
        with pytest.raises(ShapeError, match=rf"variable 'y': {kind} over axis 1.0 of a 2-d"):
            getattr(y, kind)(axis=1.0)
    for axis in (range(2), np.array([0, 1]), [1], np.int64(-1)):
        got = y.sum(axis=axis, keepdims=False).numpy()
        np.testing.assert_array_equal(got, y0.sum(axis=tuple(np.atleast_1d(axis).tolist())))


def test_reshape_of_an_empty_variable_with_a_free_axis_is_refused_as_numpy() -> None:
    """A [0, 3] variable's reshape(0, -1) gave [0, 0]; NumPy refuses it (the -1 could
    be any size). Reshapes NumPy takes keep working."""
    x0 = np.zeros((0, 3), np.float32)
    with pytest.raises(ValueError):
        x0.reshape(0, -1)
    x = DynamicGraph().variable(x0, name="x")
    with pytest.raises(ShapeError, match=r"variable 'x': cannot reshape \[0, 3\] to \[0, -1\]"):
        x.reshape(0, -1)
    for shape in ((-1, 3), (3, 0), (0,), (-1,)):
        assert x.reshape(*shape).shape == x0.reshape(*shape).shape


def test_an_array_written_with_leading_size_1_axes_is_written_as_numpy_does() -> None:
    """y[0] = np.ones((1, 3)) (a [1, 3] array into a [3] row) was a ShapeError; NumPy's
    assignment drops leading size-1 axes. What NumPy refuses stays refused."""
    y0 = np.float32([[1, 2, 3], [4, 5, 6]])
    dg = DynamicGraph()
    y = dg.variable(y0, name="y")
    want = y0.copy()
    for index, value in (
        (0, np.float32([[7, 8, 9]])),
        ((1, slice(1, None)), np.float32([[[0.5]]])),
    ):
        want[index] = value
        y[index] = value
        np.testing.assert_array_equal(y.numpy(), want)
    with pytest.raises(ValueError):
        want[0] = np.ones((3, 1), np.float32)
    with pytest.raises(ShapeError, match=r"write into .* \[3, 1\], which does not broadcast"):
        y[0] = np.ones((3, 1), np.float32)


def test_an_empty_view_past_the_end_reads_writes_and_differentiates_as_numpy() -> None:
    """x[6:] of 6 elements (x[i:] at i == n) raised a bare ValueError ('index 6 is out
    of bounds') when read, computed on, written or differentiated; NumPy gives []."""
    x0 = np.arange(6, dtype=np.float32)
    dg = DynamicGraph()
    x = dg.variable(x0, name="x")
    np.testing.assert_array_equal(x[6:].numpy(), x0[6:])
    np.testing.assert_array_equal(x.reshape(2, 3)[2:].numpy(), x0.reshape(2, 3)[2:])
    np.testing.assert_array_equal(dg.alias(x, (0,), base=6).numpy(), x0[6:])
    y = x * 1.0
    y[6:] = 5.0
    np.testing.assert_array_equal(y.numpy(), x0)
    (dx,) = dg.backward(x[6:].sum() + (x * x).sum(), [x])
    np.testing.assert_array_equal(
        dx.numpy(), jax.grad(lambda v: jnp.sum(v[6:]) + jnp.sum(v * v))(x0)
    )
    lazy = DynamicGraph(lazy=True)
    np.testing.assert_array_equal((lazy.variable(x0)[6:] * 2.0).numpy(), x0[6:] * 2)


@pytest.mark.parametrize("shape", [(-1,), (2.5,), (True,)])
def test_an_alias_of_a_size_that_is_no_count_is_a_shape_error(shape) -> None:
    """dg.alias(x, (-1,)) raised JAX's TypeError ('limit_indices must be nonnegative')
    and dg.alias(x, (2.5,)) silently viewed 2 elements."""
    dg = DynamicGraph()
    x = dg.variable(np.arange(6, dtype=np.float32), name="x")
    with pytest.raises(ShapeError, match=r"alias of variable 'x': shape .* give sizes as ints"):
        dg.alias(x, shape)
    np.testing.assert_array_equal(dg.alias(x, (np.int64(2),), offset=(1,)).numpy(), [1.0, 2.0])


def test_exec_outputs_given_a_bare_variable_is_refused_not_split_into_rows() -> None:
    """exec(cmd, x, outputs=y) iterated y into its rows: 'the command has 1 outputs, 2
    were given' for a [2] y, and a two-output command would have written y[0], y[1]."""
    x0 = np.float32([0.1, 0.5])
    dg = DynamicGraph()
    x = dg.variable(x0, name="x")
    y = dg.variable(np.zeros(2, np.float32), name="y")
    with pytest.raises(GraphError, match=r"outputs is a list .* got Variable; pass outputs=\[y\]"):
        dg.exec(ops.ewexp(), x, outputs=y)
    assert dg.exec(ops.ewexp(), x, outputs=(y,)) is y
    np.testing.assert_allclose(y.numpy(), np.exp(x0), rtol=1e-6)


def test_zero_grad_of_one_variable_forgets_its_gradient() -> None:
    """zero_grad(w) iterated w into row views and popped their (absent) gradients, so
    the next backward added onto w's old gradient: 2x jax.grad instead of 1x."""
    w0 = np.float32([[1.0, 2.0], [3.0, -1.0]])
    dg = DynamicGraph()
    w = dg.variable(w0, name="w")
    dg.backward((w * w).sum(), [w])
    dg.zero_grad(w)
    assert dg.grad(w) is None
    (g,) = dg.backward((w * w).sum(), [w])
    np.testing.assert_array_equal(g.numpy(), jax.grad(lambda v: jnp.sum(v * v))(w0))


def test_has_effect_of_one_variable_gives_one_answer() -> None:
    """has_effect(x, [y]) of a [3, 2] x iterated x into rows: [True, True, True]."""
    dg = DynamicGraph()
    x = dg.variable(np.ones((3, 2), np.float32), name="x")
    c = dg.variable(np.ones(1, np.float32), name="c")
    y = dg.exec(ops.ewexp(), x)
    assert dg.has_effect(x, [y]) == [True]
    assert dg.has_effect([x, c], y) == [True, False]


@pytest.mark.parametrize("base", [-2.0, 0.0, 3.0, "array"])
def test_a_number_or_array_to_a_variables_power_is_numpys(base) -> None:
    """``base ** x`` for a base <= 0 was ``exp(x log base)``, NaN everywhere; it is C's
    pow as NumPy computes it, and its gradient jax.grad's of ``jnp.power``."""
    X = np.array([0, 1, 2, 3, 0.5, 1.5], np.float32)
    if base == "array":
        base = np.array([-2, 0, 2, -1, 4, 0.5], np.float32)
    dg = DynamicGraph()
    x = dg.variable(X)
    y = base**x
    with np.errstate(invalid="ignore"):
        want = np.power(np.asarray(base, np.float64), X.astype(np.float64))
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6, equal_nan=True)
    (dx,) = dg.backward(y.sum(), [x])
    want_dx = jax.grad(lambda v: jnp.sum(jnp.power(jnp.asarray(base, jnp.float32), v)))(X)
    np.testing.assert_allclose(dx.numpy(), want_dx, rtol=1e-6, equal_nan=True)
