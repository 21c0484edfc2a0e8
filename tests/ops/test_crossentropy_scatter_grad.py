"""softmax_crossentropy's backward (``softmax - targets`` as a scatter for class
indices) against ``jax.grad`` of its forward, for every kind of label it accepts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops

C = 5


def _labels(kind: str, shape: tuple[int, ...]):
    rng = np.random.default_rng(3)
    if kind == "int":
        return rng.integers(0, C, shape[:-1]).astype(np.int32)
    if kind == "int_col":  # [..., 1]
        return rng.integers(0, C, (*shape[:-1], 1)).astype(np.int32)
    if kind == "out_of_range":  # -1 and C hit no class: targets all trim0
        lab = rng.integers(0, C, shape[:-1]).astype(np.int32)
        lab.reshape(-1)[:2] = (-1, C)
        return lab
    if kind == "float_index":  # NNC rounds float labels: (int)(label + 0.5)
        return rng.integers(0, C, shape[:-1]).astype(np.float32) + 0.3
    return jax.nn.softmax(rng.normal(size=shape)).astype(np.float32)  # per-class targets


@pytest.mark.parametrize("kind", ["int", "int_col", "out_of_range", "float_index", "targets"])
@pytest.mark.parametrize("trim", [(0.0, 1.0), (0.02, 0.92)])
@pytest.mark.parametrize("shape", [(6, C), (2, 3, C)])
def test_backward_is_jax_grad_of_the_forward(kind, trim, shape):
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    label = _labels(kind, shape)
    g_loss = np.random.default_rng(1).normal(size=(*shape[:-1], 1)).astype(np.float32)
    cmd = ops.softmax_crossentropy(trim0=trim[0], trim1=trim[1])

    def loss(x):
        out, _ = cmd(x, jnp.asarray(label))
        return jnp.sum(out * g_loss)

    want = jax.grad(loss)(x)
    out, p = cmd(x, jnp.asarray(label))
    got = cmd.definition.backward((g_loss, None), (x, label), (out, p), **cmd.kwargs)[0]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
