"""NNC's ``sort.tests.c``, ``argsort.tests.c``, ``partition.tests.c``,
``unique_consecutive.tests.c`` and ``scatter_add.tests.c`` (liuliu/ccv
``test/unit/nnc/``), translated: same inputs, same expected tensors."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops

A_FIRST = [[1, 3], [2, 5], [3, 4]]
A_LAST = [[1, 3], [2, 1], [3, 4]]
A_1D = [1, 3, 2, 4, 5]

SORT_CASES = [
    # (input, axis, descending, values, indices)
    (A_FIRST, 0, False, [[1, 3], [2, 4], [3, 5]], [[0, 0], [1, 2], [2, 1]]),
    (A_LAST, 1, False, [[1, 3], [1, 2], [3, 4]], [[0, 1], [1, 0], [0, 1]]),
    (A_1D, 0, False, [1, 2, 3, 4, 5], [0, 2, 1, 3, 4]),
    (A_FIRST, 0, True, [[3, 5], [2, 4], [1, 3]], [[2, 1], [1, 2], [0, 0]]),
    (A_LAST, 1, True, [[3, 1], [2, 1], [4, 3]], [[1, 0], [0, 1], [1, 0]]),
    (A_1D, 0, True, [5, 4, 3, 2, 1], [4, 3, 1, 2, 0]),
]

PARTITION_CASES = [
    # (input, kth, axis, descending, values, indices)
    (A_FIRST, 2, 0, False, [[1, 3], [2, 4]], [[0, 0], [1, 2]]),
    (A_LAST, 1, 1, False, [[1], [1], [3]], [[0], [1], [0]]),
    (A_1D, 4, 0, False, [1, 2, 3, 4], [0, 2, 1, 3]),
    (A_FIRST, 2, 0, True, [[3, 5], [2, 4]], [[2, 1], [1, 2]]),
    (A_LAST, 1, 1, True, [[3], [2], [4]], [[1], [0], [1]]),
    (A_1D, 4, 0, True, [5, 4, 3, 2], [4, 3, 1, 2]),
]


@pytest.mark.parametrize("dtype", [np.float32, np.int32], ids=["float", "int"])
@pytest.mark.parametrize("case", range(len(SORT_CASES)))
def test_sort(case, dtype):
    a, axis, descending, values, indices = SORT_CASES[case]
    got_values, got_indices = ops.sort(axis=axis, descending=descending)(np.array(a, dtype))
    assert got_values.dtype == dtype and got_indices.dtype == np.int32
    np.testing.assert_array_equal(got_values, np.array(values, dtype))
    np.testing.assert_array_equal(got_indices, np.array(indices, np.int32))


@pytest.mark.parametrize("dtype", [np.float32, np.int32], ids=["float", "int"])
@pytest.mark.parametrize("case", range(len(SORT_CASES)))
def test_argsort(case, dtype):
    # argsort.tests.c: the same inputs as sort.tests.c, only the indices come out
    a, axis, descending, _, indices = SORT_CASES[case]
    got = ops.argsort(axis=axis, descending=descending)(np.array(a, dtype))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.array(indices, np.int32))


def test_argsort_is_forward_only_and_rejects_a_scalar():
    from fnnc.errors import ShapeError

    assert not ops.argsort().definition.attributes.differentiable
    with pytest.raises(ShapeError, match="argsort: needs an input of rank >= 1"):
        ops.argsort()(np.float32(1.0))


@pytest.mark.parametrize("dtype", [np.float32, np.int32], ids=["float", "int"])
@pytest.mark.parametrize("case", range(len(PARTITION_CASES)))
def test_partition(case, dtype):
    a, kth, axis, descending, values, indices = PARTITION_CASES[case]
    cmd = ops.partition(kth=kth, axis=axis, descending=descending)
    got_values, got_indices = cmd(np.array(a, dtype))
    np.testing.assert_array_equal(got_values, np.array(values, dtype))
    np.testing.assert_array_equal(got_indices, np.array(indices, np.int32))


UNIQUE_IN = [2, 2, 2, 0, 0, 2, 2, 1, 1, 2, 3]


@pytest.mark.parametrize("dtype", [np.float32, np.int32], ids=["float", "int"])
def test_unique_consecutive(dtype):
    values, counts = ops.unique_consecutive(bincount=7)(np.array(UNIQUE_IN, dtype))
    np.testing.assert_array_equal(values, np.array([2, 0, 2, 1, 2, 3, -1], dtype))
    np.testing.assert_array_equal(counts, [3, 2, 2, 2, 1, 1, 0])


@pytest.mark.parametrize("dtype", [np.float32, np.int32], ids=["float", "int"])
def test_unique_consecutive_smaller_container(dtype):
    """NNC fills a 5-entry output from bincount 7: the first five runs."""
    values, counts = ops.unique_consecutive(bincount=7)(np.array(UNIQUE_IN, dtype))
    np.testing.assert_array_equal(values[:5], np.array([2, 0, 2, 1, 2], dtype))
    np.testing.assert_array_equal(counts[:5], [3, 2, 2, 2, 1])
    short_values, short_counts = ops.unique_consecutive(bincount=5)(np.array(UNIQUE_IN, dtype))
    np.testing.assert_array_equal(short_values, values[:5])
    np.testing.assert_array_equal(short_counts, counts[:5])


def test_unique_consecutive_same_elements_at_end():
    a = np.array([2, 2, 2, 0, 0, 2, 2, 1, 3, 3, 3], np.int32)
    values, counts = ops.unique_consecutive(bincount=7)(a)
    np.testing.assert_array_equal(values, [2, 0, 2, 1, 3, -1, -1])
    np.testing.assert_array_equal(counts, [3, 2, 2, 1, 3, 0, 0])


def test_scatter_add_a_tensor():
    b = np.array([[1, 2], [2, 3]], np.float32)
    out = ops.scatter_add(bincount=3)(b, np.array([1, 1], np.int32))
    np.testing.assert_array_equal(out, [[0, 0], [3, 5], [0, 0]])
