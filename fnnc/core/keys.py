"""Typed PRNG keys (``jax.random.key``) where fnnc carries NNC's raw key bits.

fnnc's random commands, graph inputs, programs and optimizer states hold keys as their
``uint32`` key data, as NNC does; a typed key given anywhere is taken as its bits.

>>> import jax
>>> is_key(jax.random.key(0)), key_bits(jax.random.key(0)).dtype.name
(True, 'uint32')
"""

from __future__ import annotations

from typing import Any

import jax


def is_key(value: Any) -> bool:
    """Whether ``value`` (an array, a tracer or a ``ShapeDtypeStruct``) is a typed key."""
    return jax.dtypes.issubdtype(getattr(value, "dtype", None), jax.dtypes.prng_key)


def key_bits(value: Any) -> Any:
    """``value``'s key data if it is a typed key, else ``value`` itself."""
    return jax.random.key_data(value) if is_key(value) else value
