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

A NamedTuple class is looked up only among modules already imported, through their
``__dict__`` (the file names it, it never makes Python import or run anything); when
it is not defined, restore with a template (``like=``) instead.
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


def encode(
    tree: Any,
    label: str,
    row_name: Callable[[str], str],
    array: Callable[[Any, str], Any] | None = None,
) -> tuple[Any, Rows]:
    """``tree`` as JSON-able data, and the ``(row name, array)`` pairs to store.

    ``array(x, path)``, where given, writes each array leaf's entry instead (and no row):
    :mod:`fnnc.io.structure` keeps a tree's structure without its data so."""
    rows: Rows = []

    def enc(x: Any, path: str) -> Any:
        if isinstance(x, (np.ndarray, np.generic, jax.Array)):
            return _array(x, path) if array is None else array(x, path)
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


MAX_DEPTH = 200
"""Deepest container nesting :func:`decode` accepts (a file cannot exhaust the stack)."""

_KINDS = ("jax", "numpy", "scalar")


def decode(
    data: Any,
    read: Callable[[str, tuple[int, ...], np.dtype], np.ndarray],
    *,
    loose: bool,
    where: str = "checkpoint",
) -> Any:
    """The tree :func:`encode` described; ``read(row, shape, dtype)`` fetches arrays.

    With ``loose``, NamedTuples whose class is not loaded come back as plain tuples
    (same leaves, same order), for :func:`rebuild` with a template. Every entry is
    checked as it is decoded: anything :func:`encode` could not have written raises
    :class:`CheckpointError` naming ``where`` (never ``KeyError``, ``ValueError``,
    ``RecursionError``), and nothing is allocated beyond what ``read`` returns (an
    entry without a row is a zero-size array).
    """

    def bad(why: str, x: Any) -> CheckpointError:
        return CheckpointError(f"{where}: malformed entry {_short(x)}: {why}")

    def dec(x: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise CheckpointError(f"{where}: containers nested deeper than {MAX_DEPTH}")
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [dec(v, depth + 1) for v in x]
        if not isinstance(x, dict):
            raise bad("not a JSON value", x)
        if "$array" in x:
            return _leaf(x, read, bad)
        if "$float" in x:
            return _float(x["$float"], bad)
        if "$tuple" in x:
            return tuple(dec(v, depth + 1) for v in _list(x, "$tuple", bad))
        if "$none" in x:  # graph files before the codecs were one wrote None so
            return None
        if "$dict" in x:
            out = {}
            for item in _list(x, "$dict", bad):
                if not (isinstance(item, list) and len(item) == 2 and _key(item[0])):
                    raise bad("$dict items are [key, value] with a str or int key", item)
                out[item[0]] = dec(item[1], depth + 1)
            return out
        if "$namedtuple" in x:
            fields, values = _list(x, "fields", bad), _list(x, "values", bad)
            name = x["$namedtuple"]
            if not isinstance(name, str) or not all(isinstance(f, str) for f in fields):
                raise bad("$namedtuple is 'module:QualName' with str fields", x)
            if len(fields) != len(values):
                raise bad(f"{len(fields)} fields but {len(values)} values", x)
            decoded = [dec(v, depth + 1) for v in values]
            cls = _namedtuple(name, fields, loose, where)
            return tuple(decoded) if cls is None else cls(*decoded)
        raise bad(f"unknown entry with keys {sorted(map(str, x))[:8]}", x)

    return dec(data, 0)


def plain_metadata(metadata: Any) -> Any:
    """``metadata`` with NumPy and JAX scalars (``np.float32(0.5)``, the 0-d loss
    ``fit`` returns) as the Python numbers JSON holds, inside dicts, lists and tuples;
    everything else is left for ``json.dumps`` to take or refuse."""
    if isinstance(metadata, dict):
        return {
            (k.item() if isinstance(k, np.generic) else k): plain_metadata(v)
            for k, v in metadata.items()
        }
    if isinstance(metadata, (list, tuple)):
        return [plain_metadata(v) for v in metadata]
    if isinstance(metadata, np.generic):
        return metadata.item()
    if isinstance(metadata, (np.ndarray, jax.Array)) and metadata.ndim == 0:
        return metadata.item()
    return metadata


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


def _key(k: Any) -> bool:
    return type(k) in (str, int)


def _list(x: dict[str, Any], key: str, bad: Callable[[str, Any], Exception]) -> list[Any]:
    value = x.get(key)
    if not isinstance(value, list):
        raise bad(f"{key!r} must be a list", x)
    return value


def _float(text: Any, bad: Callable[[str, Any], Exception]) -> float:
    if isinstance(text, str) and len(text) < 32:
        try:
            return float(text)
        except ValueError:
            pass
    raise bad("$float holds the repr of a float ('inf', 'nan')", text)


def _leaf(
    x: dict[str, Any],
    read: Callable[[str, tuple[int, ...], np.dtype], np.ndarray],
    bad: Callable[[str, Any], Exception],
) -> Any:
    shape = x.get("shape")
    if not (
        isinstance(shape, list)
        and len(shape) <= 64
        and all(type(d) is int and 0 <= d < 2**63 for d in shape)
    ):
        raise bad("shape must be a list of non-negative ints", x)
    shape = tuple(shape)
    dtype = _dtype(x.get("dtype"), bad)
    kind, row = x.get("kind"), x["$array"]
    if kind not in _KINDS:
        raise bad(f"kind must be one of {list(_KINDS)}", x)
    if row is None:
        if math.prod(shape) != 0:  # encode stores every non-empty array in a row
            raise bad("an array without a row must have a zero-size shape", x)
        arr = np.zeros(shape, dtype)
    elif not isinstance(row, str):
        raise bad("$array names a tensor row (a str) or is null", x)
    elif x.get("bytes"):
        if kind == "scalar" and shape:
            raise bad("a scalar has shape []", x)
        raw = read(row, (*shape, dtype.itemsize), np.dtype(np.uint8))
        arr = raw.view(dtype).reshape(shape)
    else:
        arr = read(row, shape, dtype)
    if kind == "scalar":
        if arr.shape != ():
            raise bad("a scalar has shape []", x)
        return arr[()]
    if kind == "jax":
        weak = jnp.asarray(arr.item()) if x.get("weak") and arr.shape == () else None
        return weak if weak is not None and weak.dtype == arr.dtype else jnp.asarray(arr)
    return arr


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


def _dtype(name: Any, bad: Callable[[str, Any], Exception]) -> np.dtype:
    if not isinstance(name, str) or len(name) > 32:
        raise bad("dtype must be a dtype name", name)
    if isinstance(vars(ml_dtypes).get(name), type):
        return np.dtype(vars(ml_dtypes)[name])
    try:
        dtype = np.dtype(name)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "biufc" or dtype.itemsize == 0:
        raise bad("unsupported dtype (bool, ints, floats, complex, ml_dtypes)", name)
    return dtype


def _namedtuple(qualified: str, fields: list[str], loose: bool, where: str) -> type | None:
    """The class ``module:QualName`` names, if it is already defined.

    The lookup reads module and class ``__dict__``s only (``vars``), never ``getattr``:
    a module's ``__getattr__`` may import submodules lazily (NumPy's does), and a file
    must never make Python import or run anything. Only a ``tuple`` subclass with the
    saved ``_fields`` is accepted; anything else is a plain tuple (``loose``) or an error.
    """
    module, _, qualname = qualified.partition(":")
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        try:
            obj = vars(obj).get(part)
        except TypeError:  # no __dict__: not a module or a class
            obj = None
    if isinstance(obj, type) and issubclass(obj, tuple):
        saved = next((vars(c)["_fields"] for c in obj.__mro__ if "_fields" in vars(c)), None)
        if isinstance(saved, tuple) and list(saved) == list(fields):
            return obj
    if loose:
        return None
    why = "is not imported" if module not in sys.modules else "does not match the saved fields"
    raise CheckpointError(
        f"{where}: NamedTuple {module}.{qualname} {why} (fields {fields}); import its "
        "module before restoring, or pass a template of the state as like= / optimizer_like="
    )
