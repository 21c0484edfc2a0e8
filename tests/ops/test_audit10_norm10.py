"""Audit 10 (norms): the NNC backwards of the normalisation commands against float64
NumPy closed forms."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError

RNG = np.random.default_rng(0)
# Near-constant rows: x - mean is ~1e-6, where float32's mean of 7 threes (3.0000002)
# is off by as much; inv_std ~ 316, so inv_std**2 amplifies any offset 1e5 times.
NEAR = (3 + 1e-6 * RNG.standard_normal([4, 7])).astype(np.float32)
CONST = np.full([4, 7], 3.0, np.float32)


def _d_inv_std(x, axis):
    """float64 gradient of a cotangent of ones on inv_std = 1 / sqrt(var + 1e-5):
    ``-inv_std**3 (x - mean) / n``."""
    x = x.astype(np.float64)
    mu = x.mean(axis, keepdims=True)
    inv = 1 / np.sqrt(((x - mu) ** 2).mean(axis, keepdims=True) + 1e-5)
    return -(inv**3) * (x - mu) / x.shape[axis]


def _backward(cmd, grads, inputs):
    outs = cmd(*inputs)
    grads = [np.zeros(o.shape, o.dtype) if g is None else g(o) for g, o in zip(grads, outs)]
    return np.asarray(cmd.definition.backward(tuple(grads), inputs, outs, **cmd.kwargs)[0])


ONES = lambda o: np.ones(o.shape, o.dtype)


@pytest.mark.parametrize("x", [CONST, NEAR], ids=["constant", "near_constant"])
def test_gradient_through_saved_inv_std_of_near_constant_rows(x) -> None:
    """The closed form ``-(g_inv inv_std**2 / n) xhat`` dropped the ``-mean(xhat)`` term,
    exactly 0 in theory but not with a rounded mean: 3 everywhere got dx = 1.08 (exact
    0), near-constant rows were off by 0.92. Oracle: float64 NumPy."""
    want = _d_inv_std(x, -1)
    got = {
        "layer_norm": _backward(ops.layer_norm(axes=(-1,)), (None, None, ONES), (x,)),
        "group_norm": _backward(
            ops.group_norm(groups=1, axis=-1, reduce_axes=None),
            (None, None, ONES),
            (x[..., None],),
        )[..., 0],
    }
    c = np.ones([4], np.float32)
    # batch_norm reduces axis 0: the transposed rows, a cotangent on saved_inv_std
    got["batch_norm"] = _backward(
        ops.batch_norm(axes=(0,)), (None, None, None, None, ONES), (x.T.copy(), c, 0 * c, 0 * c, c)
    ).T
    for name, gx in got.items():
        np.testing.assert_allclose(gx, want, rtol=0, atol=2e-3, err_msg=name)


def test_group_norm_groups_must_be_a_whole_number() -> None:
    """groups=2.0 passed ``c % groups`` and reached jnp.reshape as a bare TypeError, and
    groups=True (4 % True == 0) normalised as one group silently: a whole float is now
    the int it names and a bool or a fraction a CommandError. Oracle: NumPy."""
    x = RNG.standard_normal([2, 3, 4]).astype(np.float32)
    y = np.asarray(ops.group_norm(groups=2.0)(x)[0], np.float64)
    xs = x.astype(np.float64).reshape(2, 3, 2, 2)  # reduce_axes=(): per position and group
    mu, var = xs.mean(-1, keepdims=True), xs.var(-1, keepdims=True)
    np.testing.assert_allclose(y, ((xs - mu) / np.sqrt(var + 1e-5)).reshape(x.shape), atol=1e-5)
    for groups in (True, 2.5):
        with pytest.raises(CommandError, match=rf"group_norm: groups must be an int, got {groups}"):
            ops.group_norm(groups=groups)(x)
