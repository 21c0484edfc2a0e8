"""The structure of a pytree without its data: how a sharded checkpoint keeps tuples,
NamedTuples (Optax states) and int keys that Orbax alone would give back as lists and
str-keyed dicts.

Containers are written in :mod:`fnnc.io.tree`'s tagged JSON (``{"$tuple": ...}``,
``{"$dict": [[key, value], ...]}``, ``{"$namedtuple": ...}``, lists, ``None``); each
leaf is ``{"$spec": [shape, dtype]}`` (an array: its shape and dtype, never its data)
or ``{"$number": [type, repr]}`` (a Python number). :func:`template` turns that back
into the tree with ``jax.ShapeDtypeStruct`` leaves, the ``like=`` that restores it.

>>> import jax.numpy as jnp
>>> data = skeleton({"w": jnp.ones(2), "pair": (0.5, 7)})
>>> template(data, "here")
{'w': ShapeDtypeStruct(shape=(2,), dtype=float32), 'pair': (0.5, 7)}
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from fnnc.errors import CheckpointError
from fnnc.io import tree

_NUMBERS = {"bool": lambda text: text == "True", "int": int, "float": float}


def skeleton(value: Any) -> Any:
    """``value``'s containers and leaf specs as JSON-able data; ``None`` where it holds
    a container this codec does not know (a custom pytree node): then the caller keeps
    no structure."""
    try:
        return _enc(value, 0)
    except _Unknown:
        return None


class _Unknown(Exception):
    pass


def _enc(x: Any, depth: int) -> Any:
    if depth > tree.MAX_DEPTH:
        raise _Unknown
    if x is None:
        return None
    if isinstance(x, (bool, int, float)):
        kind = bool if isinstance(x, bool) else int if isinstance(x, int) else float
        return {"$number": [kind.__name__, repr(kind(x))]}
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return {"$spec": [list(x.shape), np.dtype(x.dtype).name]}
    if type(x) is dict and all(type(k) in (str, int) for k in x):
        return {"$dict": [[k, _enc(v, depth + 1)] for k, v in x.items()]}
    if type(x) is list:
        return [_enc(v, depth + 1) for v in x]
    if type(x) is tuple:
        return {"$tuple": [_enc(v, depth + 1) for v in x]}
    if isinstance(x, tuple) and hasattr(type(x), "_fields"):
        cls = type(x)
        return {
            "$namedtuple": f"{cls.__module__}:{cls.__qualname__}",
            "fields": list(cls._fields),
            "values": [_enc(v, depth + 1) for v in x],
        }
    raise _Unknown


def template(data: Any, where: str) -> Any:
    """The tree :func:`skeleton` described, with ``jax.ShapeDtypeStruct`` leaves (a
    NamedTuple whose class is not imported comes back as a plain tuple)."""

    def bad(why: str, x: Any) -> CheckpointError:
        return CheckpointError(f"{where}: malformed structure entry {str(x)[:80]}: {why}")

    def dec(x: Any, depth: int) -> Any:
        if depth > tree.MAX_DEPTH:
            raise CheckpointError(f"{where}: containers nested deeper than {tree.MAX_DEPTH}")
        if x is None:
            return None
        if isinstance(x, list):
            return [dec(v, depth + 1) for v in x]
        if not isinstance(x, dict) or len(x) not in (1, 3):
            raise bad("not an entry", x)
        if "$spec" in x:
            shape, dtype = _pair(x["$spec"], bad)
            if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
                raise bad("a shape is a list of non-negative ints", x)
            return jax.ShapeDtypeStruct(tuple(shape), tree.dtype_named(dtype, bad))
        if "$number" in x:
            kind, text = _pair(x["$number"], bad)
            if kind not in _NUMBERS or not isinstance(text, str):
                raise bad("a number is [bool | int | float, repr]", x)
            try:
                return _NUMBERS[kind](text)
            except ValueError:
                raise bad("not a number", x) from None
        if "$tuple" in x and isinstance(x["$tuple"], list):
            return tuple(dec(v, depth + 1) for v in x["$tuple"])
        if "$dict" in x and isinstance(x["$dict"], list):
            items = x["$dict"]
            if not all(
                isinstance(i, list) and len(i) == 2 and type(i[0]) in (str, int) for i in items
            ):
                raise bad("$dict items are [key, value] with a str or int key", x)
            return {k: dec(v, depth + 1) for k, v in items}
        if "$namedtuple" in x:
            name, fields, values = x["$namedtuple"], x.get("fields"), x.get("values")
            if not (
                isinstance(name, str) and isinstance(fields, list) and isinstance(values, list)
            ):
                raise bad("$namedtuple is 'module:QualName' with fields and values", x)
            if len(fields) != len(values) or not all(isinstance(f, str) for f in fields):
                raise bad("a NamedTuple has one str field per value", x)
            decoded = [dec(v, depth + 1) for v in values]
            cls = tree.namedtuple_named(name, fields, True, where)
            return tuple(decoded) if cls is None else cls(*decoded)
        raise bad("unknown entry", x)

    return dec(data, 0)


def _pair(value: Any, bad: Any) -> tuple[Any, Any]:
    if not (isinstance(value, list) and len(value) == 2):
        raise bad("expected a pair", value)
    return value[0], value[1]
