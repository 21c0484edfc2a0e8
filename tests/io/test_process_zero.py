"""Only process 0 of a multi-process run writes files; Model.read of a missing file."""

import hashlib
import pathlib

import jax
import numpy as np
import optax
import pytest

from fnnc.errors import TensorFileError
from fnnc.io import Checkpoints, write_parameters
from fnnc.models import Dense, Input, Model


@pytest.fixture(scope="module")
def model():
    x = Input()
    m = Model(x, Dense(2, name="fc")(x))
    m.compile(np.zeros((4, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
    return m


def digest(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def test_other_processes_write_nothing(tmp_path, model, monkeypatch):
    existing = tmp_path / "existing.ckpt"
    with Checkpoints(existing) as ckpt:
        ckpt.save(1, {"w": np.ones(2)})
    before = digest(existing)
    monkeypatch.setattr(jax, "process_index", lambda *args, **kwargs: 1)
    with Checkpoints(tmp_path / "new.ckpt") as ckpt:
        ckpt.save(1, {"w": np.ones(2)})
        ckpt.save(2, model)  # the model's state is gathered, then not written
        assert ckpt.steps() == []
    with Checkpoints(existing) as ckpt:
        ckpt.save(2, {"w": np.zeros(2)})
        ckpt.delete(1)
    write_parameters(tmp_path / "params.sqlite", {"w": np.ones(2, np.float32)})
    model.write(tmp_path / "model.sqlite")
    model.write(existing)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing.ckpt"]
    assert digest(existing) == before
    monkeypatch.setattr(jax, "process_index", lambda *args, **kwargs: 0)
    model.write(tmp_path / "model.sqlite")  # the same calls on process 0 do write
    with Checkpoints(existing) as ckpt:
        ckpt.save(2, {"w": np.zeros(2)})
        assert ckpt.steps() == [1, 2]
    assert (tmp_path / "model.sqlite").exists()


def test_model_read_of_a_missing_file(tmp_path, model):
    path = tmp_path / "typo.sqlite"
    with pytest.raises(TensorFileError, match=r"typo\.sqlite: no such file"):
        model.read(path)
    assert not path.exists()
