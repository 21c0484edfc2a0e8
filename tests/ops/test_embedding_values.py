"""Embedding lookups and their scatter-add backward."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import DTypeError
from tests.helpers import assert_close, rand


def test_embedding_gathers_rows() -> None:
    table, idx = rand([5, 3]), np.array([[4, 0], [2, 2]], np.int32)
    assert_close(ops.embedding()(table, idx), table[idx])


def test_embedding_backward_scatter_adds() -> None:
    table, idx = rand([4, 2]), np.array([1, 1, 3, -2, 9], np.int32)
    g = rand([5, 2], seed=1)
    spec = jax.ShapeDtypeStruct(table.shape, table.dtype)
    gt, gidx = ops.embedding().definition.backward((g,), (spec, idx), (None,))
    want = np.zeros_like(table)
    for i, row in zip(np.clip(idx, 0, 3), g):  # out-of-range indices clamp, as in the forward
        want[i] += row
    assert gidx is None
    assert_close(gt, want, atol=1e-6)
    assert_close(ops.embedding()(table, idx), table[np.clip(idx, 0, 3)])


def test_embedding_needs_integer_indices() -> None:
    with pytest.raises(DTypeError, match="must be integers"):
        ops.embedding()(rand([4, 2]), np.array([0.0, 1.0], np.float32))
