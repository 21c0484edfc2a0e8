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
