from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

CASES = [
    Case(ops.gemm(), (rand([3, 4]), rand([4, 5], seed=1)), "gemm"),
    Case(
        ops.gemm(transpose_b=True),
        (rand([3, 4]), rand([5, 4], seed=1), rand([5], seed=2)),
        "gemm-dense",
    ),
    Case(ops.gemm(transpose_a=True), (rand([2, 4, 3]), rand([4, 5], seed=1)), "gemm-batch-ta"),
    # NNC's vectors: a rank-1 operand is a row [1, k]; a vector a gives a vector.
    Case(ops.gemm(), (rand([2]), rand([2, 3], seed=1)), "gemm-vector-a"),
    Case(
        ops.gemm(transpose_b=True),
        (rand([3]), rand([4, 3], seed=1), rand([4], seed=2)),
        "gemm-dense-vector",
    ),
    Case(ops.gemm(), (rand([3, 1]), rand([4], seed=1), rand([1, 4], seed=2)), "gemm-vector-b"),
    Case(ops.gemm(), (rand([2]), rand([3, 2, 4], seed=1)), "gemm-vector-a-batch-b"),
    Case(ops.add(p=2.0, q=-1.0), (rand([2, 3]), rand([1, 3], seed=1)), "add"),
    Case(ops.mul(p=0.5), (rand([2, 3]), rand([2, 3], seed=1)), "mul"),
    Case(ops.scalar_mul(a=-3.0), (rand([2, 3]),), "scalar_mul"),
]
