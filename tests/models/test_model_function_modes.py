"""model_function is reverse mode only: jax.hessian and grad of grad match plain JAX;
jax.jvp is a ModelError saying so and what to do (and what it says works)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.errors import ModelError
from fnnc.graph import compile
from fnnc.models import Dense, Input, Model, model_function

X = np.random.default_rng(0).uniform(-1, 1, (4, 3)).astype(np.float32)


def _built():
    x = Input()
    model = Model(x, Dense(2, name="fc")(x))
    model.compile(X, loss="mse", minimizer=optax.sgd(0.1))
    fn = model_function(model, [jax.ShapeDtypeStruct(X.shape, np.float32)])
    params = fn.initial_parameters(model)
    w, b = (params[p] for p in fn.params)
    return fn, params, lambda x: jnp.sin(x @ jnp.asarray(w).T + jnp.reshape(b, (1, -1)))


def test_reverse_mode_and_its_second_order_match_plain_jax():
    fn, params, plain = _built()
    loss = lambda x: jnp.sum(jnp.sin(fn([x], params)[0][0]))
    want = jax.hessian(lambda x: jnp.sum(plain(x)))(X)
    np.testing.assert_allclose(jax.hessian(loss)(X), want, rtol=1e-5, atol=1e-6)


def test_forward_mode_is_a_model_error_that_says_what_to_do():
    fn, params, plain = _built()
    with pytest.raises(ModelError, match=r"reverse-mode derivatives only.*fnnc.graph.compile"):
        jax.jvp(lambda x: fn([x], params)[0][0], (X,), (X,))
    program = compile(fn.graph)  # what the message says: forward mode through the Program
    values = [params[p] for p in fn.params]
    _, got = jax.jvp(lambda x: jnp.sin(program(x, *values)), (X,), (X,))
    _, want = jax.jvp(plain, (X,), (X,))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
