import numpy as np

from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

A, B = rand([2, 3, 4], lo=-3, hi=3, seed=1), rand([2, 3, 4], lo=-3, hi=3, seed=2)

CASES = [
    Case(ops.swish_mul(), (A, B), "swish_mul"),
    Case(ops.swish_mul(beta=1.5, scale=0.5), (A, B), "swish_mul-beta-scale"),
    # The clamp's kinks sit at +-2; the inputs keep away from them.
    Case(
        ops.swish_mul(clamp=2.0),
        (
            np.array([[-2.5, 0.3], [1.1, 2.6]], np.float32),
            np.array([[0.4, 2.4], [-1.0, 3.0]], np.float32),
        ),
        "swish_mul-clamp",
    ),
    Case(ops.swish_mul(), (A, B, rand([2, 3], seed=3)), "swish_mul-weighted"),
    Case(
        ops.swiglu(),
        (rand([2, 3, 4], seed=4), rand([5, 4], seed=5), rand([5, 4], seed=6)),
        "swiglu",
    ),
    Case(
        ops.segmented_swiglu(),
        (
            rand([5, 4], seed=7),
            np.array([2, 0, 1], np.int32),
            np.array([2, 0, 3], np.int32),
            rand([3, 6, 4], seed=8),
            rand([3, 6, 4], seed=9),
            rand([5], lo=0, hi=1, seed=10),
        ),
        "segmented_swiglu",
    ),
    Case(
        ops.rmsnorm_gated(),
        (rand([2, 4], seed=11), rand([2, 4], lo=-2, hi=2, seed=12)),
        "rmsnorm_gated",
    ),
    Case(
        ops.rmsnorm_gated(axes=(1, 2), epsilon=1e-5),
        (rand([2, 3, 4], seed=13), rand([2, 3, 4], seed=14), rand([3, 4], lo=0.5, hi=1.5, seed=15)),
        "rmsnorm_gated-affine",
    ),
]
