"""The structure of a pytree without its data: how a sharded checkpoint keeps tuples,
NamedTuples (Optax states) and int keys that Orbax alone would give back as lists and
str-keyed dicts.

It is :mod:`fnnc.io.tree`'s codec with array leaves written as their shape and dtype,
never their data: :func:`skeleton` encodes, :func:`template` decodes into the tree with
``jax.ShapeDtypeStruct`` leaves, the ``like=`` that restores it (Python numbers stay
inline, as ``tree`` keeps them).

>>> import jax.numpy as jnp
>>> data = skeleton({"w": jnp.ones(2), "pair": (0.5, 7)})
>>> like = template(data, "here")
>>> like["w"].shape, like["w"].dtype, like["pair"], len(like["w"].sharding.device_set)
((2,), dtype('float32'), (0.5, 7), 1)
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from fnnc.errors import CheckpointError
from fnnc.io import tree

_SPEC = "$spec"
"""The row name of every leaf entry: there is no row, the entry is the spec."""


def skeleton(value: Any) -> Any:
    """``value``'s containers and leaf specs as JSON-able data; ``None`` where ``tree``
    cannot encode it (a custom pytree node, a typed PRNG key): then the caller keeps no
    structure."""

    def spec(x: Any, path: str) -> dict[str, Any]:
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            raise CheckpointError(f"{path} is a typed PRNG key")  # no dtype name: no structure
        shape, dtype = list(np.shape(x)), np.dtype(x.dtype).name
        return {"$array": _SPEC, "shape": shape, "dtype": dtype, "kind": "numpy"}

    try:
        return tree.encode(value, "", str, array=spec)[0]
    except CheckpointError:
        return None


def template(data: Any, where: str) -> Any:
    """The tree :func:`skeleton` described, with ``jax.ShapeDtypeStruct`` leaves placed
    on this process's first device (a NamedTuple whose class is not imported comes back
    as a plain tuple): a template without a sharding would make Orbax restore onto the
    mesh the arrays were saved from, which another machine or device count lacks."""
    one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def read(row: str, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        if row != _SPEC:
            raise CheckpointError(f"{where}: malformed structure entry: row {row!r}")
        return jax.ShapeDtypeStruct(shape, dtype, sharding=one)

    return tree.decode(data, read, loose=True, where=where)
