"""How :func:`~fnnc.graph.trace` takes its arguments: input names from pytree paths,
modules split into state and call, PRNG keys as key data, and the hint for arguments
that must stay Python values."""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend as jex
import numpy as np

from fnnc.core.keys import is_key
from fnnc.errors import TraceError


def _input_names(fn: Callable[..., Any], args: Sequence[Any]) -> list[str]:
    """One name per leaf of ``args``; raises :class:`TraceError` for non-array leaves,
    and for a count of example arguments ``fn``'s signature cannot take."""
    _check_count(fn, args)
    bases = _arg_names(fn, len(args))
    names: list[str] = []
    for base, arg in zip(bases, args):
        for path, leaf in jax.tree_util.tree_flatten_with_path(arg)[0]:
            name = _path_name(base, path)
            if not (isinstance(leaf, jax.ShapeDtypeStruct) or jex.core.valid_jaxtype(leaf)):
                raise TraceError(
                    f"trace: argument {name} is a {type(leaf).__name__} ({_short(leaf)}), which "
                    f"cannot be a graph input: inputs are arrays. Bind it before tracing, e.g. "
                    f"trace(functools.partial(fn, {base}=...), ...), or close over it"
                )
            names.append(name if name not in names else f"{name}#{len(names)}")
    return names


def _check_count(fn: Callable[..., Any], args: Sequence[Any]) -> None:
    """Raises :class:`TraceError` when ``fn`` cannot be called on ``len(args)``
    positional arguments (its own TypeError named no example arguments). The signature
    is ``fn``'s own, not the one ``functools.wraps`` copies from a function it wraps: a
    decorator binding an argument takes fewer than the function under it."""
    try:
        signature = inspect.signature(fn, follow_wrapped=False)
    except (TypeError, ValueError):
        return  # no signature to check (a builtin): the call itself will say
    try:
        signature.bind(*args)
    except TypeError as e:
        raise TraceError(
            f"trace: {getattr(fn, '__name__', type(fn).__name__)}{signature} cannot take "
            f"the {len(args)} example argument(s) given ({e}); give one example array "
            "(or pytree) per positional parameter, and bind the others before tracing, "
            "e.g. trace(functools.partial(fn, name=...), ...)"
        ) from None


def _arg_names(fn: Callable[..., Any], n: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    star = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
    names = []
    for i in range(n):
        if i < len(positional):
            names.append(positional[i])
        else:
            names.append(f"{star}[{i - len(positional)}]" if star else f"arg{i}")
    return names


def _path_name(base: str, path: Sequence[Any]) -> str:
    parts = [base]
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            k = key.key
            parts.append(f".{k}" if isinstance(k, str) and k.isidentifier() else f"[{k!r}]")
        elif isinstance(key, jax.tree_util.GetAttrKey):
            parts.append(f".{key.name}")
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(f"[{key.idx}]")
        elif isinstance(key, jax.tree_util.FlattenedIndexKey):
            parts.append(f"[{key.key}]")
        else:
            parts.append(str(key))
    name = "".join(parts).lstrip(".")
    return name.removesuffix(".value") if "." in name else name


def _needs_static(error: Exception) -> bool:
    """Whether JAX failed because a traced argument was used as a Python value."""
    concrete = (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError)
    text = str(error)  # a shape made of tracers, a tracer as jit's static argument
    return isinstance(error, concrete) or (
        "Tracer" in text and ("concrete" in text or "hashable" in text)
    )


def _static_hint(error: Exception, names: Sequence[str], args: Sequence[Any]) -> str:
    numbers = [
        name
        for name, leaf in zip(names, jax.tree.leaves(list(args)))
        if isinstance(leaf, (bool, int, float, complex, np.generic))
    ]
    which = f" (given as Python numbers here: {', '.join(numbers)})" if numbers else ""
    bind = re.split(r"[.\[]", numbers[0])[0] if numbers else "n"
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if isinstance(error, jax.errors.TracerArrayConversionError):
        # NumPy called on a traced value: the fix is jax.numpy, not a static argument
        return (
            "trace: the function converts a traced array to a NumPy array (a NumPy "
            "function such as np.sin, or np.asarray, on it), but trace makes every argument "
            f"leaf a graph input, a traced array{which}. Inside the function use jax.numpy "
            "(jnp.sin, jnp.asarray) on array values; bind arguments NumPy must see as "
            f"Python values before tracing, e.g. trace(functools.partial(fn, {bind}=...), "
            f"...).\n  JAX said: {type(error).__name__}: {first}"
        )
    return (
        "trace: the function needs an argument as a concrete Python value (a shape, a jit "
        "static argument, a Python if), but trace makes every argument leaf a graph input, "
        f"a traced array{which}. Bind such arguments before tracing, e.g. "
        f"trace(functools.partial(fn, {bind}=...), ...), or use lax.cond / jnp.where for "
        f"control flow on array values.\n  JAX said: {type(error).__name__}: {first}"
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _split_module(fn: Callable[..., Any]) -> tuple[Callable[..., Any], Any]:
    """For an NNX module: a pure call taking its state first, and the state."""
    nnx = sys.modules.get("flax.nnx")
    if nnx is None or not nnx.graph.is_graph_node(fn):
        return fn, None
    graphdef, state = nnx.split(fn)

    def call(state: Any, *args: Any) -> Any:
        return nnx.merge(graphdef, state)(*args)

    return call, state


def _key_data_arguments(
    call: Callable[..., Any], args: Sequence[Any], skip_first: bool
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """``call`` taking key data where ``args`` hold PRNG keys, and those arguments.

    A key (an ``nnx.Rngs`` stream's ``RngKey``, a ``jax.random.key``) cannot be a graph
    tensor, but its key data can: the graph input holds the data (uint32, e.g. ``[2]``
    for threefry) and the traced function re-wraps it, so each call of the graph draws
    from the key it is given (``interpret``/``compile`` take the key itself too).
    ``skip_first``: ``call`` takes a module's state first (not an argument).
    """
    leaves, tree = jax.tree.flatten(tuple(args))
    impls = {i: _key_impl(v) for i, v in enumerate(leaves) if is_key(v)}
    if not impls:
        return call, tuple(args)
    data = [
        jax.eval_shape(jax.random.key_data, v) if i in impls else v for i, v in enumerate(leaves)
    ]

    def keyed(*given: Any) -> Any:
        head, rest = (given[:1], given[1:]) if skip_first else ((), given)
        flat = jax.tree.leaves(tuple(rest))
        wrapped = [
            jax.random.wrap_key_data(v, impl=impls[i]) if i in impls else v
            for i, v in enumerate(flat)
        ]
        return call(*head, *jax.tree.unflatten(tree, wrapped))

    return keyed, tuple(jax.tree.unflatten(tree, data))


def _key_impl(key: Any) -> Any:
    """The PRNG implementation of a key array or of a ``ShapeDtypeStruct`` of keys."""
    impl: list[Any] = []
    jax.eval_shape(lambda k: impl.append(jax.random.key_impl(k)), key)  # abstract too
    return impl[0]
