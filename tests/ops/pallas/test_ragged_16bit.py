"""Gradients of the masked (ragged) kernels for 16-bit inputs, in interpret mode.

The forwards of every kernel at ragged sizes in bfloat16 and float16 are checked by
``test_selection.py`` (``small_cases``); float32 forwards and gradients at ragged sizes
by each kernel's own tests. Here: ``jax.vjp`` through the custom_vjp and the
NNC-convention ``backward`` for 16-bit inputs, against the reference run in the same
dtype, to that dtype's precision. Few and small, as interpret mode is slow.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.ops.pallas import gemm, rms_norm, softmax_crossentropy
from tests.helpers import rand, randint
from tests.ops.pallas.checks import check_kernel

TOLERANCE = {jnp.bfloat16: 5e-2, np.float16: 5e-3}


def _cast(xs, dtype):
    return [x if np.issubdtype(x.dtype, np.integer) else jnp.asarray(x, dtype) for x in xs]


CASES = {
    "softmax_crossentropy_1001_classes": (
        softmax_crossentropy,
        ops.softmax_crossentropy(trim0=0.01, trim1=0.5),
        lambda: [rand((3, 1001), seed=1, lo=-4, hi=4), randint((3,), 1001, seed=2)],
        [0],
        jnp.bfloat16,
    ),
    "rms_norm_200_features": (
        rms_norm,
        ops.rms_norm(),
        lambda: [rand((3, 200), seed=3, lo=-2, hi=3), rand((200,), seed=4)],
        [0, 1],
        np.float16,
    ),
    "gemm_33x47x65": (
        gemm,
        ops.gemm(transpose_b=True),
        lambda: [rand((33, 65), seed=5), rand((47, 65), seed=6), rand((47,), seed=7)],
        [0, 1, 2],
        jnp.bfloat16,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_16_bit_gradients_at_ragged_sizes(name):
    module, cmd, make, diff, dtype = CASES[name]
    tol = TOLERANCE[dtype]
    check_kernel(module, cmd, _cast(make(), dtype), diff=diff, rtol=tol, atol=tol)
