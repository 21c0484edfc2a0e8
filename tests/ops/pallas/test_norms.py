"""Pallas layer_norm and rms_norm against their references, in interpret mode."""

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.ops.pallas import _rownorm
from fnnc.ops.pallas import layer_norm as ln_kernel
from fnnc.ops.pallas import rms_norm as rms_kernel
from tests.helpers import rand
from tests.ops.pallas.checks import check_forced_eager, check_kernel, check_unsupported

SHAPES = [((6, 64), (-1,)), ((2, 3, 4, 16), (-2, -1)), ((3, 200), (-1,))]  # 200: ragged


@pytest.mark.parametrize(("shape", "axes"), SHAPES)
@pytest.mark.parametrize("params", [0, 1, 2])
def test_layer_norm(monkeypatch, shape, axes, params):
    monkeypatch.setattr(_rownorm, "LANE_BLOCK", 32)  # several lane blocks per row
    x = rand(shape, seed=1, lo=-2, hi=3)
    n = shape[len(shape) - len(axes) :]
    extra = [rand(n, seed=2), rand(n, seed=3)][:params]
    cmd = ops.layer_norm(axes=axes)
    check_kernel(ln_kernel, cmd, [x, *extra], diff=list(range(1 + params)))


@pytest.mark.parametrize(("shape", "axes"), SHAPES)
@pytest.mark.parametrize("params", [0, 1])
def test_rms_norm(monkeypatch, shape, axes, params):
    monkeypatch.setattr(_rownorm, "LANE_BLOCK", 32)
    x = rand(shape, seed=4, lo=-2, hi=3)
    n = shape[len(shape) - len(axes) :]
    extra = [rand(n, seed=5)][:params]
    check_kernel(rms_kernel, ops.rms_norm(axes=axes), [x, *extra], diff=list(range(1 + params)))


def test_forced_eager_calls():
    x, s = rand((4, 32)), rand((32,), seed=1)
    check_forced_eager(ops.layer_norm(), [x, s, s])
    check_forced_eager(ops.rms_norm(), [x, s])


def test_leading_axes_are_declined():
    cmd = ops.layer_norm(axes=(0,))
    check_unsupported(cmd, [rand((32, 16))], "not the trailing axes")


def test_wrong_dtype_is_declined():
    spec = jax.ShapeDtypeStruct((4, 32), np.float64)
    assert "float64" in ln_kernel.supports(ops.layer_norm(), [spec])
    assert "float64" in rms_kernel.supports(ops.rms_norm(), [spec])
