"""NNC's null output gradient: a backward kernel given none (``inputs[0] == 0``) takes
ones, the complex unit for CMUL, as the command's own derivative. fnnc's backwards take
``None`` so; a two-output loss only when neither output has one (a graph's backward
gives ``None`` for an output no gradient reaches, which adds nothing)."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops

F32 = np.float32
X = np.array([[10, -1, -5, 2], [12, 4, 5, -3]], F32)
Y = np.array([[1, 0, 0, 1], [1, 1, 0, 0]], F32)
P = 1 / (1 + np.exp(-X))
LABELS = np.array([2, 1], np.int32)
UNIT = np.tile(np.array([1, 0], F32), (2, 2))  # complex ones: (1, 0) pairs

CASES = {
    "add": (ops.add(p=2.0, q=3.0), (X, Y), np.ones((2, 4), F32)),
    "mul": (ops.mul(p=2.0), (X, Y), np.ones((2, 4), F32)),
    "min": (ops.min(), (X, Y), np.ones((2, 4), F32)),
    "max": (ops.max(), (X, Y), np.ones((2, 4), F32)),
    "cmul": (ops.cmul(), (X, Y), UNIT),
    "cmul-conjugate": (ops.cmul(conjugate=True), (X, Y), UNIT),
    "binary_crossentropy": (ops.binary_crossentropy(), (P, Y), np.ones((2, 1), F32)),
    "categorical_crossentropy": (ops.categorical_crossentropy(), (P, LABELS), np.ones((2, 1), F32)),
    "sigmoid_binary_crossentropy": (
        ops.sigmoid_binary_crossentropy(),
        (X, Y),
        np.ones((2, 1), F32),
    ),
    "softmax_crossentropy": (ops.softmax_crossentropy(), (X, LABELS), np.ones((2, 1), F32)),
}


@pytest.mark.parametrize("name", CASES)
def test_a_null_output_gradient_is_the_commands_own_derivative(name):
    cmd, inputs, ones = CASES[name]
    outputs = cmd(*inputs)
    outputs = tuple(outputs) if isinstance(outputs, tuple) else (outputs,)
    rest = (None,) * (len(outputs) - 1)
    backward = cmd.definition.backward
    got = backward((None, *rest), inputs, outputs, **cmd.kwargs)
    want = backward((ones, *rest), inputs, outputs, **cmd.kwargs)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if g is not None:
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_nnc_conjugating_cmul_with_a_null_gradient():
    """complex.tests.c, "conjugating cmul computes asymmetric gradients": z = a conj(b)
    and no output gradient give dA = b and dB = a."""
    a = np.array([5, 6, 7, -8, -2, 0.5, 0.25, 3], F32)
    b = np.array([-4, 3, 2, 9, 1.5, -2, 7, 0.125], F32)
    cmd = ops.cmul(conjugate=True)
    da, db = cmd.definition.backward((None,), (a, b), (None,), **cmd.kwargs)
    np.testing.assert_array_equal(np.asarray(da), b)
    np.testing.assert_array_equal(np.asarray(db), a)
    plain = ops.cmul()
    da, db = plain.definition.backward((None,), (a, b), (None,), **plain.kwargs)
    conj = np.array([1, -1] * 4, F32)
    np.testing.assert_array_equal(np.asarray(da), b * conj)  # conj(b)
    np.testing.assert_array_equal(np.asarray(db), a * conj)
