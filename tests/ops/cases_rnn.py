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
