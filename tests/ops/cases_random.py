import jax
import numpy as np

from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

_KEY = np.asarray(jax.random.key_data(jax.random.key(0)))

# Random commands are deterministic given their key input, so dropout keeps the
# finite-difference check; random_uniform / random_normal have no backward at all.
CASES = [
    Case(ops.dropout(), (rand([4, 5]), _KEY), "dropout"),
    Case(ops.dropout(p=0.2, entirety=True), (rand([2, 3]), _KEY), "dropout-entirety"),
    Case(ops.random_uniform(shape=(3, 4), low=-1.0, high=2.0), (_KEY,), "random_uniform"),
    Case(ops.random_normal(shape=(2, 3), mean=1.0, std=2.0), (_KEY,), "random_normal"),
    Case(ops.random_split(n=3), (_KEY,), "random_split"),
]
