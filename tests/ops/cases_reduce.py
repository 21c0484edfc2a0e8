import numpy as np

from fnnc import ops
from tests.helpers import rand, randint
from tests.ops.cases import Case

X = rand([2, 3, 4])

CASES = [
    Case(ops.reduce_sum(axes=(1,)), (X,), "reduce_sum"),
    Case(ops.reduce_sum(axes=(0, -1)), (X,), "reduce_sum-neg"),
    Case(ops.reduce_sum(axes=(0,)), (randint([3, 2], 5),), "reduce_sum-int"),
    Case(ops.reduce_mean(axes=(0, 2)), (X,), "reduce_mean"),
    Case(ops.reduce_mean(axes=(-1,)), (rand([5]),), "reduce_mean-all"),
    # Random inputs have no ties, so max / min are smooth around them.
    Case(ops.reduce_max(axes=(1,)), (X,), "reduce_max"),
    Case(ops.reduce_max(axes=(-1, 0)), (X,), "reduce_max-neg"),
    Case(ops.reduce_min(axes=(2,)), (X,), "reduce_min"),
    Case(ops.reduce_norm2(axes=(1, 2)), (X,), "reduce_norm2"),
    Case(ops.reduce_norm2(axes=(-1,)), (rand([3, 2], seed=1),), "reduce_norm2-neg"),
    Case(ops.reduce_isnan(axes=(1,)), (np.where(X > 0.5, np.nan, X),), "reduce_isnan"),
    Case(ops.reduce_isnan(axes=(0, -1)), (randint([3, 2], 5),), "reduce_isnan-int"),
    Case(ops.argmax(axis=1), (X,), "argmax"),
    Case(ops.argmin(axis=-1), (X,), "argmin"),
]
