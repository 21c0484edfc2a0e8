"""Shared pieces of shape rules and backwards: broadcasting, axes, dtype checks."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import Spec
from fnnc.errors import CommandError, DTypeError, ShapeError


def fail(msg: str) -> NoReturn:
    """Raises :class:`ShapeError`; the caller (builder, eager call) adds where."""
    raise ShapeError(msg)


def show(spec: Spec) -> str:
    try:
        name = np.dtype(spec.dtype).name
    except TypeError:  # not a NumPy type: a typed PRNG key (key<fry>)
        name = str(spec.dtype)
    return f"{name}{list(spec.shape)}"


def same_shape(x: Spec, *rest: Any, **params: Any) -> Spec:
    """Shape rule of commands whose output is shaped and typed like input 0."""
    return Spec(tuple(x.shape), x.dtype)


def jax_dtype(dtype: Any) -> np.dtype:
    """A dtype hyper-parameter as the dtype JAX will really use (x64 off: f64 -> f32)."""
    return jax.dtypes.canonicalize_dtype(jnp.dtype(dtype))


def require_float(name: str, *specs: Spec) -> None:
    for s in specs:
        if not jnp.issubdtype(s.dtype, jnp.inexact):
            raise DTypeError(
                f"{name}: expected a floating-point input, got {show(s)}; convert it to a "
                "float type first (datatype_conversion)"
            )


def require_number(name: str, *specs: Spec) -> None:
    """Raises :class:`DTypeError` for a bool input of arithmetic (XLA has no bool add)."""
    for s in specs:
        if np.dtype(s.dtype) == np.bool_:
            raise DTypeError(
                f"{name}: expected numbers, got {show(s)}; convert it to an integer or float "
                "type first (datatype_conversion), or use logical ops for masks"
            )


def whole_number(value: Any) -> bool:
    """Whether ``value`` is a finite whole number (``2``, ``2.0``; not ``2.5`` or NaN)."""
    if isinstance(value, (bool, int, np.bool_, np.integer)):
        return True
    return math.isfinite(value) and float(value).is_integer()


def require_ints(name: str, what: str, values: Any) -> Any:
    """``values`` (an int, or a sequence of them, nested) as Python ints, in the same
    nesting (sequences become tuples): a parameter without a default, which
    :func:`fnnc.core.params.param_fits` leaves to the shape rule. Whole finite floats
    (``2.0``) and NumPy ints are converted; a bool, a fractional or a non-finite value
    is a :class:`CommandError`. A float had reached JAX as a bare TypeError, or been
    truncated (``reshape(shape=(1.5, 4))``)."""

    def convert(v: Any) -> Any:
        if isinstance(v, (tuple, list)):
            return tuple(convert(u) for u in v)
        if isinstance(v, (bool, np.bool_)):
            raise ValueError
        if isinstance(v, (int, np.integer)):
            return int(v)
        if isinstance(v, (float, np.floating)) and math.isfinite(v) and float(v).is_integer():
            return int(v)
        raise ValueError

    try:
        return convert(values)
    except ValueError:
        kind = "ints" if isinstance(values, (tuple, list)) else "an int"
        raise CommandError(
            f"{name}: {what} must be {kind}, got {values!r}; give whole numbers as Python "
            "ints (int(n)); bools, fractions and non-finite values are refused"
        ) from None


def int_range(dtype: Any) -> tuple[int, int] | None:
    """The values an integer or bool ``dtype`` holds, ``(least, most)``; ``None`` for
    other dtypes."""
    if jnp.issubdtype(dtype, jnp.bool_):
        return 0, 1
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        return int(info.min), int(info.max)
    return None


def require_storable(name: str, what: str, value: Any, dtype: Any) -> None:
    """Raises :class:`DTypeError` unless the scalar ``value`` (a fill value, an operand) is
    exactly a value of an integer or bool ``dtype``: whole, finite and in range. Stored
    as it is it would be truncated (2.7 -> 2), turn NaN into the smallest integer, or
    wrap (300 -> 44 in int8). Other dtypes take any value."""
    held = int_range(dtype)
    if held is None:
        return
    (lo, hi), dtype = held, np.dtype(dtype)
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        problem = f"is not finite; an {dtype.name} tensor holds no NaN or infinity"
    elif not whole_number(value):
        problem = f"would be truncated in an {dtype.name} tensor"
    elif not lo <= value <= hi:
        problem = f"is outside {dtype.name}'s range [{lo}, {hi}]"
    else:
        return
    given = f"{what}={value!r}" if what else repr(value)
    raise DTypeError(
        f"{name}: {given} {problem}; give a whole number in [{lo}, {hi}], or work in a "
        "float type (datatype_conversion)"
    )


def integer_cast(arr: Any, dtype: Any, name: str) -> Any:
    """``arr`` (NumPy or JAX) as ``dtype``; where both are integer or bool kinds, the
    first value ``dtype`` does not hold is :func:`require_storable`'s DTypeError naming
    ``name`` instead of wrapping (``int8`` of ``int32([300])`` was 44)."""
    out = arr.astype(dtype)
    if np.dtype(arr.dtype).kind in "biu" and np.dtype(dtype).kind in "biu":
        given, kept = np.asarray(arr), np.asarray(out)
        if not np.array_equal(given, kept):
            require_storable(name, "", int(given[given != kept].flat[0]), dtype)
    return out


def require_same_dtype(name: str, *specs: Spec) -> np.dtype:
    dtypes = {np.dtype(s.dtype) for s in specs}
    if len(dtypes) > 1:
        raise DTypeError(
            f"{name}: inputs must share one dtype, got {', '.join(show(s) for s in specs)}; "
            "insert fnnc.ops.datatype_conversion to convert"
        )
    return np.dtype(specs[0].dtype)


def require_choice(name: str, what: str, value: Any, allowed: tuple[str, ...]) -> None:
    """Raises :class:`CommandError` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise CommandError(f"{name}: {what} must be one of {list(allowed)}, got {value!r}")


def broadcast_shape(name: str, *shapes: Sequence[int]) -> tuple[int, ...]:
    """NumPy broadcasting, with a message naming the command and the shapes."""
    try:
        return tuple(np.broadcast_shapes(*(tuple(s) for s in shapes)))
    except ValueError:
        fail(f"{name}: shapes {', '.join(str(list(s)) for s in shapes)} do not broadcast")


def require_norm_scale(name: str, x: Spec, scale: Spec | None, axes: tuple[int, ...]) -> None:
    """Raises unless the optional ``scale`` of a normalisation over ``axes`` is a float
    tensor that broadcasts to ``x`` without enlarging it (NumPy rules, as the forward
    applies it): a bad one had reached the forward as a bare ``broadcast_in_dim``
    TypeError."""
    if scale is None:
        return
    require_float(name, scale)
    try:
        fits = np.broadcast_shapes(tuple(scale.shape), tuple(x.shape)) == tuple(x.shape)
    except ValueError:
        fits = False
    if not fits:
        kept = [n if d in axes else 1 for d, n in enumerate(x.shape)]
        fail(
            f"{name}: scale {show(scale)} must broadcast to x {show(x)} without enlarging it "
            f"(NumPy rules); one scale per entry of axes {list(axes)} is shaped {kept}"
        )


def broadcast(name: str, numbers: bool = False) -> Any:
    """Shape rule for n-ary elementwise commands (one dtype, NumPy broadcasting);
    ``numbers``: arithmetic, which bool inputs are refused (:func:`require_number`)."""

    def rule(*specs: Spec, **params: Any) -> Spec:
        dtype = require_same_dtype(name, *specs)
        if numbers:
            require_number(name, specs[0])
        return Spec(broadcast_shape(name, *(s.shape for s in specs)), dtype)

    return rule


def to_shape(x: Any, shape: Sequence[int]) -> Any:
    """Explicit NumPy-style broadcast of ``x`` to ``shape`` (rank promotion stays off).

    One ``broadcast_in_dim`` (after squeezing the size-1 axes that grow), so traced
    graphs lower to as few primitives as plain JAX code would.
    """
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    lead = len(shape) - x.ndim
    grow = [d for d, n in enumerate(x.shape) if n == 1 and shape[lead + d] != 1]
    if grow:
        x = lax.squeeze(x, grow)
    dims = tuple(lead + d for d in range(len(shape) - lead) if d not in grow)
    return lax.broadcast_in_dim(x, shape, dims)


def summing_dtype(dtype: Any) -> Any:
    """Where many values that share a destination are summed (bias gradients and batch
    statistics in :func:`leading_sum`, the backward of a gather: embedding,
    index_select): float32 for 16-bit floats, rounded once after. A bfloat16 sum of
    4096 gradients of 0.1 stops at 32, where adding 0.1 no longer changes it; float32
    gives 410."""
    return jnp.float32 if jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) else dtype


def leading_sum(t: Any, axes: Sequence[int], dtype: Any = None) -> Any:
    """``jnp.sum(t, axis=axes, dtype=dtype)``; when ``axes`` are all but the last axis
    (NHWC batch statistics, bias gradients), summed in two stages: over the rows of
    ``[N*H, W*C]`` first, then over ``W``, so each stage reads contiguous rows.
    XLA:CPU's own reduction of the leading axes into ``[C]`` ran 2-4x slower (batch 64:
    32x32x16 0.70 vs 0.22 ms, 28x28x32 1.05 vs 0.29 where YNNPACK does not take
    reductions, :mod:`fnnc.graph.cpu_libraries`; 0.40 vs 0.22 at 28x28x32 where it
    does). Another summation order than ``jnp.sum``'s, so every command that sums over
    these axes uses this one (batch_norm, reduce_sum, reduce_mean, the backwards of
    broadcasting): a graph of fine-grained commands then agrees with the fused one to
    the last bits, as NNC's tests of batch norm built both ways require."""
    axes = tuple(axes)
    if t.ndim < 3 or axes != tuple(range(t.ndim - 1)):
        return jnp.sum(t, axis=axes, dtype=dtype)
    # A low-precision float is summed in float32 through both stages and rounded once:
    # a bfloat16 partial between them cost XLA:CPU 70x (4.6 ms against 0.065 ms for
    # [4, 256, 1024], a bias gradient of a bfloat16 LM step) and a second rounding.
    wide = summing_dtype(t.dtype)
    low = dtype is None and wide != t.dtype
    acc = wide if low else dtype
    rows = jnp.reshape(t, (math.prod(t.shape[:-2]), t.shape[-2] * t.shape[-1]))
    partial = jnp.sum(rows, axis=0, dtype=acc)
    total = jnp.sum(jnp.reshape(partial, t.shape[-2:]), axis=0, dtype=acc)
    return total.astype(t.dtype) if low else total


def unbroadcast(g: Any, shape: Sequence[int]) -> Any:
    """Sums ``g`` down to ``shape``: the backward of broadcasting."""
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1
    )
    return jnp.reshape(leading_sum(g, axes), shape)


def norm_axes(name: str, axes: Iterable[int], rank: int) -> tuple[int, ...]:
    """Axes made non-negative and checked against ``rank``."""
    out = []
    for a in axes:
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)):
            # 1.0 passed the range check and reached jnp ("'float' object cannot be
            # interpreted as an integer" from the forward); a TypeError here is the
            # rule's, which the caller raises as a RuleError naming command and inputs
            raise TypeError(f"axis {a!r} is not an int; give axes as ints, e.g. (-1,)")
        if not -rank <= a < rank:
            fail(f"{name}: axis {a} is out of range for a rank-{rank} input")
        out.append(a % rank)
    return tuple(sorted(set(out)))
