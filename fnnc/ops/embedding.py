"""Embedding family: embedding (NNC's INDEX_SELECT on a table, as its cnnp Embedding uses it).

``embedding(table, idx)`` gathers rows of ``table [V, D...]`` for integer indices of any
shape. Out-of-range indices are clamped to ``[0, V - 1]`` in the forward and in the
backward alike, so the two always agree.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from fnnc.core.command import Spec, Uses, defcommand
from fnnc.errors import DTypeError
from fnnc.ops._rules import fail, require_float, show, summing_dtype


def _embedding_shape(table, idx):
    require_float("embedding", table)
    if not jnp.issubdtype(idx.dtype, jnp.integer):
        raise DTypeError(
            f"embedding: indices {show(idx)} must be integers; "
            "convert them with datatype_conversion"
        )
    if table.ndim < 1:
        fail(f"embedding: table {show(table)} must be [vocabulary, features...]")
    if table.shape[0] == 0 and math.prod(idx.shape):
        fail(
            f"embedding: table {show(table)} has no row for the indices {show(idx)} to pick; "
            "give a table of at least one row (the vocabulary), or empty indices for an "
            "empty result"
        )
    return Spec((*idx.shape, *table.shape[1:]), table.dtype)


def _clamp(idx, n: int):
    # Clamped explicitly: jnp.take(mode="clip") and .at[].add treat negative indices differently.
    return jnp.clip(idx, 0, n - 1)


@defcommand(family="embedding", shape=_embedding_shape, uses=Uses(inputs=(1,)))
def embedding(table, idx):
    """Rows of ``table`` at ``idx``: shaped ``idx.shape + table.shape[1:]``.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.embedding()(jnp.arange(6.0).reshape(3, 2), jnp.array([[2, 0]]))
    Array([[[4., 5.],
            [0., 1.]]], dtype=float32)
    """
    return jnp.take(table, _clamp(idx, table.shape[0]), axis=0)


@embedding.backward
def _embedding_backward(grads, inputs, outputs):
    # Scatter-add into a zero table; only the indices are read, never the table. Rows
    # that share an index are summed in float32 for a 16-bit table, rounded once.
    (g,), (table, idx) = grads, inputs
    acc = summing_dtype(g.dtype)
    table_grad = jnp.zeros(table.shape, acc).at[_clamp(idx, table.shape[0])].add(g.astype(acc))
    return table_grad.astype(g.dtype), None
