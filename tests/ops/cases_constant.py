import numpy as np

from fnnc import ops
from tests.ops.cases import Case

CASES = [
    Case(ops.constant(np.arange(6, dtype=np.float32).reshape(2, 3)), (), "constant"),
    Case(ops.constant(np.int32(7)), (), "constant-int"),
]
