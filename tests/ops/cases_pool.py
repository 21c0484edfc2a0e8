from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

# Uniform random inputs have no ties, so max pooling is differentiable at them and the
# finite-difference check stays on.
CASES = [
    Case(ops.max_pool(), (rand([2, 4, 4, 3]),), "max_pool"),
    Case(ops.max_pool(window=3, strides=2, padding="SAME"), (rand([1, 5, 5, 2]),), "max_pool-same"),
    Case(ops.max_pool(window=(3,), strides=(1,), padding=1), (rand([2, 6, 2]),), "max_pool-1d-pad"),
    Case(ops.avg_pool(), (rand([2, 4, 4, 3]),), "avg_pool"),
    Case(ops.avg_pool(window=3, strides=1, padding=1), (rand([1, 4, 4, 2]),), "avg_pool-pad"),
    Case(
        ops.avg_pool(window=(3, 2), strides=2, padding="SAME"),
        (rand([1, 5, 5, 1]),),
        "avg_pool-same",
    ),
    Case(ops.sum_pool(), (rand([2, 4, 4, 3]),), "sum_pool"),
    Case(ops.sum_pool(window=3, strides=1, padding="SAME"), (rand([1, 5, 4, 2]),), "sum_pool-same"),
]
