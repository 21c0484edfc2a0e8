import numpy as np

from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

i32 = np.int32

CASES = [
    Case(  # segments out of expert order, one expert twice, 1 row past the segments
        ops.segmented_gemm(),
        (
            rand([7, 3]),
            np.array([2, 0, 2], i32),
            np.array([2, 3, 1], i32),
            rand([3, 3, 4], seed=1),
        ),
        "segmented_gemm",
        sweep_float64=True,
    ),
    Case(
        ops.segmented_gemm(transpose_b=True),
        (
            rand([6, 3]),
            np.array([1, 0, -1], i32),  # NNC's unused group: -1, count 0
            np.array([4, 2, 0], i32),
            rand([2, 5, 3], seed=1),
            rand([2, 5], seed=2),
        ),
        "segmented_gemm-transpose_b-bias",
    ),
    Case(
        ops.moe_routing(kth=2, weight_scale=1.5),
        (rand([5, 4], lo=-2, hi=2), rand([4], seed=1), rand([5, 3], seed=2)),
        "moe_routing",
        numeric_float32=True,  # route_weights are float32 whatever the inputs, as in NNC
    ),
    Case(
        ops.moe_routing(kth=2, preselected=True),
        (rand([3, 4], lo=-2, hi=2), np.array([[3, 1], [1, 2], [0, 3]], i32), rand([3, 2], seed=2)),
        "moe_routing-preselected",
        numeric_float32=True,
    ),
    Case(
        ops.moe_routing(kth=3, compact_single_token=True),
        (rand([1, 5], lo=-2, hi=2), rand([5], seed=1), rand([1, 2], seed=2)),
        "moe_routing-one-token-compact",
        numeric_float32=True,
    ),
    Case(
        ops.comm_all_to_all(axis=1),
        (rand([2, 6]), rand([2, 6], seed=1), rand([2, 6], seed=2)),
        "comm_all_to_all",
        sweep_float64=True,
    ),
]
