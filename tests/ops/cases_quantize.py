from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

CASES = [
    # Straight-through: the finite-difference slope of a rounding is 0 or a jump.
    Case(
        ops.conform_data_format(preserved_tail=2),
        (rand([2, 66], lo=-3, hi=3, seed=1),),
        "conform_data_format",
        numeric=False,
    ),
    Case(
        ops.walsh_hadamard_transform(scale=0.5), (rand([3, 4], seed=2),), "walsh_hadamard_transform"
    ),
    Case(
        ops.walsh_hadamard_transform(scale=8**-0.5),
        (rand([2, 2, 8], seed=3),),
        "walsh_hadamard_transform-8",
    ),
]
