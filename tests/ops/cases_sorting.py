import numpy as np

from fnnc import ops
from tests.helpers import rand, randint
from tests.ops.cases import Case

X = rand([3, 5], seed=1)
ROWS = rand([4, 3], seed=2)
IDX = np.array([2, -1, 2, 5], np.int32)  # -1 and 5 are out of range for 4 bins: dropped

CASES = [
    Case(ops.sort(), (X,), "sort"),
    Case(ops.sort(axis=0, descending=True), (X,), "sort-axis0-descending"),
    Case(ops.sort(axis=-1), (randint([2, 6], 4, seed=3),), "sort-int-ties"),
    Case(ops.argsort(axis=0, descending=True), (X,), "argsort-axis0-descending"),
    Case(ops.argsort(), (randint([2, 6], 4, seed=3),), "argsort-int-ties"),
    Case(ops.partition(kth=2), (X,), "partition-smallest"),
    Case(ops.partition(kth=3, axis=0, descending=True), (rand([4, 2], seed=4),), "partition-top"),
    Case(
        ops.unique_consecutive(bincount=5),
        (np.array([2, 2, 0, 0, 2, 1, 1, 3], np.float32),),
        "unique_consecutive",
    ),
    Case(ops.scatter_add(bincount=4), (ROWS, IDX), "scatter_add", grad_inputs=(0,)),
    Case(
        ops.scatter_add(),
        (rand([3, 2, 2], seed=5), np.array([1, 1, 0], np.int32)),
        "scatter_add-default-bins",
        grad_inputs=(0,),
    ),
]
