from fnnc import ops
from tests.helpers import rand, randint
from tests.ops.cases import Case

CASES = [
    Case(ops.optimization_barrier(), (rand([2, 3]), rand([4])), "optimization_barrier"),
    Case(
        ops.optimization_barrier(),
        (rand([3]), randint([2], 5)),
        "optimization_barrier-int",
        grad_inputs=(0,),
    ),
]
