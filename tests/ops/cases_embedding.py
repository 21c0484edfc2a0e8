import numpy as np

from fnnc import ops
from tests.helpers import rand, randint
from tests.ops.cases import Case

CASES = [
    Case(ops.embedding(), (rand([5, 3]), randint([2, 3], 5)), "embedding"),
    Case(
        ops.embedding(),
        (rand([4, 2]), np.array([1, 1, -1, 7, 2], np.int32)),
        "embedding-repeat-clamp",
    ),
]
