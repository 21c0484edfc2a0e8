"""Reductions over an empty axis: sums are NumPy's (zero), a maximum, minimum or arg
extremum of no values is an fnnc ShapeError naming the axis, at the call or the node
(JAX raised a bare ValueError while tracing)."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import ShapeError
from fnnc.graph import GraphBuilder

X = np.zeros((2, 0), np.float32)


@pytest.mark.parametrize(
    "cmd",
    [ops.reduce_max(axes=(1,)), ops.reduce_min(axes=(1,)), ops.argmax(axis=1), ops.argmin(axis=-1)],
    ids=str,
)
def test_extrema_of_an_empty_axis_name_it(cmd):
    with pytest.raises(ShapeError, match=rf"{cmd.name}: axis 1 of float32\[2, 0\] is empty"):
        cmd(X)
    b = GraphBuilder()
    with pytest.raises(ShapeError, match="is empty"):
        b.exec(cmd, b.input(X.shape, name="x"), name="pick")


def test_sums_of_an_empty_axis_and_extrema_along_a_full_one_are_numpy_s():
    np.testing.assert_array_equal(np.asarray(ops.reduce_sum(axes=(1,))(X)), np.zeros((2, 1)))
    assert np.asarray(ops.reduce_max(axes=(0,))(X)).shape == (1, 0)
