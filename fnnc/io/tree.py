"""Pytrees as JSON plus tensor rows, for checkpoints (no pickle, nothing imported).

The one pytree codec of fnnc: checkpoints and graph files (output structures) both
use it. Containers are written as tagged JSON: ``None``, lists, ``{"$tuple": [...]}``,
``{"$dict": [[key, value], ...]}`` (str or int keys, insertion order kept) and
``{"$namedtuple": "module:QualName", "fields": [...], "values": [...]}`` (Optax states
are NamedTuples). Python ``bool``/``int``/
``float``/``str`` leaves are stored inline. Arrays become
``{"$array": row, "shape": [...], "dtype": "float32", "kind": "jax" | "numpy" |
"scalar"}`` and their bytes go to a tensor row; dtypes NNC lacks (bool, int8, ...) are
stored as uint8 bytes with one extra axis and viewed back.

A NamedTuple class is looked up only among modules already imported (the file names
it, it never makes Python import anything); when it is not, restore with a template
(``like=``) instead.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from fnnc.errors import CheckpointError
from fnnc.io.format import CODES

Rows = list[tuple[str, np.ndarray]]


def encode(tree: Any, label: str, row_name: Callable[[str], str]) -> tuple[Any, Rows]:
    """``tree`` as JSON-able data, and the ``(row name, array)`` pairs to store."""
    rows: Rows = []

    def enc(x: Any, path: str) -> Any:
        if isinstance(x, (np.ndarray, np.generic, jax.Array)):
            return _array(x, path)
        if x is None or isinstance(x, (bool, int, str)):
            return x
        if isinstance(x, float):
            return x if math.isfinite(x) else {"$float": repr(x)}
        if type(x) is list:
            return [enc(v, f"{path}[{i}]") for i, v in enumerate(x)]
        if type(x) is tuple:
            return {"$tuple": [enc(v, f"{path}[{i}]") for i, v in enumerate(x)]}
        if type(x) is dict:
            for k in x:
                if type(k) not in (str, int):
                    raise CheckpointError(
                        f"checkpoint: {path or 'the tree'} has a {type(k).__name__} key {k!r}; "
                        "only str and int keys are saved"
                    )
            return {"$dict": [[k, enc(v, f"{path}[{k!r}]")] for k, v in x.items()]}
        if isinstance(x, tuple) and hasattr(type(x), "_fields"):
            cls = type(x)
            values = [enc(v, f"{path}.{f}") for f, v in zip(cls._fields, x)]
            name = f"{cls.__module__}:{cls.__qualname__}"
            return {"$namedtuple": name, "fields": list(cls._fields), "values": values}
        raise CheckpointError(
            f"checkpoint: {path or 'the tree'} is a {type(x).__name__}; checkpoints hold "
            "arrays, Python scalars and str in dict, list, tuple, NamedTuple and None "
            "containers (convert it, e.g. to a dict of arrays)"
        )

    def _array(x: Any, path: str) -> dict[str, Any]:
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            raise CheckpointError(
                f"checkpoint: {path} is a typed PRNG key; save jax.random.key_data(key)"
            )
        kind = "jax" if isinstance(x, jax.Array) else "scalar" if np.isscalar(x) else "numpy"
        arr = np.asarray(x)
        entry: dict[str, Any] = {"$array": None, "shape": list(arr.shape), "dtype": arr.dtype.name}
        entry["kind"] = kind
        if kind == "jax" and getattr(x, "weak_type", False) and arr.ndim == 0:
            entry["weak"] = True
        if arr.size:
            if arr.dtype.byteorder == ">":
                arr = arr.astype(arr.dtype.newbyteorder("<"))
            if arr.dtype not in CODES:  # bool, int8, ...: store the bytes
                arr = np.ascontiguousarray(arr).view(np.uint8).reshape(*arr.shape, -1)
                entry["bytes"] = True
            entry["$array"] = row_name(label + path)
            rows.append((entry["$array"], arr))
        return entry

    return enc(tree, ""), rows


def decode(
    data: Any, read: Callable[[str, tuple[int, ...], np.dtype], np.ndarray], *, loose: bool
) -> Any:
    """The tree :func:`encode` described; ``read(row, shape, dtype)`` fetches arrays.

    With ``loose``, NamedTuples whose class is not loaded come back as plain tuples
    (same leaves, same order), for :func:`rebuild` with a template.
    """

    def dec(x: Any) -> Any:
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [dec(v) for v in x]
        if not isinstance(x, dict):
            raise CheckpointError(f"checkpoint: malformed tree entry {x!r:.80}")
        if "$array" in x:
            return _leaf(x)
        if "$float" in x:
            return float(x["$float"])
        if "$tuple" in x:
            return tuple(dec(v) for v in x["$tuple"])
        if "$none" in x:  # graph files before the codecs were one wrote None so
            return None
        if "$dict" in x:
            return {k: dec(v) for k, v in x["$dict"]}
        if "$namedtuple" in x:
            values = [dec(v) for v in x["values"]]
            cls = _namedtuple(x["$namedtuple"], x["fields"], loose)
            return tuple(values) if cls is None else cls(*values)
        raise CheckpointError(f"checkpoint: unknown tree entry with keys {sorted(x)}")

    def _leaf(x: dict[str, Any]) -> Any:
        shape, dtype = tuple(int(d) for d in x["shape"]), _dtype(x["dtype"])
        if x["$array"] is None:
            arr = np.zeros(shape, dtype)
        elif x.get("bytes"):
            raw = read(x["$array"], (*shape, dtype.itemsize), np.dtype(np.uint8))
            arr = raw.view(dtype).reshape(shape)
        else:
            arr = read(x["$array"], shape, dtype)
        if x["kind"] == "scalar":
            return arr[()]
        if x["kind"] == "jax":
            weak = jnp.asarray(arr.item()) if x.get("weak") else None
            return weak if weak is not None and weak.dtype == arr.dtype else jnp.asarray(arr)
        return arr

    return dec(data)


def rebuild(decoded: Any, like: Any, what: str) -> Any:
    """The leaves of ``decoded`` in the structure of the template ``like``."""
    leaves = jax.tree.leaves(decoded)
    template, treedef = jax.tree.flatten(like)
    if len(leaves) != len(template):
        raise CheckpointError(
            f"checkpoint: the saved {what} has {len(leaves)} leaves, the template "
            f"given as like= has {len(template)}; pass a template of the same structure"
        )
    for i, (got, want) in enumerate(zip(leaves, template)):
        if hasattr(want, "shape") and np.shape(got) != tuple(want.shape):
            raise CheckpointError(
                f"checkpoint: {what} leaf {i} is saved with shape {list(np.shape(got))}, "
                f"the template has {list(want.shape)}"
            )
    return jax.tree.unflatten(treedef, leaves)


def _dtype(name: str) -> np.dtype:
    if isinstance(getattr(ml_dtypes, name, None), type):
        return np.dtype(getattr(ml_dtypes, name))
    dtype = np.dtype(name)
    if dtype.kind not in "biufc":
        raise CheckpointError(f"checkpoint: unsupported dtype {name!r} in the manifest")
    return dtype


def _namedtuple(qualified: str, fields: list[str], loose: bool) -> type | None:
    module, _, qualname = qualified.partition(":")
    obj: Any = sys.modules.get(module)  # never import: the file only names the class
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if (
        isinstance(obj, type)
        and issubclass(obj, tuple)
        and list(getattr(obj, "_fields", ())) == list(fields)
    ):
        return obj
    if loose:
        return None
    why = "is not imported" if module not in sys.modules else "does not match the saved fields"
    raise CheckpointError(
        f"checkpoint: NamedTuple {module}.{qualname} {why} (fields {fields}); import its "
        "module before restoring, or pass a template of the state as like= / optimizer_like="
    )
