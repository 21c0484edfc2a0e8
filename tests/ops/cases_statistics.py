import jax
import numpy as np

from fnnc import ops
from tests.helpers import rand
from tests.ops.cases import Case

KEY = np.asarray(jax.random.key_data(jax.random.key(3)))
V = rand([4, 5], lo=-2, hi=2, seed=1)

CASES = [
    Case(ops.histogram(bins=4, min=-1.0, max=1.0), (V,), "histogram-even"),
    Case(ops.histogram(type="bins"), (V, np.array([-1.0, 0.0, 0.5], np.float32)), "histogram-bins"),
    Case(
        ops.histogram(type="logarithmic", min=0.1, max=4.0, rate=2.0), (V,), "histogram-logarithmic"
    ),
    Case(ops.gumbel_argmax(axis=1), (V, KEY), "gumbel_argmax"),
]
