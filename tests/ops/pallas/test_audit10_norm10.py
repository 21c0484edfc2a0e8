"""Audit 10 (norms): the Pallas layer_norm kernel's backward (interpret mode on CPU)
against float64 NumPy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.ops.pallas import layer_norm as layer_norm_kernel


def test_kernel_gradient_through_saved_inv_std_of_near_constant_rows() -> None:
    """As the reference backward's: ``-(g_inv inv_std**2 / n) xhat`` dropped the
    ``-mean(xhat)`` term, 0 in theory but not with a rounded mean; 3 everywhere ([4, 7],
    a ragged lane block) got dx = 1.08 (exact 0), near-constant rows were 0.92 off.
    Oracle: float64 NumPy, ``-inv_std**3 (x - mean) / n``."""
    rng = np.random.default_rng(0)
    near = (3 + 1e-6 * rng.standard_normal([4, 7])).astype(np.float32)
    x = np.concatenate([np.full([4, 7], 3.0, np.float32), near])
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    inv = 1 / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    want = -(inv**3) * (x64 - mu) / 7

    @jax.jit
    def both(x):
        outs, pull = jax.vjp(layer_norm_kernel.layer_norm, x)
        g_inv = jnp.ones_like(outs[2])
        (vjp,) = pull((jnp.zeros_like(x), jnp.zeros_like(outs[1]), g_inv))
        nnc = layer_norm_kernel.backward(
            (None, None, g_inv), (x,), outs, (0,), axes=(-1,), epsilon=1e-5
        )[0]
        return vjp, nnc

    for gx in both(jnp.asarray(x)):
        np.testing.assert_allclose(np.asarray(gx), want, rtol=0, atol=2e-3)
