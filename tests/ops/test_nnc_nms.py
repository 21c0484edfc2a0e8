"""NNC's ``test/unit/nnc/nms.tests.c``, translated."""

import jax
import numpy as np

from fnnc import ops


def _rows(w: float) -> np.ndarray:
    return np.array([[i, i, 0, w, 1] for i in range(10)], np.float32)


def test_compare_non_maximal_suppression_forward():
    b, c = ops.nms(iou_threshold=0.5)(_rows(1))
    np.testing.assert_array_equal(b, _rows(1)[::-1])
    np.testing.assert_array_equal(c, np.arange(9, -1, -1))


def test_non_maximal_suppression_with_extra_columns():
    a = np.zeros((10, 6), np.float32)
    a[:, :5] = _rows(1)
    b, c = ops.nms(iou_threshold=0.5)(a)
    np.testing.assert_array_equal(b, a[::-1])
    np.testing.assert_array_equal(c, np.arange(9, -1, -1))


def test_non_maximal_suppression_forward_with_some_value_suppressed():
    """NNC TEST_CASE covered here:
    "non-maximal suppression forward with some value suppressed".
    """
    b, c = ops.nms(iou_threshold=0.3)(_rows(2))
    kept = [9 - 2 * i for i in range(5)]
    np.testing.assert_array_equal(b[:5], _rows(2)[kept])
    np.testing.assert_array_equal(c, kept + [-1] * 5)
    assert (np.asarray(b)[5:, 0] == -np.finfo(np.float32).max).all()


def test_non_maximal_suppression_backward_with_some_value_suppressed():
    """NNC TEST_CASE covered here:
    "non-maximal suppression backward with some value suppressed".
    """
    cmd = ops.nms(iou_threshold=0.3)
    b, c = cmd(_rows(2))
    db = _rows(2)  # NNC feeds the input rows as the gradient of the sorted rows
    (da,) = cmd.definition.backward(
        (db, None), (jax.ShapeDtypeStruct((10, 5), np.float32),), (b, c), **cmd.kwargs
    )
    want = np.zeros((10, 5), np.float32)
    for i in range(5):
        want[9 - 2 * i] = db[i]
    np.testing.assert_array_equal(da, want)
