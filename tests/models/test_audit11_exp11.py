"""Audit 11 (exported and serialized computations): Model.export's platforms and
example inputs, checked against NumPy."""

import jax
import numpy as np
import optax
import pytest

from fnnc.errors import ConfigError
from fnnc.models import Dense, Input, Model, ReLU

W_ROWS = 3


@pytest.fixture(scope="module")
def dense():
    x = Input()
    m = Model(x, ReLU()(Dense(2, name="fc")(x)))
    m.compile(np.zeros((4, W_ROWS), np.float32), loss="mse", minimizer=optax.sgd(0.1))
    return m


def _numpy(m, x):
    p = {k: np.asarray(v, np.float64) for k, v in m.parameters().items()}
    return np.maximum(np.asarray(x, np.float64) @ p["t-fc-0-0"].T + p["t-fc-0-1"], 0)


def test_export_platforms_given_as_one_name_or_in_capitals_are_jax_export_names(dense):
    """platforms="cpu" was read letter by letter ("unknown platform 'c'"), ("CPU",) was
    lowered for 'CPU', which jax.export then refused to run on 'cpu' (a bare ValueError),
    and "gpu", which fnnc accepts, reached jax.export as a bare RuntimeError."""
    x = np.arange(6, dtype=np.float32).reshape(2, W_ROWS) - 2
    one = dense.export(None, platforms="cpu")
    assert one.platforms == ("cpu",)
    np.testing.assert_allclose(one.call(x), _numpy(dense, x), rtol=1e-6, atol=1e-6)
    capitals = dense.export(None, platforms=("CPU", "cpu", "Cuda"))
    assert capitals.platforms == ("cpu", "cuda")
    np.testing.assert_allclose(capitals.call(x), _numpy(dense, x), rtol=1e-6, atol=1e-6)
    if jax.default_backend() == "cpu":
        with pytest.raises(ConfigError, match="pass 'cuda' or 'rocm'"):
            dense.export(None, platforms=("cpu", "gpu"))
    with pytest.raises(ConfigError, match="platforms is empty"):
        dense.export(None, platforms=())


def test_export_takes_an_example_input_given_as_nested_lists(dense):
    """inputs=[[[...], ...]] (a nested list, as evaluate takes one) was an AttributeError
    ('list' object has no attribute 'dtype'); it is the example the check runs on."""
    rows = [[1.0, -2.0, 0.5], [0.0, 3.0, -1.0], [2.0, 2.0, 2.0]]
    exported = dense.export(None, inputs=[rows])
    assert exported.in_avals[0].dtype == np.float32
    x = np.asarray(rows, np.float32)
    np.testing.assert_allclose(exported.call(x), _numpy(dense, x), rtol=1e-6, atol=1e-6)
