"""Audit 8 of mixed precision in models: ``precision=`` takes dtypes as it takes their
names (``np.dtype("float16")`` had been taken, ``np.float16`` and ``jnp.bfloat16``
refused). Oracle: the same model compiled with the name, step for step."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.errors import ModelError
from fnnc.models import Dense, Input, Model


def _fitted(precision):
    x = Input()
    model = Model(x, Dense(2, name="fc")(x))
    xs = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    ys = np.linspace(0, 1, 8, dtype=np.float32).reshape(4, 2)
    model.compile(xs, loss="mse", minimizer=optax.sgd(0.1), precision=precision)
    model.set_parameters({"t-fc-0-0": np.full((2, 3), 0.3, np.float32)})
    losses = [float(model.fit(xs, ys)) for _ in range(2)]
    return model, losses


@pytest.mark.parametrize(
    "dtype,name",
    [(jnp.bfloat16, "bfloat16"), (np.float16, "float16"), (np.dtype("float16"), "float16")],
)
def test_precision_takes_a_dtype_as_its_name(dtype, name):
    by_dtype, losses = _fitted(dtype)
    by_name, want = _fitted(name)
    assert by_dtype.engine.precision.dtype == name  # stored as the name
    assert by_dtype.loss_scale == by_name.loss_scale  # float16: the default scaling
    assert losses == want
    np.testing.assert_array_equal(
        by_dtype.parameters()["t-fc-0-0"], by_name.parameters()["t-fc-0-0"]
    )


def test_float32_as_a_dtype_is_no_cast_and_other_names_are_refused():
    model, _ = _fitted(np.float32)
    assert model.engine.precision is None and model.loss_scale is None
    for bad in ("bf16", np.int8, 3):
        with pytest.raises(ModelError, match="expected 'float32', 'bfloat16' or 'float16'"):
            _fitted(bad)


def test_a_loss_function_computes_in_float32_under_a_float16_policy():
    """A loss written as jnp code squared float16 errors of 300 (past float16's 65504):
    every loss was inf and every step skipped. The loss now computes in float32, as the
    named "mse" does: the same losses and parameters, and NumPy's loss of the outputs."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((8, 4)).astype(np.float32)
    Y = (rng.standard_normal((8, 2)) * 300).astype(np.float32)
    runs = []
    for loss in ("mse", lambda o, t: jnp.mean((o[0] - t[0]) ** 2)):
        x = Input()
        m = Model(x, Dense(2, name="fc")(x))
        m.compile(X, loss=loss, minimizer=optax.sgd(1e-4), precision="float16")
        first = np.asarray(m.evaluate(X), np.float64)  # the float16 outputs, as fit sees them
        start = {k: np.array(v) for k, v in m.parameters().items()}
        runs.append(([float(m.fit(X, Y)) for _ in range(8)], m.parameters(), first, start))
    (mse, p_mse, out, start), (fn, p_fn, _, _) = runs
    assert np.all(np.isfinite(fn))
    np.testing.assert_allclose(fn, mse, rtol=1e-5)
    np.testing.assert_allclose(fn[0], np.mean((out - Y) ** 2), rtol=1e-5)
    for k in p_mse:  # the scale backs off past the first steps, then both train alike
        assert not np.allclose(p_fn[k], start[k])
        np.testing.assert_allclose(p_fn[k], p_mse[k], rtol=1e-4, atol=1e-6)
