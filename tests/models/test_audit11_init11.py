"""Default parameter initialisation against NNC's init_states (ccv_cnnp_model_addons.c)."""

import jax.numpy as jnp
import numpy as np
import pytest

from fnnc.models import LSTM, Dense, Embedding, Sequential


def _lstm_parameters(seed, **options):
    model = Sequential([LSTM(16, name="l", **options)])
    model.compile([np.zeros((1, 2, 8), np.float32)], seed=seed)
    return {k: np.asarray(v, np.float64) for k, v in model.parameters().items()}


@pytest.fixture(scope="module")
def lstm_params():
    return _lstm_parameters(0)


def test_lstm_starts_uniform_in_one_over_sqrt_hidden_biases_included(lstm_params):
    # NNC's _ccv_cnnp_lstm_init_states: CMD_RANDOM_UNIFORM_FORWARD(-stdv, stdv) on the
    # whole packed weights (biases included), stdv = 1 / sqrt(hidden_size)
    bound = 1.0 / np.sqrt(16)
    assert [v.shape for v in lstm_params.values()] == [(64, 8), (64, 16), (64,)]
    for name, v in lstm_params.items():
        assert np.abs(v).max() <= bound, name
        assert np.abs(v).max() > 0.9 * bound, name  # 64 draws or more: close to the bound
    every = np.concatenate([v.ravel() for v in lstm_params.values()])  # 1600 draws
    # uniform(-b, b): mean 0 (std of the mean b / sqrt(3 n) = 0.0036), variance b^2 / 3
    assert abs(every.mean()) < 0.015
    assert every.var() == pytest.approx(bound**2 / 3, rel=0.1)


def test_lstm_init_is_deterministic_under_a_seed(lstm_params):
    again = _lstm_parameters(0)
    for name, v in lstm_params.items():
        np.testing.assert_array_equal(again[name], v)
    other = _lstm_parameters(1)
    assert not np.array_equal(other["t-l-0-0"], lstm_params["t-l-0-0"])


def _first_values(layer, x):
    model = Sequential([layer])
    model.compile([x], seed=3)
    return {k: np.asarray(v) for k, v in model.parameters().items()}


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_16_bit_weights_are_float32_draws_rounded_as_nncs(dtype):
    # NNC draws a float and writes it into the 16-bit tensor; drawn in bfloat16 itself,
    # JAX's uniform took 128 values only (and its normal was cut near 2.5 sigma)
    x = np.zeros((1, 64), np.float32)
    wide = _first_values(Dense(64, name="d"), x)["t-d-0-0"]
    narrow = _first_values(Dense(64, name="d"), x.astype(dtype))["t-d-0-0"]
    assert narrow.dtype == dtype
    _rounded(narrow, wide, dtype)
    assert len(np.unique(narrow)) > 1000
    ids = np.zeros((1, 1), np.int32)
    wide = _first_values(Embedding(64, 64, name="e"), ids)["t-e-0-0"]
    narrow = _first_values(Embedding(64, 64, dtype=dtype, name="e"), ids)["t-e-0-0"]
    _rounded(narrow, wide, dtype)
    assert np.abs(narrow.astype(np.float32)).max() > 3 * 0.02


def _rounded(narrow, wide, dtype):
    """``narrow`` is ``wide`` rounded to ``dtype`` (XLA's fused convert may land one ulp off)."""
    eps = float(jnp.finfo(dtype).eps)
    np.testing.assert_allclose(narrow.astype(np.float32), wide, rtol=eps, atol=1e-7)
