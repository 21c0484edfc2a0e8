"""Audit 8 (mixed precision, dtypes): ewabs of unsigned integers and bool is NumPy's
identity (JAX's abs refuses them; the shape rule had let them through to a run-time
failure). Oracle: NumPy's ``abs``."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, compile, interpret

DTYPES = [np.uint8, np.uint16, np.uint32, np.bool_, np.int8, np.int32, np.float16]


def _values(dtype):
    if dtype == np.bool_:
        return np.array([True, False, True])
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else None
    low = info.min if info is not None else -3.5
    high = info.max if info is not None else 2.0
    return np.array([low, 0, high], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_ewabs_matches_numpy_for_every_integer_kind(dtype):
    x = _values(dtype)
    want = np.abs(x)  # uint and bool: x itself; int8's -128 stays -128, as in NumPy
    b = GraphBuilder()
    s = b.input(x.shape, dtype)
    graph = b.build([b.exec(ops.ewabs(), s)])
    for got in (ops.ewabs()(x), interpret(graph, x), compile(graph)(x)):
        got = np.asarray(got)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_ewabs_of_bfloat16_still_drops_the_sign():
    x = np.array([-1.5, 0.0, 2.0], ml_dtypes.bfloat16)
    got = np.asarray(ops.ewabs()(x))
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got.astype(np.float32), [1.5, 0.0, 2.0])
