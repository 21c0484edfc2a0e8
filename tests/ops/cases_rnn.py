from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

# One case: the scan compiles slowly; lstm without bias is checked in test_rnn_values.py.
CASES = [
    Case(
        ops.lstm(),
        (
            rand([2, 3, 3]),
            rand([2, 2], seed=1),
            rand([2, 2], seed=2),
            rand([8, 3], seed=3),
            rand([8, 2], seed=4),
            rand([8], seed=5),
        ),
        "lstm",
    ),
]


def _stack(shapes, seed):
    return tuple(rand(s, seed=seed + i, lo=-0.5, hi=0.5) for i, s in enumerate(shapes))


CASES.append(
    Case(  # 2 layers, bidirectional, projected (LSTMP): [w_ih, w_hh, bias, w_hr] per unit
        ops.lstm(num_layers=2, bidirectional=True, proj_size=2),
        (
            rand([2, 3, 3]),
            rand([4, 2, 2], seed=1),
            rand([4, 2, 3], seed=2),
            *_stack(
                [(12, 3), (12, 2), (12,), (2, 3)] * 2 + [(12, 4), (12, 2), (12,), (2, 3)] * 2, 10
            ),
        ),
        "lstm-2-layers-bidirectional-proj",
    )
)
