"""What a command takes besides the canonical form: one int for an ``axes`` parameter
(NumPy's ``axis=1``), and a typed PRNG key (``jax.random.key``) where a random command
takes NNC's raw key bits, in eager calls as in graphs; nested lists in eager calls, as
NumPy takes them."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import DTypeError

X = np.arange(6, dtype=np.float32).reshape(2, 3)


@pytest.mark.parametrize(
    ("make", "oracle"),
    [
        (lambda a: ops.reduce_sum(axes=a), lambda x: x.sum(axis=1, keepdims=True)),
        (lambda a: ops.reduce_max(axes=a), lambda x: x.max(axis=1, keepdims=True)),
        (
            lambda a: ops.layer_norm(axes=a),
            lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5),
        ),
    ],
)
def test_one_int_axes_is_the_one_axis_tuple(make, oracle):
    """``axes=1`` makes the same command as ``axes=(1,)`` and computes NumPy's answer."""
    axis = 1 if make(1).name.startswith("reduce") else -1
    assert make(axis) == make((axis,))
    out = make(axis)(X)
    out = out[0] if isinstance(out, tuple) else out
    np.testing.assert_allclose(out, oracle(X), rtol=1e-5, atol=1e-6)


def test_bool_axes_is_not_an_axis():
    """``True`` is not an axis: it stays as given and the rule refuses it by name."""
    with pytest.raises(Exception, match="reduce_sum"):
        ops.reduce_sum(axes=True)(X)


def test_typed_key_equals_its_key_data_in_eager_random_commands():
    """dropout and random_uniform give the same draws for a typed key and its bits."""
    key = jax.random.key(7)
    bits = jax.random.key_data(key)
    x = np.ones((16,), np.float32)
    for cmd, args in ((ops.dropout(p=0.5), (x,)), (ops.random_uniform(shape=(5,)), ())):
        typed = jax.tree.leaves(cmd(*args, key))
        raw = jax.tree.leaves(cmd(*args, bits))
        for a, b in zip(typed, raw, strict=True):
            np.testing.assert_array_equal(a, b)


def test_eager_calls_take_nested_lists_as_arrays():
    """A list is the array NumPy makes of it (it reached the compiled forward as a list:
    JAX's tracer conversion error, or ``'list' object has no attribute 'ndim'``)."""
    np.testing.assert_array_equal(np.asarray(ops.relu()([1.0, -2.0])), [1.0, 0.0])
    w = np.ones((3, 2), np.float32)
    got = ops.gemm(transpose_b=True)([[1.0, 2.0]], w)
    np.testing.assert_array_equal(np.asarray(got), [[3.0, 3.0, 3.0]])
    with pytest.raises(DTypeError, match="input 0 is a object, expected an array"):
        ops.relu()(object())
