import numpy as np

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
CASES += [
    Case(ops.lssc_compress(), (rand([2, 7, 10, 3]),), "lssc_compress"),
    Case(ops.lssc_compress(), (rand([5, 4, 2]),), "lssc_compress-rank3"),
    Case(
        ops.lssc_decompress(size=(7, 10), dtype="float32"),
        (np.asarray(ops.lssc_compress()(rand([2, 7, 10, 3]))),),
        "lssc_decompress",
    ),
    Case(
        ops.lssc_decompress(),
        (np.asarray(ops.lssc_compress()(rand([1, 8, 8, 2]))),),
        "lssc_decompress-auto",
    ),
]
