from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

CASES = [
    Case(
        ops.gated_delta(),
        (
            rand([1, 3, 1, 2]),
            rand([1, 3, 1, 2], seed=1),
            rand([1, 3, 2, 3], seed=2),
            rand([1, 3, 2], seed=3, lo=-0.5, hi=0.0),
            rand([1, 3, 2], seed=4, lo=0.1, hi=0.9),
            rand([1, 2, 3, 2], seed=5),
        ),
        "gated_delta-gqa",
    ),
    Case(
        ops.gated_delta(log_decay_input=False),
        (
            rand([2, 2, 1, 2]),
            rand([2, 2, 1, 2], seed=1),
            rand([2, 2, 1, 2], seed=2),
            rand([2, 2, 1], seed=3, lo=0.5, hi=1.0),
            rand([2, 2, 1], seed=4, lo=0.1, hi=0.9),
            rand([2, 1, 2, 2], seed=5),
        ),
        "gated_delta-decay",
    ),
    Case(
        ops.hyper_connection(count=2, sinkhorn_iterations=3),
        (rand([3, 8]), rand([3], seed=1), rand([8], seed=2)),
        "hyper_connection-split",
    ),
    Case(
        ops.hyper_connection(count=2, sinkhorn_iterations=2),
        (rand([2, 8]), rand([3], seed=1), rand([8], seed=2), rand([2, 2, 3], seed=3)),
        "hyper_connection-split-residual",
    ),
    Case(
        ops.hyper_connection(mode="expand", count=2),
        (rand([2, 3]), rand([2, 2, 3], seed=1), rand([2, 2], seed=2), rand([2, 4], seed=3)),
        "hyper_connection-expand",
    ),
]

CASES.append(
    Case(  # NNC's reverse state checkpoints: the last two states, final first
        ops.gated_delta(state_checkpoint_count=1),
        (
            rand([1, 2, 1, 2]),
            rand([1, 2, 1, 2], seed=1),
            rand([1, 2, 1, 2], seed=2),
            rand([1, 2, 1], seed=3, lo=-0.5, hi=0.0),
            rand([1, 2, 1], seed=4, lo=0.1, hi=0.9),
            rand([1, 1, 2, 2], seed=5),
        ),
        "gated_delta-checkpoints",
    )
)
