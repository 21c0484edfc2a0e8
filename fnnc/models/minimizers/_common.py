"""What every NNC minimizer shares: hyper-parameter checks, dtypes, the rate, the step.

NNC's update kernels read each tensor in its own dtype, compute in ``float``, and write
the new parameter and the new saved auxiliaries (momentum, velocity) back in the
parameter's dtype (``NUM2`` in ``gpu/ccv_nnc_*_gpu_ref.cu``). The helpers here give the
same behaviour to every rule: :func:`compute_dtype` is float32 for half, bfloat16 and
float32 parameters, and :func:`to_update` turns NNC's ``b = a - delta`` into the Optax
update ``u`` with ``optax.apply_updates(a, u) == b`` rounded once to ``a``'s dtype (the
update is float32 for 16-bit parameters).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fnnc.core.dtypes import at_least_float32
from fnnc.errors import CommandError

Rate = float | Callable[[jax.Array], Any]
"""A fixed learning rate, or an Optax schedule called with the number of steps taken."""


def check_rate(minimizer: str, rate: Rate) -> Rate:
    """``rate`` as given if it is a schedule, else as a finite float32 number >= 0
    (a traced one as a float32 scalar, unchecked: see :func:`traced`); raises
    otherwise."""
    if callable(rate):
        return rate
    if traced(rate):
        return as_traced(minimizer, "rate", rate)
    value = as_float(minimizer, "rate", rate)
    if not value >= 0.0:
        raise CommandError(
            f"{minimizer}: rate must be >= 0 (it multiplies the step), got {value}; "
            f"to climb a function, minimize its negation instead"
        )
    return value


def check_range(
    minimizer: str,
    name: str,
    value: Any,
    low: float,
    high: float = math.inf,
    *,
    high_open: bool = False,
    low_open: bool = False,
) -> float:
    """``value`` as a float if it lies in the interval; raises naming ``name`` otherwise.
    A traced value (:func:`traced`) comes back as a float32 scalar, unchecked."""
    if traced(value):
        return as_traced(minimizer, name, value)
    given = value
    value = as_float(minimizer, name, value)
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    if above and below:
        return value
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    raise CommandError(f"{minimizer}: {name} must be in {interval}, got {value}{_narrow(given)}")


def _narrow(value: Any) -> str:
    """A hint for a hyper-parameter given in a 16-bit float type (which rounds 0.999
    to 1): ``optax.inject_hyperparams`` casts them to the parameters' dtype."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating) or np.dtype(dtype).itemsize > 2:
        return ""
    return (
        f" (a {np.dtype(dtype).name} value: optax.inject_hyperparams rounds hyper-parameters "
        "to the parameters' dtype unless given hyperparam_dtype=jnp.float32)"
    )


def as_float(minimizer: str, name: str, value: Any) -> float:
    """``value`` rounded to a C ``float``, as NNC's ``cmd_param_t`` holds it (so that
    ``1 - beta2`` is NNC's); raises a CommandError naming ``name`` for a non-number
    (a string or a bool too), an infinite one, or one that float32 cannot hold (it
    would become inf or 0)."""
    given = f"got {type(value).__name__} {value!r}"
    if isinstance(value, (str, bytes, bool, np.bool_)):
        raise CommandError(f"{minimizer}: {name} must be a number, {given}")
    try:
        with np.errstate(over="ignore"):
            result = float(np.float32(value))
        exact = float(value)
    except OverflowError:  # an int beyond any float
        raise CommandError(
            f"{minimizer}: {name} is beyond float32's range (NNC keeps hyper-parameters as "
            f"C floats), {given:.80}"
        ) from None
    except (TypeError, ValueError):
        raise CommandError(f"{minimizer}: {name} must be a number, {given}") from None
    if math.isnan(result):
        raise CommandError(f"{minimizer}: {name} must be a number, got nan")
    if math.isinf(exact):
        raise CommandError(f"{minimizer}: {name} must be finite, got {exact}")
    if math.isinf(result) or (result == 0.0 and exact != 0.0):
        raise CommandError(
            f"{minimizer}: {name}={exact!r} is beyond float32's range (NNC keeps "
            f"hyper-parameters as C floats: it would be {result}); pass a value of "
            f"magnitude between {float(np.finfo(np.float32).smallest_subnormal):g} and "
            f"{float(np.finfo(np.float32).max):g}"
        )
    return result


def traced(value: Any) -> bool:
    """Whether ``value`` is a JAX tracer: a hyper-parameter that
    ``optax.inject_hyperparams`` rebuilds the minimizer with inside a jitted update
    (or one a caller traces). Its number is unknown when the minimizer is made, so
    it is not range-checked, and the rules treat it as possibly nonzero."""
    return isinstance(value, jax.core.Tracer)


def as_traced(minimizer: str, name: str, value: Any) -> jax.Array:
    """A traced hyper-parameter as a float32 scalar (a C ``float``, as :func:`as_float`
    rounds a number); raises a CommandError naming ``name`` unless it is a real scalar."""
    if jnp.ndim(value) != 0 or not jnp.issubdtype(value.dtype, jnp.number):
        raise CommandError(
            f"{minimizer}: {name} must be a number, got a traced {value.dtype}"
            f"{list(jnp.shape(value))}"
        )
    if jnp.issubdtype(value.dtype, jnp.complexfloating):
        raise CommandError(f"{minimizer}: {name} must be real, got a traced {value.dtype}")
    return jnp.asarray(value, jnp.float32)


def nonzero(value: Any) -> bool:
    """Whether a checked hyper-parameter may be nonzero: a traced one may."""
    return traced(value) or value != 0.0


def shown(value: Any) -> Any:
    """A hyper-parameter for a message: its number, or that it is traced."""
    return "<traced (optax.inject_hyperparams)>" if traced(value) else value


def rate_at(rate: Rate, count: jax.Array) -> jax.Array:
    """The learning rate for the step after ``count`` steps, as a float32 scalar."""
    value = rate(count) if callable(rate) else rate
    return jnp.asarray(value, jnp.float32)


compute_dtype = at_least_float32
"""The dtype NNC computes an update in: float32, or float64 for float64 parameters."""


def compute_type(minimizer: str, grad: jax.Array, param: jax.Array | None) -> np.dtype:
    """:func:`compute_dtype` of the parameter (of the gradient without one); raises a
    CommandError unless both are real floating point, as NNC's update kernels take
    (an int32 parameter was truncated toward zero each step and so was its momentum;
    a complex one squared its gradient instead of taking ``|g|**2``)."""
    for what, x in (("parameter", param), ("gradient", grad)):
        if x is not None and not jnp.issubdtype(x.dtype, jnp.floating):
            raise CommandError(
                f"{minimizer}: a {what} of dtype {x.dtype} (shape {list(x.shape)}); NNC's "
                "minimizers update real floating-point parameters only: keep integer "
                "and complex arrays out of the tree this minimizer updates"
            )
    return compute_dtype((param if param is not None else grad).dtype)


def bias_correction(beta: float, count: jax.Array) -> jax.Array:
    """``1 - beta ** step`` in float32 with ``step = count + 1``, as NNC's ``powf``."""
    step = (count + 1).astype(jnp.float32)
    return 1.0 - jnp.asarray(beta, jnp.float32) ** step


def zeros_like(params: optax.Params) -> optax.Params:
    """A saved auxiliary per parameter: zeros of its shape and dtype, as NNC sets them."""
    return jax.tree.map(jnp.zeros_like, params)


def leaves_like(treedef: Any, tree: Any) -> list[Any]:
    """The leaves of ``tree`` in ``treedef``'s order, or ``None`` per leaf if it is None."""
    if tree is None:
        return [None] * treedef.num_leaves
    return treedef.flatten_up_to(tree)


def check_leaves(minimizer: str, grads: Any, params: Any, **saved: Any) -> None:
    """Raises a CommandError unless ``params`` (if given) and each saved auxiliary tree
    (``momentum=state.momentum``, ...; None if not kept) have the gradients' tree and each
    leaf the gradient's shape. NNC's kernels assert equal dims; jnp broadcasting would
    instead turn a [3] parameter and its momentum into [2, 3] ones on a [2, 3] gradient."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(grads)
    trees = {"parameter": params, **saved}
    for what, tree in trees.items():
        if tree is None:
            continue
        try:
            others = treedef.flatten_up_to(tree)
        except (ValueError, TypeError) as e:
            whose = "parameters" if what == "parameter" else f"state's {what}"
            raise CommandError(
                f"{minimizer}: the gradients' tree is not that of the {whose} ({e}); "
                "update(grads, state, params) needs the tree that init was given"
            ) from None
        for (path, g), x in zip(leaves, others):
            if x is not None and jnp.shape(x) != jnp.shape(g):
                where = f"gradient {jax.tree_util.keystr(path)}" if path else "the gradient"
                raise CommandError(
                    f"{minimizer}: {where} has shape {list(jnp.shape(g))} but its {what} "
                    f"has shape {list(jnp.shape(x))}; NNC's minimizers update a parameter "
                    "with a gradient of its own shape (no broadcasting)"
                )


def require_params(minimizer: str, params: Any, why: str) -> None:
    """Raises unless ``params`` were passed to ``update``."""
    if params is None:
        raise CommandError(
            f"{minimizer}: update needs the parameters ({why}); call update(grads, state, params)"
        )


def to_update(delta: jax.Array) -> jax.Array:
    """The Optax update for NNC's ``b = a - delta``: ``-delta``, in ``delta``'s dtype
    (:func:`compute_dtype`).

    For half and bfloat16 parameters that is float32, wider than the parameter:
    ``optax.apply_updates`` computes ``a + u`` in float32, which is NNC's float32
    ``a - delta`` exactly (negation is exact), and casts it to the parameter's dtype,
    so the new parameter is rounded once, as NNC's kernels round it. (An update in the
    parameter's dtype cannot do that: from bfloat16 ``a = 1``, no bfloat16 ``u`` gives
    ``a + u`` = 0.0009994, NNC's rounding of ``b = 0.001``; 0 and 0.0039 are nearest.)
    Consumers of an update must therefore not cast it to its parameter's dtype
    (:func:`fnnc.ops.optimizer.update_like`).
    """
    return -delta


def map_leaves(rule: Any, treedef: Any, *leaf_lists: Any, outputs: int) -> list[Any]:
    """Applies ``rule`` leaf by leaf over parallel leaf lists; returns one tree per output.

    ``rule(*leaves) -> tuple`` of ``outputs`` values (the update, then new state parts);
    each column of results is unflattened with ``treedef``.
    """
    results = [rule(*leaves) for leaves in zip(*leaf_lists)]
    columns = list(zip(*results)) if results else [()] * outputs
    return [treedef.unflatten(list(col)) for col in columns]
