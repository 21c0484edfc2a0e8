import numpy as np

from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

i32 = np.int32

CASES = [
    Case(
        ops.scaled_dot_product_arg_partition(kth=3, scale=0.5, is_causal=True),
        (rand([4, 2, 3]), rand([6, 3], seed=1), rand([4, 2], seed=2)),
        "sdp_arg_partition-causal",
    ),
    Case(
        ops.scaled_dot_product_arg_partition(
            kth=2, compression_ratio=2, query_offset=1, is_causal=True, sort_indices=True
        ),
        (rand([3, 1, 2]), rand([5, 2], seed=1), rand([3, 1], seed=2)),
        "sdp_arg_partition-compressed-sorted",
    ),
    Case(
        ops.sparse_indexed_attention(scale=0.7, is_causal=True),
        (
            rand([2, 2, 3]),
            rand([4, 3], seed=1),
            rand([4, 3], seed=2),
            rand([5, 3], seed=3),
            rand([5, 3], seed=4),
            np.array([[4, 0, -1], [1, -1, 3]], i32),  # stops at the first negative
        ),
        "sparse_indexed_attention-causal",
    ),
    Case(
        ops.sparse_indexed_attention(is_causal=True, attention_sinks=True, sliding_window=2),
        (
            rand([3, 2, 2]),
            rand([3, 2], seed=1),
            rand([3, 2], seed=2),
            rand([4, 2], seed=3),
            rand([4, 2], seed=4),
            np.array([[0, 2], [3, 3], [-1, 1]], i32),
            rand([2], seed=5),
        ),
        "sparse_indexed_attention-sinks-window",
    ),
    Case(
        ops.sol_attention(
            scale=0.6, tau=0.2, block_size=2, approximation_start=2, approximation_end=8
        ),
        (rand([1, 9, 2, 3]), rand([1, 9, 2, 3], seed=1), rand([1, 9, 2, 3], seed=2)),
        "sol_attention",
    ),
    Case(
        ops.sol_attention(block_size=3, approximation_end=7, query_block_size=2),
        (rand([2, 7, 1, 2]), rand([2, 7, 1, 2], seed=1), rand([2, 7, 1, 2], seed=2)),
        "sol_attention-query-blocks",
    ),
    Case(
        ops.sol_attention(block_size=3, approximation_end=7),
        (
            rand([1, 7, 1, 2]),
            rand([1, 7, 1, 2], seed=1),
            rand([1, 7, 1, 2], seed=2),
            np.array([1], i32),
        ),
        "sol_attention-dense-selected",
    ),
]
