"""Splat constants (every element the same) lower to a broadcast and are not hoisted."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, compile
from fnnc.ops.constant import Literal


@pytest.mark.parametrize(
    "value, splat",
    [
        (np.full((4, 1), 0.125, np.float32), 0.125),
        (np.full((3,), np.nan, np.float32), np.nan),
        (np.array([0.0, -0.0], np.float32), None),  # equal as numbers, not as bits
        (np.arange(6, dtype=np.int32).reshape(2, 3), None),
        (np.zeros((0, 3), np.float32), None),
        (np.float32(2.0), 2.0),
    ],
)
def test_splat_is_the_value_every_element_holds_bit_for_bit(value, splat):
    got = Literal.of(value).splat
    if splat is None:
        assert got is None
    else:
        np.testing.assert_array_equal(got, np.asarray(splat, value.dtype))
        assert got.dtype == value.dtype


def test_splat_constants_are_broadcasts_and_dense_ones_are_arguments():
    b = GraphBuilder()
    x = b.input((64, 2), name="x")
    flat = b.exec(ops.constant(np.full((64, 2), 0.5, np.float32)))
    dense = b.exec(ops.constant(np.arange(128, dtype=np.float32).reshape(64, 2)))
    g = b.build([b.exec(ops.ewsum(), b.exec(ops.ewprod(), x, flat), dense)])
    program = compile(g)
    assert len(program._consts) == 1 and program._consts[0].shape == (64, 2)
    xv = np.ones((64, 2), np.float32)
    expected = xv * 0.5 + np.arange(128, dtype=np.float32).reshape(64, 2)
    np.testing.assert_array_equal(np.asarray(program(xv)), expected)
