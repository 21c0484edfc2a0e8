"""Checking what callers feed a graph, and shaping what it returns."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.core.dtypes import is_inexact
from fnnc.core.ir import Graph
from fnnc.core.keys import key_bits
from fnnc.core.text import first_few
from fnnc.errors import DTypeError, GraphInputError, ShapeError


def flatten_inputs(graph: Graph, args: Sequence[Any], where: str) -> list[Any]:
    """The leaves of ``args``, checked against ``graph.inputs`` (count, shape, dtype).

    With one argument per graph input, each may be a nested list of numbers (one array,
    beside arrays in the other positions); otherwise the arguments are pytrees whose
    leaves are the graph inputs in order, and their key paths must be the traced ones
    (``graph.in_paths``) where the graph has them. Python numbers and lists of them take
    their input's dtype (floats into an integer input are refused).
    """
    if len(args) == len(graph.inputs) and all(map(_one_array, args)):
        leaves = [key_bits(v) for v in args]  # positional: lists stay one array each
        treedef = None
    else:  # a PRNG key feeds the input holding its key data (how trace takes keys)
        flat, treedef = jax.tree.flatten(tuple(args))
        leaves = [key_bits(v) for v in flat]
    if len(leaves) != len(graph.inputs):
        names = ", ".join(graph.label(i) for i in graph.inputs)
        given = ", ".join(describe(a) for a in args) or "nothing"
        raise GraphInputError(
            f"{where}: the graph takes {len(graph.inputs)} array(s) ({names}), "
            f"got {len(leaves)} from {len(args)} argument(s) ({given}); pass one array "
            "per graph input, in order"
        )
    if treedef is not None:
        _check_paths(graph, treedef, where)
    out = []
    for sid, leaf in zip(graph.inputs, leaves):
        sym = graph.symbol(sid)
        want = f"{np.dtype(sym.dtype).name}{list(sym.shape)}"
        if _deleted(leaf):
            raise GraphInputError(f"{where}: input {graph.label(sid)} {DELETED}")
        arr = leaf if isinstance(leaf, jax.Array) else _numeric(leaf)
        if arr is None:
            raise DTypeError(
                f"{where}: input {graph.label(sid)} expects {want}, got {describe(leaf)}; "
                "pass a NumPy or JAX array (or a nested list of numbers)"
            )
        got = f"{np.dtype(arr.dtype).name}{list(arr.shape)}"
        if tuple(arr.shape) != sym.shape:
            raise ShapeError(f"{where}: input {graph.label(sid)} expects {want}, got {got}")
        if _python_numbers(leaf):
            arr = _as_input_dtype(arr, np.dtype(sym.dtype), f"{where}: input {graph.label(sid)}")
        if jax.dtypes.canonicalize_dtype(arr.dtype) != np.dtype(sym.dtype):
            raise DTypeError(
                f"{where}: input {graph.label(sid)} expects {want}, got {got}; "
                f"convert with .astype({np.dtype(sym.dtype).name})"
            )
        out.append(arr if isinstance(arr, jax.Array) else jnp.asarray(arr))
    return out


@functools.lru_cache(maxsize=256)
def leaf_paths(treedef: Any) -> tuple[str, ...]:
    """The key path (``jax.tree_util.keystr``) of each leaf of ``treedef``, in order.

    Paths depend only on the structure, so they are cached by treedef: a repeated call
    with arguments of one structure costs one lookup. ``trace`` writes
    ``graph.in_paths`` with this, and :func:`flatten_inputs` checks against it.
    """
    skeleton = jax.tree.unflatten(treedef, range(treedef.num_leaves))
    flat = jax.tree_util.tree_flatten_with_path(skeleton)[0]
    return tuple(jax.tree_util.keystr(path) for path, _ in flat)


def _check_paths(graph: Graph, treedef: Any, where: str) -> None:
    """Raises :class:`GraphInputError` where the key paths of the arguments (of structure
    ``treedef``) are not ``graph.in_paths``: leaves are fed in order, so a renamed dict
    key would feed one input another's array."""
    want = graph.in_paths
    if want is None or len(want) != len(graph.inputs):  # not traced, or inputs changed
        return
    got = leaf_paths(treedef)
    if got == want:
        return
    k = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
    raise GraphInputError(
        f"{where}: the arguments are not structured as the traced ones: leaf {k} is at "
        f"{got[k]}, but the graph's input {graph.label(graph.inputs[k])} is at {want[k]} "
        f"(traced leaves: {_listing(want)}; given: {_listing(got)}); pass the arguments "
        "with the traced structure (the same dict keys, fields and nesting)"
    )


def _listing(paths: Sequence[str]) -> str:
    return first_few(list(paths), 8)


def describe(value: Any) -> str:
    """How messages show a value given where an array was expected."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{np.dtype(value.dtype).name}{list(value.shape)}"
    if isinstance(value, (str, bytes)):
        text = repr(value)
        return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"
    if isinstance(value, (list, tuple)):
        arr = _numeric(value) if _nested_numbers(value) else None
        if arr is not None:
            return f"a {type(value).__name__} of numbers, shape {list(arr.shape)}"
        return f"a {type(value).__name__} of {len(value)} item(s)"
    if isinstance(value, (bool, int, float, complex, np.generic)):
        return f"{type(value).__name__} {value!r}"
    return f"a {type(value).__name__}"


def _numeric(value: Any) -> np.ndarray | None:
    """``value`` as a NumPy array of numbers, or ``None`` (strings, objects, ragged lists)."""
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        return None
    return arr if arr.dtype.kind in "biufc" or arr.dtype.name == "bfloat16" else None


def _one_array(value: Any) -> bool:
    """An argument that is one array: a leaf (an array, a number, a key) or a nested
    list of numbers."""
    # a leaf itself: a pytree holding one array (a flax State of one parameter) is a
    # pytree, flattened with the others
    return _python_numbers(value) or jax.tree_util.treedef_is_leaf(jax.tree.structure(value))


def _python_numbers(value: Any) -> bool:
    """A Python number or a (nested) list or tuple of them: values without a dtype of
    their own, which take their input's."""
    if isinstance(value, (bool, int, float, complex)):
        return True
    if not isinstance(value, (list, tuple)):
        return False
    leaves = jax.tree.leaves(value)
    return all(isinstance(v, (bool, int, float, complex)) for v in leaves) and (
        _numeric(value) is not None
    )


def _as_input_dtype(arr: np.ndarray, dtype: np.dtype, where: str) -> np.ndarray:
    """Python numbers ``arr`` as the input's ``dtype``: reals into a floating input (as
    ``np.asarray(x, dtype)`` rounds them), integers (and bools) into an integer one."""
    kind, want = arr.dtype.kind, f"{dtype.name}{list(arr.shape)}"
    if (kind == "c" and dtype.kind != "c") or (kind == "f" and not is_inexact(dtype)):
        what = "complex numbers" if kind == "c" else "floats"
        raise DTypeError(
            f"{where} expects {want}, got Python {what}; pass "
            f"{'booleans' if dtype.kind == 'b' else 'integers'} or a NumPy array of {dtype.name}"
        )
    out = arr.astype(dtype)
    if kind in "iu" and not is_inexact(dtype) and not np.array_equal(out, arr):
        raise DTypeError(f"{where} expects {want}; a Python integer given does not fit in it")
    return out


def _nested_numbers(value: Any) -> bool:
    """A (nested) list or tuple of numbers, one array's worth."""
    return isinstance(value, (list, tuple)) and _numeric(value) is not None


def unflatten_outputs(graph: Graph, values: Sequence[Any]) -> Any:
    """Outputs shaped by ``graph.out_tree``, else bare (one) or a tuple (several)."""
    if graph.out_tree is not None:
        return jax.tree.unflatten(graph.out_tree, list(values))
    return values[0] if len(values) == 1 else tuple(values)


DELETED = (
    "is an array that was deleted: a call of a program compiled with donate=... took its "
    "buffer for its outputs (or .delete() freed it); pass the output that replaced it or a "
    "fresh array, or compile that program without donating it"
)
"""What an input that is a deleted array is told (after its position and name)."""


def _deleted(leaf: Any) -> bool:
    """Whether ``leaf`` is a concrete JAX array whose buffer was deleted or donated."""
    return (
        isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer) and leaf.is_deleted()
    )


def donation_problem(graph: Graph, leaves: Sequence[Any], donate: Sequence[int]) -> str | None:
    """Why XLA refused ``leaves`` if a donation is the cause: an input array whose
    buffer an earlier call took (a program that donates it), or one array passed for a
    donated input and another input of the same call. ``None`` otherwise."""
    for i, leaf in enumerate(leaves):
        if _deleted(leaf):
            return f"input {graph.label(graph.inputs[i])} {DELETED}"
    for i in donate:
        same = [j for j, leaf in enumerate(leaves) if j != i and leaf is leaves[i]]
        if same:
            other = graph.label(graph.inputs[same[0]])
            return (
                f"input {graph.label(graph.inputs[i])} is donated, and the same array is "
                f"passed for input {other}; pass a copy for one of them "
                "(jnp.array(x, copy=True)) or compile without donating it"
            )
    return None
