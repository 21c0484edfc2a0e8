"""Audit 11 (exported and serialized computations): Model.export's platforms and
example inputs, checked against NumPy."""

import re

import jax
import numpy as np
import optax
import pytest

from fnnc.errors import ConfigError, ModelError
from fnnc.models import Add, Dense, Dropout, Input, Model, ReLU, model_function

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


def test_model_function_names_a_random_key_it_cannot_take():
    """A key of another implementation (rbg), a batch of keys, float key data, or one
    key not in a list reached JAX as 'invalid PRNG key data' / 'bernoulli accepts a
    single key' / 'len() of unsized object' from inside the graph; now a ModelError."""
    x = Input()
    m = Model(x, Dropout(0.5)(Dense(3, name="fc")(x)))
    xs = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    m.compile(xs, loss="mse", minimizer=optax.sgd(0.1))
    fn = model_function(m, [xs], training=True)
    params = fn.initial_parameters(m)
    key = jax.random.key(3)
    (typed,), _ = fn([xs], params, [key])
    (bits,), _ = fn([xs], params, [jax.random.key_data(key)])
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    dense = xs.astype(np.float64) @ p["t-fc-0-0"].T + p["t-fc-0-1"]
    kept = np.asarray(typed) != 0
    np.testing.assert_allclose(np.asarray(typed)[kept], 2 * dense[kept], rtol=1e-5)
    np.testing.assert_array_equal(typed, bits)
    bad = {
        "key<rbg>[]": jax.random.key(0, impl="rbg"),
        "key<fry>[2]": jax.random.split(key, 2),
        "float32[2]": np.zeros(2, np.float32),
    }
    for shown, value in bad.items():
        with pytest.raises(
            ModelError, match=rf"random key 0 is {re.escape(shown)}, .* uint32\[2\]"
        ):
            fn([xs], params, [value])
    with pytest.raises(ModelError, match=r"keys is one value .*fn\(inputs, params, \[key\]\)"):
        fn([xs], params, key)


def test_export_of_inputs_with_other_first_axes_says_they_are_not_one_batch():
    """A model whose second input is one row added to every row ([4, 3] and [1, 5])
    exported with a symbolic batch failed in the check with jax.export's bare 'Input
    shapes do not match the polymorphic shapes specification' ValueError (with
    check=False the artifact mapped over that row as a batch); now a ModelError, and
    the batch=None it suggests gives the NumPy result."""
    a, b = Input(), Input()
    m = Model([a, b], Add()(Dense(2, name="fa")(a), b))
    xa = np.arange(12, dtype=np.float32).reshape(4, 3) / 12
    xb = np.array([[1.0, -1.0]], np.float32)
    m.compile([xa, xb], loss="mse", minimizer=optax.sgd(0.1))
    with pytest.raises(ModelError, match=r"first axes are \[4, 1\].*batch=None"):
        m.export(None)
    with pytest.raises(ModelError, match=r"first axes are \[4, 1\]"):
        m.export(None, check=False)
    fixed = m.export(None, batch=None)
    p = {k: np.asarray(v, np.float64) for k, v in m.parameters().items()}
    want = xa.astype(np.float64) @ p["t-fa-0-0"].T + p["t-fa-0-1"] + xb
    np.testing.assert_allclose(fixed.call(xa, xb), want, rtol=1e-6, atol=1e-6)


def test_export_of_a_symbolic_example_spec_says_to_name_the_batch(dense):
    """inputs=[ShapeDtypeStruct(symbolic_shape('n, 3'))] was a bare TypeError
    ('_DimExpr' object cannot be interpreted as an integer); the batch is made symbolic
    by batch=, which gives an artifact of any row count (NumPy oracle)."""
    spec = jax.ShapeDtypeStruct(jax.export.symbolic_shape(f"n, {W_ROWS}"), np.float32)
    with pytest.raises(ModelError, match=r"example input 0 .*symbolic dimension.*batch="):
        dense.export(None, inputs=[spec])
    exported = dense.export(None, batch="n", inputs=[jax.ShapeDtypeStruct((4, W_ROWS), np.float32)])
    assert str(exported.in_avals[0].shape[0]) == "n"
    x = np.linspace(-1, 1, 5 * W_ROWS, dtype=np.float32).reshape(5, W_ROWS)
    np.testing.assert_allclose(exported.call(x), _numpy(dense, x), rtol=1e-6, atol=1e-6)


def test_export_tells_an_artifact_for_rocm_from_one_for_cuda(monkeypatch):
    """On an NVIDIA machine platforms=("rocm",) counted as this platform (fnnc names
    both 'gpu'), so export chose this machine's kernels and ran the check, which
    jax.export refuses ('exported for platforms (rocm,) but it is used on (cuda,)')."""
    from fnnc.models import export as export_module

    monkeypatch.setattr(jax.export, "default_export_platform", lambda: "cuda")
    assert export_module._runs_here(("rocm",)) == "no"
    assert export_module._runs_here(("cuda",)) == "only"
    assert export_module._runs_here(("cpu", "cuda")) == "also"
    assert export_module._runs_here(("cpu", "rocm")) == "no"
