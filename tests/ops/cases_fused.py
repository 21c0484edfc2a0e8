from fnnc import ops
from fnnc.graph import GraphBuilder
from tests.helpers import rand
from tests.ops.cases import Case


def _bias_gelu(approximate=False):
    b = GraphBuilder()
    h, bias = b.input((3, 4), name="h"), b.input((4,), name="bias")
    return b.build([b.exec(ops.gelu(approximate=approximate), b.exec(ops.add(), h, bias))])


def _swish_by_hand():
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    return b.build([b.exec(ops.mul(), x, b.exec(ops.sigmoid(), x))])


CASES = [
    Case(
        ops.fused_elementwise(body=_bias_gelu()),
        (rand([3, 4]), rand([4], seed=1)),
        "fused-bias-gelu",
    ),
    Case(
        ops.fused_elementwise(body=_bias_gelu(approximate=True)),
        (rand([3, 4]) * 4, rand([4], seed=1)),
        "fused-bias-gelu-tanh",
    ),
    Case(ops.fused_elementwise(body=_swish_by_hand()), (rand([2, 3]) * 3,), "fused-swish"),
]
