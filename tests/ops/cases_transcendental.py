import numpy as np

from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

X = rand([3, 4], lo=-3, hi=3)
# Magnitudes well away from the floor: the clamp's kink is not differentiable.
SIGNED = np.array([[-4.0, -0.5, 0.3, 2.0], [0.05, -0.08, 0.7, -1.5]], np.float32)
# Below the floor (and zeros): the slope is 0; a finite difference would cross the sign jump.
TINY = np.array([0.0, -0.0, 1e-8, -1e-8, 2e-6, -3e-6], np.float32)

CASES = [
    Case(ops.ewsin(), (X,), "ewsin"),
    Case(ops.ewcos(), (X,), "ewcos"),
    Case(
        ops.ewpow(), (rand([3, 4], lo=0.5, hi=2, seed=1), rand([4], lo=-2, hi=2.5, seed=2)), "ewpow"
    ),
    Case(
        ops.ewpow(), (rand([2, 3], lo=0.5, hi=2, seed=3), np.float32(2.5)), "ewpow-scalar-exponent"
    ),
    Case(ops.signed_sqrt(), (SIGNED,), "signed_sqrt"),
    Case(ops.signed_sqrt(), (TINY,), "signed_sqrt-floor-region", numeric=False),
    Case(
        ops.signed_sqrt(floor=0.25),
        (np.array([-4, -0.3, 0.5, 4], np.float32),),
        "signed_sqrt-floor",
    ),
    Case(ops.reduce_logsumexp(axes=(1,)), (X,), "reduce_logsumexp"),
    Case(
        ops.reduce_logsumexp(axes=(0, 2)),
        (rand([2, 3, 2], lo=-5, hi=5, seed=4),),
        "reduce_logsumexp-axes",
    ),
    Case(
        ops.fill_if_less_than(value=-1e4),
        (X, rand([3, 1], seed=5), rand([4], seed=6)),
        "fill_if_less_than",
        grad_inputs=(0,),
    ),
]
