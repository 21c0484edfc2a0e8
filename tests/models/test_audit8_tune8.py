"""Audit 8 (tuning): Model.autotune checks its arguments before it builds anything."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import BackendError
from fnnc.models import Dense, Input, Model


@pytest.mark.parametrize("repeats", [0, True, 2.0])
def test_a_bad_repeats_is_refused_before_any_program_is_built(repeats):
    """repeats=0 failed only after the fit and evaluate programs were built, naming
    autotune_graph; repeats=True timed one run as if it were a count."""
    x = Input()
    model = Model(x, Dense(2, name="fc")(x))
    model.compile(np.zeros((4, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
    before = dict(model.engine._programs)
    batch, targets = np.ones((4, 3), np.float32), np.ones((4, 2), np.float32)
    with pytest.raises(BackendError, match=r"Model\.autotune: repeats must be an int >= 1"):
        model.autotune(batch, targets, repeats=repeats)
    assert model.engine._programs == before
    with pytest.raises(BackendError, match=r"autotune: repeats must be an int >= 1"):
        ops.autotune.autotune(ops.relu(), jnp.ones((2,)), repeats=repeats)
