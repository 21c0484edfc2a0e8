"""Review of session 22's fixes: values the stricter checks must still take, or refuse."""

import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import models as M
from fnnc.errors import ModelError
from fnnc.graph.passes.loss_scale import LossScale


def test_reshape_and_parameter_take_numpy_shapes_as_they_took_tuples():
    assert M.Reshape(np.array([2, 2])).shape == M.Reshape((2, 2)).shape == (2, 2)
    assert M.Parameter(np.array([3])).shape == (3,)
    with pytest.raises(ModelError, match="expected a tuple"):
        M.Reshape(np.array([[2, 2]]))


def test_loss_scale_takes_0_d_arrays_and_jax_scalars():
    for initial in (np.array(1024.0), jnp.float32(1024), np.float32(1024), 1024):
        scale = LossScale(initial=initial)
        assert float(scale.init().scale) == 1024.0
        assert scale == LossScale(initial=1024.0) and hash(scale) == hash(LossScale(1024.0))
    for bad in (np.array([1024.0]), np.array(True), "1024", 1j):
        with pytest.raises(Exception, match="positive finite number"):
            LossScale(initial=bad)


def test_attention_scale_past_float_range_is_refused_clearly():
    from fnnc import ops
    from fnnc.errors import CommandError

    with pytest.raises(ModelError, match=r"scale is .*expected a finite number"):
        M.ScaledDotProductAttention(scale=10**400)
    q = np.ones((1, 2, 1, 4), np.float32)
    with pytest.raises(CommandError, match=r"scale is .*expected a finite number"):
        ops.scaled_dot_product_attention(scale=10**400)(q, q, q)
