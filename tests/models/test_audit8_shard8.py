"""Audit 8 (sharding): user mistakes on data-parallel models get fnnc errors."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

from fnnc.errors import ShapeError
from fnnc.models import Dense, Input, Model


def _evaluated(parallel: bool) -> Model:
    x = Input()
    m = Model(x, Dense(2, name="fc")(x))
    if parallel:
        m.set_data_parallel(0)
    m.compile(np.zeros((8, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
    m.evaluate(np.ones((8, 3), np.float32), is_test=False, requires_grad=True)
    return m


@pytest.mark.parametrize("parallel", [False, True], ids=["plain", "data_parallel"])
def test_backward_names_the_ingrad_and_the_output_shape(parallel):
    """A mis-shaped output gradient was a Program error naming an internal input
    ('input %4 (df[0]) expects float32[8, 2]'); with several processes, this process's
    rows alone (not the gathered outputs evaluate returns) failed the same way."""
    m = _evaluated(parallel)
    want = r"^backward: ingrads 0 is \[4, 2\], but output 0 of the last evaluate.* is \[8, 2\]"
    with pytest.raises(ShapeError, match=want):
        m.backward([np.ones((4, 2), np.float32)])
    (dx,) = m.backward([np.ones((8, 2), np.float32)])  # nothing changed by the refusal
    w = np.asarray(m.parameters()["t-fc-0-0"])  # [2, 3]
    np.testing.assert_allclose(dx, np.ones((8, 2)) @ w, rtol=1e-6)


def test_backward_error_says_which_rows_with_several_processes(monkeypatch):
    from fnnc.models import residuals

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ShapeError, match=r"with 2 processes that is every process's rows"):
        residuals.seeds([np.ones((4, 2), np.float32)], [(8, 2)])
