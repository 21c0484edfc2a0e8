"""Audit 10, multi-device training (par10): data-parallel models against one device."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from jax.sharding import AbstractMesh

from fnnc.errors import ModelError, ShapeError
from fnnc.models import Dense, Input, Model, checks
from fnnc.models.parallel import Parallel
from tests.helpers import run_on_cpu_devices

X = np.random.default_rng(0).normal(size=(8, 6)).astype(np.float32)
BAD = {"int": np.array([0, 1, 2, 7, 0, 1, 2, 1], np.int32), "float": np.full(8, 1.5, np.float32)}


@pytest.fixture(scope="module")
def classifiers():
    """A classifier on one device and the same one on a one-device mesh."""
    out = []
    for mesh in (False, True):
        x = Input()
        m = Model(x, Dense(3, name="o")(x))
        if mesh:
            m.set_data_parallel(1)
        m.compile(X, loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
        out.append(m)
    return out


@pytest.mark.parametrize("kind", sorted(BAD))
def test_data_parallel_fit_checks_labels_as_one_device_does(classifiers, kind):
    # the mesh's batch turned the labels into device arrays before the check, which reads
    # NumPy labels only: a label 7 of 3 classes (or 1.5) trained silently on a mesh
    messages = []
    for m in classifiers:
        before = {k: np.asarray(v) for k, v in m.parameters().items()}
        with pytest.raises(ModelError, match="needs class indices in") as e:
            m.fit(X, BAD[kind])
        messages.append(str(e.value))
        for k, v in m.parameters().items():  # refused before the step
            np.testing.assert_array_equal(v, before[k])
    assert messages[0] == messages[1]


def test_a_process_checks_its_own_rows_of_the_global_batch(classifiers, monkeypatch):
    # with 2 processes each passes 4 of the 8 rows the program is compiled for: its labels
    # are checked against its rows, sample positions counted in them
    engine = classifiers[1].engine
    specs = (jax.ShapeDtypeStruct((8, 6), np.float32),)
    monkeypatch.setattr(checks.jax, "process_count", lambda: 2)
    local = np.array([0, 2, 5, 1], np.int32)
    with pytest.raises(ModelError, match=r"label 5 at sample 2; .* shaped \[4, 3\]"):
        checks.targets(engine, specs, [local], "fit")
    checks.targets(engine, specs, [local % 3], "fit")  # in range: no error


def test_a_target_with_other_rows_than_the_inputs_is_named_so_on_a_mesh():
    # 8 input rows, 2 target rows, 4 devices: the error said the target's 2 rows do not
    # divide over 4 devices and to set_data_parallel(n) with n dividing 2
    par = Parallel(AbstractMesh((4,), ("data",)))
    y = np.zeros((2, 3), np.float32)
    with pytest.raises(ShapeError, match="target 0 has 2 rows but the inputs have 8; give as"):
        par.batch([y], "fit", "target", rows_of_inputs=8)
    with pytest.raises(ShapeError, match="does not divide over the 4 devices"):
        par.batch([y], "fit", "target", rows_of_inputs=2)  # as many rows: the old error


LAYOUT_CHANGE = """
import numpy as np, optax
from fnnc.models import Dense, Input, Model, ReLU
rng = np.random.default_rng(0)
X = rng.normal(size=(4, 3)).astype(np.float32)
G = rng.normal(size=(4, 2)).astype(np.float32)

def make(n=None):
    x = Input()
    m = Model(x, Dense(2, name="o")(ReLU()(Dense(4, name="h")(x))))
    if n:
        m.set_data_parallel(n, parameter_sharding="fsdp")
    m.compile(X, minimizer=optax.sgd(0.1))
    return m

def stepped(m, switch):
    # evaluate + backward, then evaluate, set_data_parallel(switch), backward; apply
    m.evaluate(X, requires_grad=True)
    dxs = m.backward([G])
    m.evaluate(X, requires_grad=True)
    if switch:
        m.set_data_parallel(switch, parameter_sharding="fsdp")
    dxs += m.backward([G * 0.5])
    m.apply_gradients()
    return m.parameters(), dxs

want, want_dx = stepped(make(), None)
for start, switch in ((None, 2), (2, 1)):
    got, dx = stepped(make(start), switch)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-6, atol=1e-6, err_msg=f"{start} {switch} {k}")
    for a, b in zip(dx, want_dx):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-6, atol=1e-6)
print("OK")
"""


def test_backward_after_set_data_parallel_equals_one_device():
    # the residuals evaluate kept on one device met parameters laid out on a mesh (a raw
    # "compiled for input shardings that disagree" error), and a gradient accumulated on
    # one mesh was added to one of another (JAX's "incompatible devices" ValueError)
    run_on_cpu_devices(LAYOUT_CHANGE, devices=2)
