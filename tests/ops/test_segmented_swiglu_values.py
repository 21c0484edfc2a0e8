"""segmented_swiglu against a per-row NumPy loop (values) and a gather-per-row JAX
formulation (gradients): the command runs each projection as one grouped product
(``jax.lax.ragged_dot``), which neither oracle uses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from tests.helpers import assert_close

ROWS, K, N, EXPERTS = 7, 4, 5, 3
# segments: (expert indices, rows per segment); an empty segment, a repeated expert,
# and (the last) rows past sum(counts), which give zeros
SEGMENTS = [
    ([2, 0, 1], [2, 0, 5]),
    ([1, 1, 0], [3, 2, 2]),
    ([0, 2], [4, 1]),
]


def _numpy(a, indices, counts, gate_w, up_w, route, clamp):
    out = np.zeros((ROWS, N), np.float64)
    a = np.broadcast_to(a, (ROWS, K)).astype(np.float64)
    row = 0
    for expert, count in zip(indices, counts):
        for r in range(row, row + count):
            gate = gate_w[expert].astype(np.float64) @ a[r]
            up = up_w[expert].astype(np.float64) @ a[r]
            if clamp > 0:
                gate, up = np.minimum(gate, clamp), np.clip(up, -clamp, clamp)
            out[r] = route[r] * up * gate / (1 + np.exp(-gate))
        row += count
    return out


def _gathered(a, indices, counts, gate_w, up_w, route):
    """The same with each row's expert weights gathered ([rows, n, k]), no clamp."""
    segment = np.repeat(np.arange(len(counts)), counts)
    expert = np.asarray(indices)[segment]
    x = jnp.broadcast_to(a, (ROWS, K))[: len(segment)]
    gate = jnp.einsum("rk,rnk->rn", x, gate_w[expert], precision="highest")
    up = jnp.einsum("rk,rnk->rn", x, up_w[expert], precision="highest")
    y = route[: len(segment), None] * up * jax.nn.silu(gate)
    return jnp.concatenate([y, jnp.zeros((ROWS - len(segment), N), y.dtype)])


@pytest.mark.parametrize(("indices", "counts"), SEGMENTS)
@pytest.mark.parametrize("clamp", [0.0, 1.5])
@pytest.mark.parametrize("a_rows", [ROWS, 1])
def test_values_match_a_per_row_loop(indices, counts, clamp, a_rows):
    rng = np.random.default_rng(sum(counts) + a_rows)
    a = rng.normal(size=(a_rows, K)).astype(np.float32)
    gate_w, up_w = (rng.normal(size=(EXPERTS, N, K)).astype(np.float32) for _ in range(2))
    route = rng.uniform(size=(ROWS,)).astype(np.float32)
    idx, cnt = np.array(indices, np.int32), np.array(counts, np.int32)
    got = ops.segmented_swiglu(clamp=clamp)(a, idx, cnt, gate_w, up_w, route)
    assert_close(got, _numpy(a, indices, counts, gate_w, up_w, route, clamp), 1e-5, 1e-5)


@pytest.mark.parametrize(("indices", "counts"), SEGMENTS)
def test_gradients_match_the_gathered_formulation(indices, counts):
    rng = np.random.default_rng(len(indices))
    a = jnp.asarray(rng.normal(size=(ROWS, K)), jnp.float32)
    gate_w, up_w = (jnp.asarray(rng.normal(size=(EXPERTS, N, K)), jnp.float32) for _ in "gu")
    route = jnp.asarray(rng.uniform(size=(ROWS,)), jnp.float32)
    idx, cnt = np.array(indices, np.int32), np.array(counts, np.int32)
    cot = jnp.asarray(rng.normal(size=(ROWS, N)), jnp.float32)
    cmd = ops.segmented_swiglu()

    def ours(a, g, u, r):
        return jnp.sum(cot * cmd(a, idx, cnt, g, u, r))

    def theirs(a, g, u, r):
        return jnp.sum(cot * _gathered(a, indices, counts, g, u, r))

    got = jax.grad(ours, argnums=(0, 1, 2, 3))(a, gate_w, up_w, route)
    want = jax.grad(theirs, argnums=(0, 1, 2, 3))(a, gate_w, up_w, route)
    for name, g, w in zip(("a", "gate_w", "up_w", "route_weight"), got, want):
        assert_close(g, w, 1e-5, 1e-5, what=name)
