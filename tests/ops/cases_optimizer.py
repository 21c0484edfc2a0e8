import jax
import numpy as np
import optax

from fnnc.ops.optimizer import optax_update_command
from tests.helpers import rand
from tests.ops.cases import Case


def _case(optimizer, name, numeric=True):
    params = [rand([3], seed=1), rand([2, 2], seed=2)]
    grads = [rand([3], seed=3), rand([2, 2], seed=4)]
    state = jax.tree.leaves(optimizer.init(params))
    specs = [jax.ShapeDtypeStruct(p.shape, p.dtype) for p in params]
    inputs = (*grads, *(np.asarray(s) for s in state), *params)
    return Case(
        optax_update_command(optimizer, specs),
        inputs,
        name,
        numeric=numeric,
        grad_inputs=(0, 1, len(inputs) - 2, len(inputs) - 1),
    )


CASES = [
    _case(optax.sgd(0.1, momentum=0.9), "optax-sgd-momentum"),
    # Adam's sqrt(v) at v = g^2 is smooth away from zero: finite differences hold.
    _case(optax.adam(1e-2), "optax-adam"),
]
