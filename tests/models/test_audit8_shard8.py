"""Audit 8 (sharding): user mistakes on data-parallel models get fnnc errors."""

from __future__ import annotations

import re

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


class _Device:
    """A stand-in for a device of some process (only what the checks read)."""

    def __init__(self, id: int, process_index: int):
        self.id, self.process_index = id, process_index

    def __repr__(self) -> str:
        return f"D{self.id}@{self.process_index}"


def test_batch_axis_must_give_each_process_its_positions_in_order(monkeypatch):
    """Each process's rows fill the data axis in process order: a mesh listing process
    1's devices first put process 1's outputs where evaluate and predict read process
    0's (a real 2-process run gave every row another row's prediction), and one with
    the processes along another axis failed inside JAX at the first batch. Both are
    refused when the layout is set; the mesh jax.devices() gives in order is not."""
    from jax.sharding import Mesh

    from fnnc.errors import ModelError
    from fnnc.models.parallel import Parallel, _check_batch_axis

    devices = [_Device(10 * p + i, p) for p in range(2) for i in range(2)]  # 2 x 2
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    grid = np.array(devices).reshape(2, 2)
    _check_batch_axis(Mesh(np.array(devices), ("data",)), "data", 2)  # in order: fine
    _check_batch_axis(Mesh(grid, ("data", "model")), "data", 2)
    _check_batch_axis(Mesh(grid.T, ("model", "data")), "data", 2)  # processes on "data"
    cases = [
        (Mesh(np.array(devices[::-1]), ("data",)), "processes 1, 1, 0, 0, in that order"),
        (Mesh(grid.T, ("data", "model")), "processes 0/1, 0/1, in that order"),
        (Mesh(grid[:, :1], ("model", "data")), "(1 positions) holds the devices of proc"),
    ]
    for mesh, want in cases:
        with pytest.raises(ModelError, match=re.escape(want)):
            Parallel.of(mesh, "replicated")
