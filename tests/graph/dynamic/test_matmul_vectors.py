"""``@`` on dynamic-graph variables follows ``np.matmul``'s shapes for rank-1 operands.

gemm reads a rank-1 ``b`` as the row ``[1, n]`` (NNC's reading), so ``M @ v`` and
``v @ v`` raised a contraction error; they now give ``[m]`` and a scalar, as NumPy
does, with gradients equal to ``jax.grad`` of ``jnp.matmul``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc.graph import DynamicGraph

RNG = np.random.default_rng(0)
V = RNG.standard_normal(3).astype(np.float32)
SHAPES = {"matrix": (2, 3), "batched": (2, 4, 3), "vector": (3,)}


@pytest.mark.parametrize("left", list(SHAPES))
def test_a_rank_1_right_operand_is_a_column_as_in_numpy(left: str) -> None:
    a_np = RNG.standard_normal(SHAPES[left]).astype(np.float32)
    dg = DynamicGraph()
    a, v = dg.variable(a_np, name="a"), dg.variable(V, name="v")
    out = a @ v
    want = a_np @ V
    assert out.shape == want.shape
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    da, dv = dg.backward(out.sum() if out.ndim else out, [a, v])
    ga, gv = jax.grad(lambda x, y: jnp.sum(jnp.matmul(x, y)), argnums=(0, 1))(a_np, V)
    np.testing.assert_allclose(da.numpy(), ga, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dv.numpy(), gv, rtol=1e-5, atol=1e-6)


def test_an_array_on_the_left_of_a_vector_variable_is_numpys_matmul() -> None:
    m = RNG.standard_normal((2, 3)).astype(np.float32)
    dg = DynamicGraph()
    out = m @ dg.variable(V)
    np.testing.assert_allclose(out.numpy(), m @ V, rtol=1e-5, atol=1e-6)
