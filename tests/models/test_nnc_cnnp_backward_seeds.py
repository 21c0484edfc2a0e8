"""``Model.backward()`` without ingrads seeds every output with ones, as NNC's
``ccv_cnnp_model_backward`` does ("Set it to 1 if it is not specified"), whatever the
outputs' shapes and under data parallelism; NNC's test/int/nnc/cnnp.core.tests.c "train a
simple math 2 * x = 10, x = 5 and copy parameter to a new model entirely" and "... merge
parameters with a model" call it so after ``set_data_parallel``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fnnc.models import Dense, Input, Model, minimizers
from tests.helpers import assert_close, rand, run_on_cpu_devices


def test_backward_without_ingrads_is_the_gradient_of_the_outputs_sum():
    x = Input()
    model = Model([x], [Dense(3, name="d")(x)])
    a = rand((2, 4), seed=1)
    model.compile([a], minimizer=minimizers.sgd(0.1))
    model.evaluate([a], requires_grad=True)
    (da,) = model.backward()
    w, b = (model.parameters()[k] for k in ("t-d-0-0", "t-d-0-1"))
    want = jax.grad(lambda a: jnp.sum(a @ jnp.asarray(w).T + jnp.asarray(b)[None]))(jnp.asarray(a))
    assert_close(da, want, 1e-6, 1e-6)


MATH = """
import numpy as np
from fnnc import ops
from fnnc.models import CommandLayer, Dense, Input, Model, Mul, minimizers

def math():
    x, fit = Input(), Input()
    diff = CommandLayer(ops.add(p=1.0, q=-1.0))(Dense(1, no_bias=True, name="mul")(x), fit)
    return Model([x, fit], [Mul()(diff, diff)])

n = 2  # NNC: a [1] input per device
a, f = np.full((n, 1), 2, np.float32), np.full((n, 1), 10, np.float32)
final = math()
final.compile([a, f], minimizer=minimizers.sgd(0.1, decay=0.1, scale=1.0 / n))
final.set_data_parallel(n)
for _ in range(10):
    final.evaluate([a, f], requires_grad=True)
    final.backward()  # every copy's output gradient is 1
    final.apply_gradients()
# x <- x - 0.1 (4 (2x - 10) + 0.1 x): the fixed point 40 / 8.1, 0.19 ** 10 of the start left
x = float(np.asarray(final.parameters()["t-mul-0-0"]).ravel()[0])
assert abs(x - 40 / 8.1) < 1e-5, x
copy = math()
copy.compile([a, f], minimizer=minimizers.sgd(0.1, decay=0.1))
copy.set_data_parallel(n)
copy.set_parameters(final.parameters())
assert np.allclose(np.asarray(copy.evaluate([a, f])), (2 * x - 10) ** 2, atol=1e-5)
mine = {k: np.ones_like(v) for k, v in copy.parameters().items()}
copy.set_parameters({k: 0.6 * mine[k] + 0.4 * np.asarray(v) for k, v in final.parameters().items()})
merged = 0.6 + 0.4 * x
assert np.allclose(np.asarray(copy.evaluate([a, f])), (2 * merged - 10) ** 2, atol=1e-4)
print("OK")
"""


def test_nnc_int_math_case_trains_with_default_seeds_on_two_devices():
    run_on_cpu_devices(MATH, devices=2)
