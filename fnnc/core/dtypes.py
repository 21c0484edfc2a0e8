"""Dtype kinds as JAX counts them: bfloat16 is a floating type.

NumPy does not think so: ml_dtypes registers ``bfloat16`` (and the float8 types) as
void-kind scalars, so ``np.issubdtype(jnp.bfloat16, np.floating)`` is ``False`` while
``float16`` is ``True``. A check written with NumPy's ``issubdtype`` silently treats
bfloat16 tensors as non-float (no gradient, labels read as class indices, patterns that
do not match), which is how such checks went wrong before; fnnc asks here instead
(``tests/test_architecture.py`` keeps NumPy's form out of the package).

>>> import jax.numpy as jnp
>>> from fnnc.core.dtypes import is_floating
>>> is_floating(jnp.bfloat16), is_floating("float16"), is_floating(jnp.int32)
(True, True, False)
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np


def is_floating(dtype: Any) -> bool:
    """Whether ``dtype`` is a real floating type, bfloat16 and the float8 types included."""
    return bool(jnp.issubdtype(dtype, jnp.floating))


def is_inexact(dtype: Any) -> bool:
    """Whether ``dtype`` is floating or complex (bfloat16 included)."""
    return bool(jnp.issubdtype(dtype, jnp.inexact))


def at_least_float32(dtype: Any) -> np.dtype:
    """The type to compute in for values of ``dtype``: float32 for 16-bit and 8-bit
    floats (and integers), ``dtype`` itself for float32, float64 and complex types. Sums,
    squares and statistics of narrow values are taken in it and rounded once.

    >>> at_least_float32(jnp.bfloat16), at_least_float32("float64")
    (dtype('float32'), dtype('float64'))
    >>> at_least_float32(jnp.float8_e4m3fn)
    dtype('float32')
    """
    dtype = np.dtype(dtype)
    if is_floating(dtype) and dtype.itemsize < 4:
        # float8 types refuse implicit promotion (JAX's TypePromotionError)
        return np.dtype(np.float32)
    return np.dtype(jnp.promote_types(dtype, jnp.float32))
