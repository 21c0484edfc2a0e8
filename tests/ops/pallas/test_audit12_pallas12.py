"""Audit 12 of the Pallas kernels (interpret mode on CPU), each against an independent oracle."""

import jax
import jax.numpy as jnp
import numpy as np

from fnnc import ops
from fnnc.graph import GraphBuilder
from fnnc.ops.pallas import fused_elementwise as fused_kernel


def test_16_bit_broadcast_operand_gradients_are_rounded_once_after_the_partial_sums():
    """A bfloat16 chain x * row * col * scalar over [32, 16] runs two row programs. The
    backward kernel rounded each program's partial sum of the row and scalar gradients
    to bfloat16 before adding them: partials near +160 and -160 (one bfloat16 ulp is 1)
    gave a scalar gradient of -16 for -12.03 and row gradients 0.875 off. Now the
    partials stay float32 and each gradient is rounded once (float64 NumPy oracle)."""
    bf16 = jnp.bfloat16
    b = GraphBuilder()
    x, row, col, s = (
        b.input((32, 16), bf16),
        b.input((16,), bf16),
        b.input((32, 1), bf16),
        b.input((), bf16),
    )
    body = b.build([b.exec(ops.ewprod(), x, row, col, s)])
    rng = np.random.default_rng(0)
    halves = (10 + rng.standard_normal((16, 16)), -10 + rng.standard_normal((16, 16)))
    args = (
        jnp.asarray(np.concatenate(halves), bf16),
        jnp.ones((16,), bf16),
        jnp.ones((32, 1), bf16),
        jnp.asarray(1.0, bf16),
    )
    ct = jnp.ones((32, 16), bf16)

    @jax.jit
    def grads(*xs):
        pull = jax.vjp(lambda *z: fused_kernel.fused_elementwise(*z, body=body), *xs)[1]
        nnc = fused_kernel.backward((ct,), xs, (None,), (0, 1, 2, 3), body=body)
        return pull(ct), nnc

    x64 = np.asarray(args[0], np.float64)  # the other operands and ct are ones
    want = {1: x64.sum(0), 2: x64.sum(1, keepdims=True), 3: x64.sum()}
    for got in grads(*args):
        for i, w in want.items():
            g = np.asarray(got[i], np.float64)
            assert g.shape == np.shape(w) and g.dtype == np.float64
            assert got[i].dtype == bf16
            # one bfloat16 rounding of the exact sum: within 2**-8 of it
            np.testing.assert_array_less(np.abs(g - w), np.abs(w) * 2.0**-8 + 1e-6)
