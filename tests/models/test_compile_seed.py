"""``Model.compile``'s ``seed``: checked, and counted at the first compile only."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fnnc.models import Dense, Dropout, ModelError, Sequential

XS = np.ones((4, 6), np.float32)


def _model():
    return Sequential([Dense(4, name="fc"), Dropout(0.5)], name="net")


def _weights(model):
    params = model.parameters()
    return np.concatenate([np.ravel(params[k]) for k in sorted(params)])


@pytest.mark.parametrize("bad", [1.5, "3", True])
def test_a_seed_that_is_not_an_int_is_a_model_error(bad) -> None:
    with pytest.raises(ModelError, match=r"net\.compile: seed must be an int"):
        _model().compile([XS], seed=bad)


def test_numpy_int_seeds_are_ints() -> None:
    a, b = _model(), _model()
    a.compile([XS], seed=np.int64(3))
    b.compile([XS], seed=3)
    np.testing.assert_array_equal(_weights(a), _weights(b))


def test_another_seed_at_a_later_compile_warns_and_keeps_the_weights() -> None:
    a, zero = _model(), _model()
    a.compile([XS], seed=0)
    zero.compile([XS], seed=0)
    with pytest.warns(UserWarning, match=r"seed=1 is ignored.*compiled with seed=0"):
        a.compile([XS], seed=1)
    np.testing.assert_array_equal(_weights(a), _weights(zero))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a.compile([XS[:2]])  # a recompile for new shapes without a seed: no warning
        a.compile([XS], seed=0)  # the same seed: no warning


def test_a_later_compile_without_a_seed_keeps_the_first_seed() -> None:
    a, five = _model(), _model()
    a.compile([XS], seed=5)
    a.compile([XS[:2]])
    five.compile([XS], seed=5)
    np.testing.assert_array_equal(_weights(a), _weights(five))
