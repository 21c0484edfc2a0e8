"""Integer and bool tensors in elementwise, data and reduce commands: values as NumPy
computes them in a wide type, or a DTypeError naming the command where the dtype cannot
hold the answer (a clamp bound of 255 on int8 wrapped to -1 and clamped every element
to -1; fill values were truncated or wrapped; sqrt of an int32 was a raw JAX error)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from fnnc import ops
from fnnc.errors import DTypeError
from fnnc.graph import GraphBuilder, compile, interpret, simplify, trace


def _integer_clamp(x, lo, hi):
    """Brute force: the value of x's dtype within [lo, hi] closest to each element."""
    info = np.iinfo(x.dtype)
    values = np.arange(int(info.min), int(info.max) + 1, dtype=np.int64)
    lo = -np.inf if lo is None or np.isnan(lo) else lo
    hi = np.inf if hi is None or np.isnan(hi) else hi
    values = values[(values >= lo) & (values <= hi)]
    nearest = np.abs(values[None, :] - x.astype(np.int64)[:, None]).argmin(axis=1)
    return values[nearest].astype(x.dtype)


def _clamp_every_way(x, lo, hi):
    """clamp eagerly, interpreted, compiled, and fused with a following ewsum."""
    cmd = ops.clamp(min=lo, max=hi)
    zeros = np.zeros_like(x)
    b = GraphBuilder()
    xi, zi = b.input(x.shape, x.dtype, name="x"), b.input(x.shape, x.dtype, name="zero")
    g = b.build([b.exec(ops.ewsum(), b.exec(cmd, xi, name="clamp"), zi)])
    fused = simplify(g)
    assert [n.cmd.name for n in fused.nodes] == ["fused_elementwise"]
    return {
        "eager": cmd(x),
        "interpret": interpret(g, x, zeros),
        "compile": compile(g)(x, zeros),
        "fused": compile(fused)(x, zeros),
    }


I8 = np.array([-128, -3, 0, 2, 100, 127], np.int8)
U8 = np.array([0, 2, 200, 255], np.uint8)


@pytest.mark.parametrize(
    "x, lo, hi",
    [
        (I8, 0, 255),  # max beyond int8: no upper bound (it wrapped to -1)
        (I8, -1000, 50),
        (I8, 0.5, 5.5),  # fractional: rounded inward, 1 and 5
        (I8, -2.5, float("nan")),  # NaN: no bound, as NNC spells it
        (I8, float("-inf"), -127.5),
        (U8, -1, 300),  # both beyond uint8: no bounds (they wrapped to 255 and 44)
        (U8, 1.5, 199.9),
        (U8, None, 254.99),
    ],
)
def test_integer_clamp_is_the_exact_clamp(x, lo, hi):
    want = _integer_clamp(x, lo, hi)
    for way, got in _clamp_every_way(x, lo, hi).items():
        got = np.asarray(got)
        assert got.dtype == x.dtype, way
        np.testing.assert_array_equal(got, want, err_msg=way)


@pytest.mark.parametrize("lo, hi", [(0, 2**40), (-(2**40), 3), (-7.5, 2.0**31), (None, 2**31 - 1)])
def test_int32_clamp_matches_numpy_in_int64(lo, hi):
    x = np.array([-(2**31), -8, -2, 0, 5, 2**31 - 1], np.int32)
    want = np.clip(x.astype(np.float64), lo, hi)
    want = np.where(want == lo, np.ceil(want), np.floor(want)).astype(np.int64).astype(np.int32)
    for way, got in _clamp_every_way(x, lo, hi).items():
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=way)


@pytest.mark.parametrize("bounds", [{"min": 300}, {"max": -129}, {"min": float("inf")}])
def test_integer_clamp_outside_the_dtype_is_refused(bounds):
    (what, value), x = next(iter(bounds.items())), I8
    with pytest.raises(DTypeError, match=rf"clamp: {what}={value!r} lies outside int8's range"):
        ops.clamp(**bounds)(x)
    b = GraphBuilder()
    with pytest.raises(DTypeError, match="datatype_conversion"):
        b.exec(ops.clamp(**bounds), b.input(x.shape, x.dtype, name="x"))


def test_float_clamp_keeps_its_bounds():
    x = np.array([-3.0, 0.25, 0.75, 9.0, np.nan], np.float32)
    got = np.asarray(ops.clamp(min=0.5, max=300.0)(x))
    np.testing.assert_array_equal(got, np.clip(x, 0.5, 300.0))


# --- fill values: set, pad, masked_fill ----------------------------------------------

X32 = np.array([1, 2, 3], np.int32)
MASK = np.array([1, 0, 1], np.int32)


def _fill(name, value, dtype):
    """The command ``name`` writing ``value`` into a tensor of ``dtype``."""
    x = X32.astype(dtype)
    if name == "set":
        return lambda: ops.set(shape=(3,), value=value, dtype=dtype)()
    if name == "pad":
        return lambda: ops.pad(pads=((1, 1),), value=value)(x)
    return lambda: ops.masked_fill(eq=1, fill=value)(x, MASK)


def _numpy_fill(name, value, dtype):
    x = X32.astype(dtype)
    if name == "set":
        return np.full((3,), value, dtype)
    if name == "pad":
        return np.pad(x, ((1, 1),), constant_values=np.asarray(value, dtype))
    return np.where(MASK == 1, np.asarray(value, dtype), x)


FILLS = ("set", "pad", "masked_fill")


@pytest.mark.parametrize("name", FILLS)
@pytest.mark.parametrize(
    "value, dtype",
    [(7, np.int32), (-2.0, np.int32), (127, np.int8), (255.0, np.uint8), (1, np.bool_)],
)
def test_whole_fill_values_in_range_fill_as_numpy(name, value, dtype):
    got = np.asarray(_fill(name, value, dtype)())
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, _numpy_fill(name, value, dtype))


@pytest.mark.parametrize("name", FILLS)
@pytest.mark.parametrize(
    "value, dtype, problem",
    [
        (2.7, np.int32, "would be truncated in an int32 tensor"),
        (float("nan"), np.int32, "is not finite"),
        (float("-inf"), np.int8, "is not finite"),
        (300, np.int8, r"is outside int8's range \[-128, 127\]"),
        (-1, np.uint8, r"is outside uint8's range \[0, 255\]"),
        (2, np.bool_, r"is outside bool's range \[0, 1\]"),
    ],
)
def test_fill_values_an_integer_tensor_cannot_hold_are_refused(name, value, dtype, problem):
    what = "fill" if name == "masked_fill" else "value"
    with pytest.raises(DTypeError, match=rf"{name}: {what}={value!r} {problem}"):
        _fill(name, value, dtype)()


def test_float_fill_values_are_unchecked():
    x = np.array([1.0, 2.0], np.float16)
    got = np.asarray(ops.masked_fill(eq=1, fill=-1e8)(x, np.array([1, 0], np.int32)))
    np.testing.assert_array_equal(got, [-np.inf, 2.0])
    np.testing.assert_array_equal(np.asarray(ops.pad(pads=((1, 0),), value=0.5)(x)), [0.5, 1, 2])


# --- ewdiv of integers: C's division, as documented ----------------------------------


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint8])
def test_integer_ewdiv_truncates_toward_zero_and_gives_xlas_values_for_x_over_0(dtype):
    a = np.array([7, 100, 1, 5, 0, 9], dtype)
    b = np.array([2, 3, 3, 0, 0, 1], dtype)
    if np.issubdtype(dtype, np.signedinteger):
        a, b = a * np.array([1, -1, 1, -1, 1, 1], dtype), b * np.array([1, 1, -1, 1, 1, -1], dtype)
    wide_a, wide_b = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.trunc(wide_a / wide_b)
    by_zero = -1 if np.issubdtype(dtype, np.signedinteger) else np.iinfo(dtype).max
    want = np.where(b == 0, by_zero, want).astype(dtype)
    got = np.asarray(ops.ewdiv()(a, b))
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


def test_traced_integer_division_keeps_jaxs_value():
    a, b = jnp.array([7, -7, 9], jnp.int32), jnp.array([2, 2, -4], jnp.int32)
    graph = trace(lax.div, a, b)
    np.testing.assert_array_equal(np.asarray(compile(graph)(a, b)), [3, -3, -2])


# --- float-only and number-only commands; unique_consecutive of nothing ---------------

FLOAT_ONLY = (
    "ewexp",
    "ewlog",
    "ewsqrt",
    "ewrsqrt",
    "ewexpm1",
    "ewlog1p",
    "ewerf",
    "ewerfc",
    "ewsin",
    "ewcos",
)


@pytest.mark.parametrize("name", FLOAT_ONLY)
@pytest.mark.parametrize("x", [np.array([4, 2], np.int32), np.array([True, False])])
def test_float_only_unary_commands_refuse_integers_and_bools_by_name(name, x):
    cmd = getattr(ops, name)()
    with pytest.raises(DTypeError, match=rf"{name}: expected a floating-point input"):
        cmd(x)
    b = GraphBuilder()
    with pytest.raises(DTypeError, match="datatype_conversion"):
        b.exec(cmd, b.input(x.shape, x.dtype, name="x"))


def test_ewabs_still_takes_integers():
    x = np.array([-3, 0, 4], np.int32)
    np.testing.assert_array_equal(np.asarray(ops.ewabs()(x)), np.abs(x))


@pytest.mark.parametrize(
    "cmd, n", [(ops.ewsum(), 2), (ops.ewprod(), 2), (ops.ewdiv(), 2), (ops.scalar_mul(a=-1.0), 1)]
)
def test_arithmetic_on_bools_is_refused_by_name(cmd, n):
    m = np.array([True, False])
    with pytest.raises(DTypeError, match=rf"{cmd.name}: expected numbers, got bool\[2\]"):
        cmd(*[m] * n)


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_unique_consecutive_of_an_empty_tensor_has_only_unused_slots(dtype):
    values, counts = ops.unique_consecutive(bincount=3)(np.zeros((0,), dtype))
    np.testing.assert_array_equal(np.asarray(values), np.full(3, -1, dtype))
    np.testing.assert_array_equal(np.asarray(counts), np.zeros(3, np.int32))


# --- reduce_sum of bool; index_select out of range --------------------------------------

MASK2 = np.array([[True, True, False], [False, True, False]])


def test_reduce_sum_of_a_bool_mask_is_refused_with_what_to_do():
    with pytest.raises(DTypeError, match=r"reduce_sum: bool\[2, 3\] .*datatype_conversion"):
        ops.reduce_sum(axes=(1,))(MASK2)
    counted = ops.reduce_sum(axes=(1,))(ops.datatype_conversion(dtype="int32")(MASK2))
    np.testing.assert_array_equal(np.asarray(counted), MASK2.sum(axis=1, keepdims=True))


def test_traced_jnp_sum_of_a_mask_still_counts():
    graph = trace(lambda m: jnp.sum(m, axis=1), MASK2)
    np.testing.assert_array_equal(np.asarray(compile(graph)(MASK2)), MASK2.sum(axis=1))


@pytest.mark.parametrize(
    "x, fill",
    [
        (np.arange(4, dtype=np.float32), np.nan),
        (np.arange(4, dtype=np.int32), np.iinfo(np.int32).min),
        (np.arange(4, dtype=np.uint8), 255),
        (np.zeros(4, bool), True),
    ],
)
def test_index_select_out_of_range_reads_the_documented_fill(x, fill):
    got = np.asarray(ops.index_select()(x, np.array([1, 4, -1, 9], np.int32)))
    want = np.array([x[1], fill, x[-1], fill], x.dtype)
    np.testing.assert_array_equal(got, want)
