"""How :mod:`fnnc.io.sharded_checkpoints` gives Orbax a pytree and takes it back: dict
keys escaped into names Orbax stores as one (and back), leaves checked before anything
on disk changes, restore targets, and leaves put back under their own keys.

>>> unescape(escape("layer.0/w%")) == "layer.0/w%", escape("a.b/c")
(True, 'a%2Eb%2Fc')
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from fnnc.errors import CheckpointError


def escape(key: str) -> str:
    """A dict key Orbax stores as one name: it joins a leaf's path with ``.`` (so
    ``{"a": {"b.c": x}}`` and ``{"a.b": {"c": y}}`` would collide) and ``/`` makes
    directories; both are percent-encoded."""
    return key.replace("%", "%25").replace(".", "%2E").replace("/", "%2F")


def unescape(key: str) -> str:
    """The inverse of :func:`escape`."""
    return key.replace("%2F", "/").replace("%2E", ".").replace("%25", "%")


def check_savable(tree: Any, what: str, where: str) -> None:
    """A :class:`CheckpointError` naming the leaf, before anything on disk changes (a
    re-save replaces its step), for what Orbax cannot store: a dict whose keys mix
    types, a zero-size array, a leaf that is not numbers (:func:`storable`)."""
    try:
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    except (TypeError, ValueError) as e:
        raise CheckpointError(
            f"{where}: its {what} is no pytree JAX can flatten ({str(e)[:200]}); the keys "
            "of one dict must be all strings or all ints"
        ) from None
    for path, leaf in leaves:
        if not storable(leaf):
            dtype = getattr(leaf, "dtype", None)
            kind = type(leaf).__name__ + (f" of {dtype}" if dtype is not None else "")
            raise CheckpointError(
                f"{where}: {what} leaf {jax.tree_util.keystr(path)} is a {kind} "
                f"({leaf!r:.40}), which Orbax cannot store: save arrays of numbers (bool, "
                "int, float, complex) or Python bool, int and float, and give other values "
                "as metadata= (JSON)"
            )
        if getattr(leaf, "size", None) == 0:
            raise CheckpointError(
                f"{where}: {what} leaf {jax.tree_util.keystr(path)} is a zero-size array "
                f"{tuple(leaf.shape)}, which Orbax cannot store: leave it out, or save with "
                "Checkpoints (one SQLite file), which stores it"
            )


def storable(leaf: Any) -> bool:
    """Whether Orbax stores ``leaf``: a Python bool, int or float, or an array (or NumPy
    scalar) of bools, numbers (bfloat16, int4 and float8 included) or PRNG keys; not a
    str, bytes, Python complex, nor an array of strings, objects or dates."""
    if isinstance(leaf, (bool, int, float)):
        return True
    if not isinstance(leaf, (np.ndarray, np.generic, jax.Array)):
        return False
    dtype = leaf.dtype
    kinds = (np.number, np.bool_, jax.dtypes.prng_key)
    return any(jax.dtypes.issubdtype(dtype, k) for k in kinds)


def spec(leaf: Any) -> Any:
    """A restore target leaf: shape, dtype and (when it has one) sharding; a Python
    number stays itself (Orbax restores it as the number it saved)."""
    if isinstance(leaf, (bool, int, float)):
        return leaf
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=getattr(leaf, "sharding", None))


def keyed(tree: Any) -> Any:
    """``tree`` with every dict key escaped (:func:`escape`)."""
    if isinstance(tree, dict):
        return {escape(str(k)): keyed(v) for k, v in tree.items()}
    if hasattr(tree, "_fields"):  # a NamedTuple (an Optax state)
        return type(tree)(*(keyed(v) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(keyed(v) for v in tree)
    return tree


def placed(like: Any, leaves: list[Any]) -> Any:
    """``like``'s tree holding ``leaves``, which come in the leaf order of ``keyed(like)``
    (Orbax restores the escaped target): dict keys sort as the strings they are saved
    as, which for int keys is not ``like``'s order (``"10" < "2"``, ``2 < 10``)."""
    structure = jax.tree.structure(like)
    order = jax.tree.leaves(keyed(jax.tree.unflatten(structure, range(structure.num_leaves))))
    placed: list[Any] = [None] * structure.num_leaves
    for leaf, k in zip(leaves, order, strict=True):
        placed[k] = leaf
    return jax.tree.unflatten(structure, placed)


def unkeyed(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {unescape(str(k)): unkeyed(v) for k, v in tree.items()}
    if hasattr(tree, "_fields"):
        return type(tree)(*(unkeyed(v) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(unkeyed(v) for v in tree)
    return tree
