import numpy as np

from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

TIED = np.array([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]], np.float32)

CASES = [
    Case(ops.ewsum(), (rand([2, 3]), rand([2, 3], seed=1), rand([1, 3], seed=2)), "ewsum-bcast"),
    Case(ops.ewprod(), (rand([2, 3]), rand([2, 1], seed=1)), "ewprod"),
    Case(ops.ewdiv(), (rand([2, 3]), rand([1, 3], seed=1, lo=0.5, hi=2.0)), "ewdiv"),
    Case(ops.ewexp(), (rand([4]),), "ewexp"),
    Case(ops.ewlog(), (rand([4], lo=0.5, hi=2.0),), "ewlog"),
    Case(ops.ewsqrt(), (rand([4], lo=0.5, hi=2.0),), "ewsqrt"),
    Case(ops.ewabs(), (rand([5], seed=3),), "ewabs"),
    Case(ops.ewrsqrt(), (rand([4], lo=0.5, hi=2.0),), "ewrsqrt"),
    Case(ops.ewexpm1(), (rand([4]),), "ewexpm1"),
    Case(ops.ewlog1p(), (rand([4], lo=-0.5, hi=2.0),), "ewlog1p"),
    Case(ops.ewerf(), (rand([4]),), "ewerf"),
    Case(ops.ewerfc(), (rand([4]),), "ewerfc"),
    Case(ops.clamp(min=-0.5, max=0.5), (rand([3, 3]),), "clamp"),
    Case(ops.clamp(min=0.0), (rand([3, 3], seed=4),), "clamp-min"),
    Case(ops.min(), (rand([2, 3]), rand([2, 3], seed=1)), "min"),
    Case(ops.max(), (rand([2, 3]), rand([1, 3], seed=1)), "max-bcast"),
    Case(ops.max(ties="split"), (rand([2, 3]), rand([1, 3], seed=1)), "max-split-bcast"),
    # ties, so no finite differences: the backward against jax.vjp of the reference
    Case(ops.min(ties="split"), (TIED, TIED[::-1].copy()), "min-split-ties", numeric=False),
    Case(ops.max(), (TIED, TIED[::-1].copy()), "max-ties", numeric=False),
    Case(ops.stop_gradient(), (rand([2, 3]),), "stop_gradient"),
    Case(ops.select(), (rand([2, 3], seed=5) > 0, rand([2, 3]), rand([2, 3], seed=1)), "select"),
]
