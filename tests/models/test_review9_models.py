"""Review of session 21's checks: numbers of every real type stay accepted.

bfloat16's NumPy kind is ``'V'``, not ``'f'``, so kind-based checks refused a metric a
bfloat16 model computed; 0-d NumPy and JAX arrays of a real number are numbers to a
layer's argument check as they were before it existed.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import fnnc.models as M
from fnnc.errors import ModelError
from fnnc.models import layers
from fnnc.models.metrics import _number
from fnnc.models.sample_sets import _shown


def test_a_bfloat16_metric_value_is_a_number() -> None:
    assert _number("mae", jnp.bfloat16(0.8203125)) == 0.8203125
    assert _number("count", np.int64(3)) == 3.0
    assert _shown(np.asarray(jnp.bfloat16(2.5))) == "2.5"
    with pytest.raises(ModelError, match="metric 'mae' returned"):
        _number("mae", np.zeros(2, jnp.bfloat16))


@pytest.mark.parametrize("p", [jnp.float32(0.1), np.array(0.1), np.float64(0.1)])
def test_layer_arguments_take_0_d_arrays_of_real_numbers(p) -> None:
    M.Dropout(p)
    M.BatchNorm(momentum=np.asarray(0.9))
    with pytest.raises(ModelError, match="p is array"):
        M.Dropout(np.array([0.1]))  # one number, not an array of one
    with pytest.raises(ModelError, match=r"expected a number in \[0.0, 1.0\)"):
        M.Dropout(jnp.bfloat16(1.5))


def test_a_parameter_init_beyond_any_float_names_the_layer() -> None:
    with pytest.raises(ModelError, match="beyond float64's range"):
        layers.Parameter((1,), init=10**400)


def test_early_stopping_takes_a_0_d_min_delta() -> None:
    assert M.EarlyStopping(min_delta=jnp.float32(0.5)).min_delta == 0.5
    assert M.EarlyStopping(min_delta=np.array(2)).min_delta == 2.0
