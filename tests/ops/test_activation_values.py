"""Activations against NumPy closed forms, and their error messages."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import DTypeError, ShapeError
from tests.helpers import assert_close, rand, randint


def test_activations_closed_forms() -> None:
    x = rand([7], lo=-3, hi=3).astype(np.float64)
    erf = np.vectorize(math.erf)
    sig = 1 / (1 + np.exp(-x))
    sp = np.log1p(np.exp(x))
    want = {
        ops.relu(): np.maximum(x, 0),
        ops.leaky_relu(negative_slope=0.1): np.where(x > 0, x, 0.1 * x),
        ops.sigmoid(): sig,
        ops.swish(): x * sig,
        ops.gelu(): 0.5 * x * (1 + erf(x / math.sqrt(2))),
        ops.gelu(approximate=True): 0.5
        * x
        * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
        ops.mish(): x * np.tanh(sp),
        ops.softmax(): np.exp(x) / np.exp(x).sum(),
        ops.log_softmax(): x - np.log(np.exp(x).sum()),
    }
    for cmd, w in want.items():
        assert_close(cmd(x.astype(np.float32)), w, rtol=1e-5, atol=1e-6, what=str(cmd))


def test_softmax_backward_reads_only_the_output() -> None:
    x = rand([2, 3])
    y = ops.softmax()(x)
    g = rand([2, 3], seed=1)
    spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
    (got,) = ops.softmax.definition.backward((g,), (spec,), (y,), axis=-1)
    _, pull = jax.vjp(jax.nn.softmax, x)
    assert_close(got, pull(g)[0], rtol=1e-5)


@pytest.mark.parametrize(
    "cmd, inputs, error, match",
    [
        (ops.softmax(axis=2), (rand([2, 2]),), ShapeError, "out of range"),
        (ops.relu(), (randint([3], 4),), DTypeError, "floating-point"),
    ],
)
def test_bad_inputs_raise_clear_errors(cmd, inputs, error, match) -> None:
    with pytest.raises(error, match=match):
        cmd(*inputs)
