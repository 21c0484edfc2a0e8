"""TensorFile.read into a smaller shape: the first stored values, as NNC's
ccv_nnc_tensor_read fills a preallocated smaller tensor (tensor.tests.c, "tensor
persistence" and its 16F <-> 32F twin: a [10, 20, 30] row read into a [10] tensor)."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc.errors import ShapeError
from fnnc.io import TensorFile


def test_read_the_first_values_into_a_smaller_shape(tmp_path) -> None:
    x = np.random.default_rng(1).uniform(-1, 1, (10, 20, 30)).astype(np.float32)
    with TensorFile(tmp_path / "t.sqlite") as f:
        f.write("x", x)
        np.testing.assert_array_equal(f.read("x"), x)
        first = f.read("x", shape=(10,))
        assert first.shape == (10,)
        np.testing.assert_array_equal(first, x.reshape(-1)[:10])
        np.testing.assert_array_equal(f.read("x", shape=(2, 3)), x.reshape(-1)[:6].reshape(2, 3))
        np.testing.assert_array_equal(f.read("x", shape=(0,)), np.zeros(0, np.float32))
        assert f.read("x", shape=(3,)).flags.writeable


def test_smaller_shape_with_a_float_conversion(tmp_path) -> None:
    """NNC's "tensor persistence with type conversion": 16F read into a 32F [10] and
    32F into a 16F [10], the first ten values each."""
    rng = np.random.default_rng(2)
    x16 = rng.uniform(-1, 1, (10, 20, 30)).astype(np.float16)
    y32 = rng.uniform(-1, 1, (10, 20, 30)).astype(np.float32)
    with TensorFile(tmp_path / "t.sqlite") as f:
        f.write("x", x16)
        f.write("y", y32)
        got_x = f.read("x", shape=(10,), dtype=np.float32)
        got_y = f.read("y", shape=(10,), dtype=np.float16)
    assert got_x.dtype == np.float32 and got_y.dtype == np.float16
    np.testing.assert_array_equal(got_x, x16.reshape(-1)[:10].astype(np.float32))
    np.testing.assert_allclose(got_y.astype(np.float32), y32.reshape(-1)[:10], atol=1e-3)


def test_a_larger_shape_is_refused(tmp_path) -> None:
    with TensorFile(tmp_path / "t.sqlite") as f:
        f.write("f", np.zeros((3, 5), np.float32))
        with pytest.raises(ShapeError, match=r"'f'.*\[3, 5\] \(15 elements\).*\[4, 4\] \(16"):
            f.read("f", shape=(4, 4))
