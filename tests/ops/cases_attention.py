from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

sdpa = ops.scaled_dot_product_attention

CASES = [
    Case(
        sdpa(), (rand([2, 3, 2, 4]), rand([2, 5, 2, 4], seed=1), rand([2, 5, 2, 3], seed=2)), "sdpa"
    ),
    Case(
        sdpa(is_causal=True),
        (rand([1, 2, 2, 3]), rand([1, 4, 2, 3], seed=1), rand([1, 4, 2, 3], seed=2)),
        "sdpa-causal-s<t",
    ),
    Case(
        sdpa(is_causal=True),  # queries 0 and 1 attend no key: zero rows
        (rand([1, 4, 1, 3]), rand([1, 2, 1, 3], seed=1), rand([1, 2, 1, 3], seed=2)),
        "sdpa-causal-s>t",
    ),
    Case(
        sdpa(is_causal=True),  # head size 16: the smallest the Pallas kernel takes
        (rand([1, 3, 2, 16]), rand([1, 5, 2, 16], seed=1), rand([1, 5, 2, 16], seed=2)),
        "sdpa-causal-d16",
    ),
    Case(
        sdpa(scale=0.5),
        (
            rand([2, 3, 2, 4]),
            rand([2, 4, 2, 4], seed=1),
            rand([2, 4, 2, 2], seed=2),
            rand([2, 1, 3, 4], seed=3) > -0.5,
        ),
        "sdpa-bool-mask",
    ),
    Case(
        sdpa(is_causal=True),
        (
            rand([1, 3, 4, 2]),
            rand([1, 3, 2, 2], seed=1),
            rand([1, 3, 2, 2], seed=2),
            rand([3, 3], seed=3),
        ),
        "sdpa-gqa-float-mask-causal",
    ),
    Case(  # NNC's unify head: the joined heads [B, S, H * Dv] @ weights^T + bias
        sdpa(is_causal=True),
        (
            rand([2, 3, 2, 4]),
            rand([2, 4, 2, 4], seed=1),
            rand([2, 4, 2, 3], seed=2),
            rand([2, 1, 3, 4], seed=3),
            rand([5, 6], seed=4),
            rand([5], seed=5),
        ),
        "sdpa-unify-head",
    ),
    Case(
        sdpa(),
        (
            rand([1, 2, 4, 3]),
            rand([1, 3, 2, 3], seed=1),
            rand([1, 3, 2, 2], seed=2),
            rand([1, 3], seed=3) > -0.5,
            rand([8, 8], seed=4),
        ),
        "sdpa-unify-head-gqa-no-bias",
    ),
]
