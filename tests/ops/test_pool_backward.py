"""max_pool on CPU (strided views; masks and pads) equals XLA's reduce_window and
select_and_scatter.

The rule replays ``SelectAndScatter``'s scan (select ``>=``): ties go to the first
maximum in row-major window order, NaN and -inf behave as there, padded cells take part
as -inf. Non-overlapping windows match bit for bit; overlapping ones up to the order in
which a cell's contributions are summed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.ops import pool

CASES = {
    "2x2": ((2, 6, 6, 3), dict(), True),
    "2x2-odd": ((2, 7, 5, 3), dict(), True),
    "3x3-s2-pad": ((2, 7, 7, 3), dict(window=3, strides=2, padding=1), False),
    "same-3x2": ((2, 8, 5, 2), dict(window=(3, 2), strides=(2, 1), padding="SAME"), False),
    "1d-valid": ((2, 9, 3), dict(window=3, strides=2, padding="VALID"), True),
    "3d-pad": ((1, 4, 5, 6, 2), dict(window=2, strides=2, padding=((1, 0), (0, 1), (1, 1))), True),
}


def _values(shape, mode, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    if mode == "ties":
        x = np.round(x).clip(-1, 1)
    elif mode == "nan-inf":
        x[rng.random(shape) < 0.2] = np.nan
        x[rng.random(shape) < 0.2] = -np.inf
    return jnp.asarray(x)


@pytest.mark.parametrize("mode", ["random", "ties", "nan-inf"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_select_and_scatter(case, mode):
    shape, params, exact = CASES[case]
    cmd = ops.max_pool(**params)
    kw = cmd.kwargs
    x = _values(shape, mode)
    y = cmd(x)
    g = jnp.asarray(np.random.default_rng(1).standard_normal(y.shape).astype(np.float32))
    k, s, pads, _ = pool._geometry("max_pool", x, kw["window"], kw["strides"], kw["padding"])
    want = jax.vjp(lambda x: pool._reduce(x, -jnp.inf, jax.lax.max, k, s, pads), x)[1](g)[0]
    got = jax.jit(lambda g, x: pool.max_pool.definition.backward((g,), (x,), (None,), **kw))(g, x)[
        0
    ]
    reduced = pool._reduce(x, -jnp.inf, jax.lax.max, k, s, pads)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(reduced))
    if exact:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    else:
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
