from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

CASES = [
    Case(ops.rotate_half(), (rand([2, 3, 4], seed=1),), "rotate_half"),
    Case(ops.cmul(), (rand([2, 3, 4], seed=2), rand([3, 4], seed=3)), "cmul-broadcast"),
    Case(ops.cmul(), (rand([2, 6], seed=4), rand([2, 6], seed=5)), "cmul"),
    Case(
        ops.cmul(conjugate=True), (rand([2, 3, 4], seed=8), rand([3, 4], seed=9)), "cmul-conjugate"
    ),
    Case(ops.rmsnorm_cmul(), (rand([2, 3, 4], seed=6), rand([3, 4], seed=7)), "rmsnorm_cmul"),
    Case(
        ops.rmsnorm_cmul(epsilon=1e-5),
        (rand([2, 4], seed=8), rand([2, 4], seed=9), rand([4], seed=10, lo=0.5, hi=1.5)),
        "rmsnorm_cmul-affine",
    ),
]
