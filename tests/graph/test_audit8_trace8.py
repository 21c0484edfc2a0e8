"""Audit 8 (trace): regressions found by using trace as a demanding user would.

Oracles: JAX's own error types and values (jnp code that the hint recommends).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc.errors import TraceError
from fnnc.graph import interpret, trace


def test_numpy_on_a_traced_array_gets_the_jax_numpy_hint_not_the_static_one() -> None:
    """np.sin(x) inside fn raised TracerArrayConversionError, which trace reported as
    "needs an argument as a concrete Python value (a shape, a jit static argument, a
    Python if)" with functools.partial(fn, n=...): binding x does not help, jnp does."""
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    with pytest.raises(TraceError) as e:
        trace(lambda x: np.sin(x) * 2, x)
    said = str(e.value)
    assert "NumPy" in said and "jax.numpy" in said and "jnp.sin" in said
    assert "a Python if" not in said and "JAX said: TracerArrayConversionError" in said
    assert isinstance(e.value.__cause__, jax.errors.TracerArrayConversionError)
    graph = trace(lambda x: jnp.sin(x) * 2, x)  # what the hint says works
    np.testing.assert_allclose(interpret(graph, x), np.sin(x.astype(np.float64)) * 2, rtol=1e-6)


def test_numpy_on_a_python_number_argument_names_it_and_binding_works() -> None:
    x = np.ones((2, 3), np.float32)

    def fn(x, n):
        return x * np.asarray(n).sum()

    with pytest.raises(TraceError, match=r"functools\.partial\(fn, n=") as e:
        trace(fn, x, 3)
    assert "Python numbers here: n" in str(e.value) and "jax.numpy" in str(e.value)
    graph = trace(functools.partial(fn, n=3), x)
    np.testing.assert_allclose(interpret(graph, x), np.full((2, 3), 3.0))
