"""Cases of the commands the dynamic graph records: write_view and call."""

import numpy as np

from fnnc import ops
from fnnc.graph import GraphBuilder
from fnnc.ops.call import call, write_view
from tests.helpers import rand, randint
from tests.ops.cases import Case


def _two_output_graph():
    """(x, w, idx) -> (tanh(x @ w^T) * x[:, :2] sum, index_select(x, idx))."""
    b = GraphBuilder()
    x, w = b.input((3, 4), name="x"), b.input((2, 4), name="w")
    idx = b.input((2,), np.int32, name="idx")
    h = b.exec(ops.tanh(), b.exec(ops.gemm(transpose_b=True), x, w))
    y = b.exec(ops.ewprod(), h, b.alias(x, (3, 2)))
    return b.build([y, b.exec(ops.index_select(axis=0), x, idx)])


CASES = [
    Case(
        write_view(shape=(2,), base=1, stride=(3,)),
        (rand((2, 3), seed=1), rand((2,), seed=2)),
        "write_view-column",
    ),
    Case(
        write_view(shape=(1, 2), base=3, stride=(3, 1)),
        (rand((2, 3), seed=3), rand((1, 2), seed=4)),
        "write_view-row-slice",
    ),
    Case(
        call(graph=_two_output_graph()),
        (rand((3, 4), seed=5), rand((2, 4), seed=6), randint((2,), 3, seed=7)),
        "call-two-outputs",
    ),
]
