"""What a :class:`~.variable.Variable` operator takes, and the operators built from commands.

An operand of ``+ - * / @ **`` is a variable, a Python or NumPy number, or an array
(NumPy, JAX, or a list of numbers); anything else is a :class:`DTypeError` naming it.
Numbers and arrays become constants of the variable's dtype where NumPy would promote
to it (``float32 + float64 array`` is float32, as JAX computes with 64-bit types off;
``float32 + int array`` is float32); an array of another kind (floats beside an integer
variable) keeps its dtype, and the command then says the dtypes differ. A number beside
an integer or bool variable must be a value of its type (whole, finite, in range), as
for ``*``'s ``scalar_mul``: ``v + 2.0`` adds 2, ``v + 0.5`` is a :class:`DTypeError`
rather than ``v + 0`` with the fraction dropped (convert ``v`` to a float type first).
``/`` of integer variables is a :class:`DTypeError` too (NumPy's would give floats).

``**`` is recorded with existing commands, so gradients flow: an integer power is
``ewprod`` by repeated squaring (``1 / x**n`` for a negative one, floats only, as
``/``), ``x**0.5`` is
``ewsqrt``, ``x**-0.5`` ``ewrsqrt``, and any other exponent ``exp(p * log x)``, which,
like NumPy's real power, is defined for ``x > 0`` (``x = 0`` gives 0, a NaN gradient).
A number or array to a variable's power, ``base ** x``, is ``exp(x * log(base))`` for a
positive number and ``ewpow`` (NumPy's power) otherwise.

``mean``, ``sum``, ``max`` and ``min`` are ``reduce_mean``, ``reduce_sum``, ... over
``axis`` (then ``reshape`` to drop the axes, as NumPy does, unless ``keepdims``) and
``.T`` is ``transpose`` with the axes reversed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from fnnc import ops
from fnnc.errors import DTypeError, ShapeError
from fnnc.ops._rules import integer_cast, require_storable, whole_number

if TYPE_CHECKING:
    from .variable import Variable

_ONE_OF = "a Variable, a NumPy or JAX array, a list of numbers, or a Python number"


def is_number(x: Any) -> bool:
    """A Python or NumPy scalar number (``bool`` included, as NumPy counts it)."""
    return isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating))


def operand(var: Variable, other: Any, op: str) -> Variable:
    """``other`` as a variable of ``var``'s graph, for ``var <op> other`` (or reversed).

    Raises:
        DTypeError: ``other`` is not a number, an array of numbers or a variable.
    """
    from .variable import Variable

    if isinstance(other, Variable):
        return other
    dg = var._dg
    if is_number(other):
        value = other.item() if isinstance(other, np.generic) else other
        require_storable(f"{op} with variable {var.label}", "", value, var.dtype)
        return dg.scalar(value, var.dtype)
    arr = _array(other)
    if arr is None:
        raise DTypeError(
            f"{op} with variable {var.label}: the other operand, {type(other).__name__} "
            f"{other!r:.60}, is not a tensor; use {_ONE_OF}"
        )
    return dg.constant(_cast(arr, var.dtype, f"{op} with variable {var.label}"))


def _array(x: Any) -> Any:
    """``x`` as an array of numbers, or ``None`` where it is none."""
    if isinstance(x, jax.Array):
        return x
    if not isinstance(x, (np.ndarray, list, tuple)):
        return None
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError):  # ragged lists
        return None
    numeric = arr.dtype.kind in "biuf" or arr.dtype.name == "bfloat16"
    return arr if numeric and arr.dtype != object else None


def _cast(arr: Any, dtype: np.dtype, at: str) -> Any:
    """``arr`` in ``dtype`` where NumPy's promotion would give ``dtype``; else unchanged.
    Integers that ``dtype`` does not hold are a :class:`DTypeError`, as a number is
    (:func:`require_storable`): cast, they would wrap (``int8 + int32([300])`` was 45)."""
    if arr.dtype == dtype:
        return arr
    given_float = jnp.issubdtype(arr.dtype, jnp.inexact)
    if jnp.issubdtype(dtype, jnp.inexact):
        return arr.astype(dtype)
    if given_float:
        return arr
    return integer_cast(arr, dtype, at)  # the first value that would wrap: an error


def scale(var: Variable, number: Any) -> Variable:
    """``var * number`` (a Python or NumPy number) as ``scalar_mul``. Beside an integer
    variable a whole ``number`` must be a value of its type, as for ``+``: ``int32 *
    2**40`` converted the factor out of range (-2**31 came out for 1 * 2**40) where
    NumPy raises; a fractional one gets ``scalar_mul``'s own error."""
    value = number.item() if isinstance(number, np.generic) else number
    if not jnp.issubdtype(var.dtype, jnp.inexact) and whole_number(value):
        require_storable(f"* with variable {var.label}", "", value, var.dtype)
    return var._dg.exec(ops.scalar_mul(a=float(value)), var)


def refuse_integer_division(x: Variable, op: str) -> None:
    """Raises :class:`DTypeError` for ``/`` (or a negative integer power, ``1 / x**n``)
    of an integer or bool variable: ``ewdiv`` of integers truncates toward zero (C's
    rule), where NumPy's ``/`` gives floats; ``x / 1`` alike, for one rule per ``/``."""
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return
    name = np.dtype(x.dtype).name
    raise DTypeError(
        f"{op} with variable {x.label} {name}{list(x.shape)}: the quotient would be "
        f"truncated to {name} (ewdiv divides integers as C does); convert the inputs to a "
        "float type first (datatype_conversion)"
    )


def reciprocal(c: Any, dtype: np.dtype) -> float | None:
    """``1 / c`` where ``x * (1 / c)`` (``scalar_mul``) gives what ``x / c`` does, else
    ``None`` (then ``/`` records ``ewdiv`` by the constant ``c``, as NumPy divides).

    That is a power of two (its reciprocal is exact), or any finite, nonzero ``c`` with a
    finite reciprocal for a 16-bit ``x``: ``scalar_mul`` computes that in float32 and
    rounds once, so ``c`` is not rounded to 16 bits first (as ``x * 0.99``). A float32
    ``x * (1 / 3)`` would be off by an ulp where ``x / 3`` is not, and ``x / 0`` has no
    reciprocal at all (``inf``, as NumPy, not Python's ``ZeroDivisionError``).
    """
    c = float(c)
    if c == 0.0 or not math.isfinite(c) or not math.isfinite(1.0 / c):
        return None
    mantissa, exponent = math.frexp(c)
    if abs(mantissa) == 0.5 and -120 <= exponent <= 120:
        return 1.0 / c
    return (
        1.0 / c if np.dtype(dtype).itemsize == 2 and jnp.issubdtype(dtype, jnp.floating) else None
    )


def power(x: Variable, p: Any) -> Variable:
    """``x ** p`` with existing commands (see the module doc)."""
    dg = x._dg
    if not is_number(p):
        exponent = operand(x, p, "**")
        return dg.exec(ops.ewexp(), dg.exec(ops.ewprod(), exponent, dg.exec(ops.ewlog(), x)))
    p = float(p)
    if p == 0.5:
        return dg.exec(ops.ewsqrt(), x)
    if p == -0.5:
        return dg.exec(ops.ewrsqrt(), x)
    if p != int(p) or not math.isfinite(p):
        return dg.exec(ops.ewexp(), dg.exec(ops.scalar_mul(a=p), dg.exec(ops.ewlog(), x)))
    n = int(p)
    if n < 0:  # before any node is recorded
        refuse_integer_division(x, f"** {n}")
    if n == 0:
        # d(x**0)/dx is 0 everywhere; 0 * x + 1 would be NaN where x is infinite
        return dg.constant(np.ones(x.shape, x.dtype))
    factors, square, k = [], x, abs(n)
    while k:
        if k & 1:
            factors.append(square)
        k >>= 1
        if k:
            square = dg.exec(ops.ewprod(), square, square)
    positive = factors[0] if len(factors) == 1 else dg.exec(ops.ewprod(), *factors)
    if n > 0:
        return positive
    return dg.exec(ops.ewdiv(), dg.scalar(1, x.dtype), positive)


def rpower(x: Variable, base: Any) -> Variable:
    """``base ** x``: ``exp(x * log(base))`` for a positive number ``base``; else
    ``ewpow`` (C's ``pow``, as NumPy: ``0 ** 0`` is 1, ``(-2) ** 3`` is -8, a negative
    base to a fractional power NaN), where ``exp(x * log(base))`` gave NaN for every
    base <= 0."""
    dg = x._dg
    if is_number(base) and base > 0:
        return dg.exec(ops.ewexp(), dg.exec(ops.scalar_mul(a=math.log(base)), x))
    return dg.exec(ops.ewpow(), operand(x, base, "**"), x)


REDUCTIONS: dict[str, Any] = {
    "mean": ops.reduce_mean,
    "sum": ops.reduce_sum,
    "max": ops.reduce_max,
    "min": ops.reduce_min,
}
"""The reductions variables have as methods, by name: each records its command."""


def reduce(x: Variable, kind: str, axis: int | Sequence[int] | None, keepdims: bool) -> Variable:
    """``x.<kind>(axis, keepdims)`` (``kind`` in :data:`REDUCTIONS`) as NumPy computes
    it: the ``reduce_<kind>`` command, then a ``reshape`` dropping the reduced axes
    unless ``keepdims`` (the command keeps them as size 1, as NNC's does)."""
    if not isinstance(keepdims, (bool, np.bool_)):
        raise ShapeError(
            f"variable {x.label}: {kind}(keepdims={keepdims!r:.40}); expected True or False"
        )
    axes = _axes(x, axis, kind)
    out = x._dg.exec(REDUCTIONS[kind](axes=axes), x)
    if keepdims:
        return out
    shape = tuple(n for i, n in enumerate(x.shape) if i not in axes)
    return x._dg.exec(ops.reshape(shape=shape), out)


def _axes(x: Variable, axis: int | Sequence[int] | None, kind: str) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    try:
        given = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    except TypeError:  # axis=1.0: checked below, as one axis (was a bare TypeError)
        given = (axis,)
    axes = []
    for a in given:
        if not isinstance(a, (int, np.integer)) or not -x.ndim <= a < x.ndim:
            raise ShapeError(
                f"variable {x.label}: {kind} over axis {a!r} of a {x.ndim}-d variable "
                f"{list(x.shape)}; give axes in [{-x.ndim}, {x.ndim})"
            )
        axes.append(int(a) % x.ndim)
    if len(set(axes)) != len(axes):
        raise ShapeError(f"variable {x.label}: {kind} over repeated axes {list(given)}")
    return tuple(sorted(axes))


_GEMM = ops.gemm()


def matmul(a: Variable, b: Variable) -> Variable:
    """``a @ b`` with NumPy's shapes: ``gemm``, whose rank-1 ``b`` is a row ``[1, n]``
    (NNC's reading), so a rank-1 ``b`` is taken as the column ``[n, 1]`` and that axis
    dropped from the result (``M @ v`` is ``[m]``, ``v @ v`` a scalar), as
    ``np.matmul`` does; a rank-1 ``a`` is a row whose axis gemm drops against a matrix
    but keeps against a batch of them (``[2, 1, n]``), so that axis is dropped here
    (``v @ B`` is ``[2, n]``)."""
    if a._slot is None or b._slot is None:  # a freed one: exec's error names it and gemm
        return a._dg.exec(_GEMM, a, b)
    if b.ndim != 1:
        out = a._dg.exec(_GEMM, a, b)
        if a.ndim != 1 or b.ndim <= 2:
            return out
        return out._dg.exec(ops.reshape(shape=(*out.shape[:-2], out.shape[-1])), out)
    column = b._dg.exec(ops.reshape(shape=(b.shape[0], 1)), b)
    out = a._dg.exec(_GEMM, a, column)
    return out._dg.exec(ops.reshape(shape=out.shape[:-1]), out)


def transposed(x: Variable) -> Variable:
    """``x.T``: the axes reversed (``x`` itself below two axes, as in NumPy)."""
    if x.ndim < 2:
        return x
    return x._dg.exec(ops.transpose(perm=tuple(reversed(range(x.ndim)))), x)


UFUNC_OPERATORS: dict[Any, str] = {
    np.add: "add",
    np.subtract: "sub",
    np.multiply: "mul",
    np.true_divide: "truediv",
    np.matmul: "matmul",
    np.power: "pow",
}
"""NumPy ufuncs a variable answers with its own operator (``np_arr + var`` calls them)."""


def array_ufunc(ufunc: Any, method: str, inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """NumPy's ``__array_ufunc__`` for variables.

    ``ndarray + variable`` reaches here as ``np.add(ndarray, variable)``: the six
    operators of :data:`UFUNC_OPERATORS` are recorded as the variable's operator
    (``variable.__radd__(ndarray)``), so the result is a variable, not an object array.
    Any other ufunc (``np.exp(variable)``) computes in NumPy on the values, as
    ``np.asarray(variable)`` would.
    """
    from .variable import Variable

    name = UFUNC_OPERATORS.get(ufunc)
    if name is not None and method == "__call__" and not kwargs and len(inputs) == 2:
        a, b = inputs
        if isinstance(a, Variable):
            return getattr(a, f"__{name}__")(b)
        return getattr(b, f"__r{name}__")(a)
    if any(isinstance(o, Variable) for o in kwargs.get("out", ())):
        raise DTypeError(
            f"np.{ufunc.__name__}(..., out=variable): NumPy cannot write into a variable; "
            "compute it with commands (DynamicGraph.exec) or write with DynamicGraph.set"
        )
    values = tuple(np.asarray(x) if isinstance(x, Variable) else x for x in inputs)
    return getattr(ufunc, method)(*values, **kwargs)
