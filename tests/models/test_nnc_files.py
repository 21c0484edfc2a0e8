"""Model files in NNC's layout: files NNC itself wrote, files written here with NNC's
ids and row format, and what ``Model.write`` and ``Checkpoints`` name."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from fnnc.errors import ParameterError
from fnnc.io import Checkpoints, TensorFile
from fnnc.models import BatchNorm, Dense, Model, ReLU, Sequential
from tests.helpers import NNC_FILES, fetch_rows, needs_nnc_files

# The weights, input and output in NNC_FILES/README.md.
W1 = np.array([[(((o * 4 + i) * 5) % 11 - 5) / 8 for i in range(4)] for o in range(8)], np.float32)
B1 = np.array([(o - 3.5) / 16 for o in range(8)], np.float32)
W2 = np.array([[(((o * 8 + i) * 3) % 7 - 3) / 8 for i in range(8)] for o in range(3)], np.float32)
B2 = np.array([0.125, -0.25, 0.375], np.float32)
X = np.array([i * 0.1 - 0.4 for i in range(8)], np.float32).reshape(2, 4)
NNC_OUT = np.array(
    [[-0.0210937411, -0.219531253, 0.30859375], [0.11328125, -0.291406244, 0.375]], np.float32
)


def _mlp(named: bool = False) -> Model:
    if named:
        layers = [Dense(8, name="fc1"), ReLU(name="act"), Dense(3, name="fc2")]
        return Sequential(layers, name="mlp")
    return Sequential([Dense(8), ReLU(), Dense(3)])


def _compiled(model: Model) -> Model:
    model.compile([np.zeros((2, 4), np.float32)])
    return model


def _rows(path: pathlib.Path) -> list[str]:
    return sorted(r[0] for r in fetch_rows(path, "SELECT name FROM tensors"))


def _forward(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W1.T + B1, 0) @ W2.T + B2


@needs_nnc_files
@pytest.mark.parametrize(
    ("file", "name"), [("model.sqlite3", None), ("model_named.sqlite3", "mlp")]
)
def test_reads_a_file_nnc_wrote_and_reproduces_its_output(file, name):
    model = _compiled(_mlp())
    assert model.read(NNC_FILES / file, name=name) == []
    params = model.parameters()
    for pid, want in {"t-0-0": W1, "t-0-1": B1, "t-1-0": W2, "t-1-1": B2}.items():
        np.testing.assert_array_equal(np.asarray(params[pid]), want, err_msg=pid)
    np.testing.assert_allclose(np.asarray(model.evaluate([X])), NNC_OUT, rtol=0, atol=1e-6)


@needs_nnc_files
def test_nnc_rows_are_the_ids_fnnc_writes(tmp_path):
    model = _compiled(_mlp())
    model.read(NNC_FILES / "model.sqlite3")
    model.write(tmp_path / "plain.sqlite3")
    model.write(tmp_path / "named.sqlite3", name="mlp")
    assert _rows(tmp_path / "plain.sqlite3") == _rows(NNC_FILES / "model.sqlite3")
    assert _rows(tmp_path / "named.sqlite3") == _rows(NNC_FILES / "model_named.sqlite3")


@needs_nnc_files
def test_reading_the_named_file_without_its_name_lists_every_missing_id():
    model = _compiled(_mlp())
    with pytest.raises(ParameterError, match="t-0-0, t-0-1, t-1-0, t-1-1"):
        model.read(NNC_FILES / "model_named.sqlite3")


@needs_nnc_files
def test_reading_a_file_nnc_wrote_with_the_wrong_model_name_says_the_right_one():
    model = _compiled(_mlp())
    hint = r"holds a model named 'mlp' \(rows __mlp__\[<id>\]\) with 4 of the 4 missing ids: "
    for name in (None, "net"):
        with pytest.raises(ParameterError, match=hint + r"read it with name='mlp'"):
            model.read(NNC_FILES / "model_named.sqlite3", name=name)
    with pytest.raises(ParameterError, match=r"a model without a name .*name=None"):
        model.read(NNC_FILES / "model.sqlite3", name="mlp")


def test_the_name_hint_counts_the_missing_ids_each_model_of_the_file_holds(tmp_path):
    path = tmp_path / "two.sqlite3"
    _write_nnc_rows(path, {"__a__[t-0-0]": W1, "__b__[t-0-0]": W1, "__b__[t-0-1]": B1})
    model = _compiled(_mlp())
    with pytest.raises(ParameterError) as e:
        model.read(path)
    lines = str(e.value).splitlines()
    assert "model named 'a' (rows __a__[<id>]) with 1 of the 4 missing ids" in lines[2]
    assert "model named 'b' (rows __b__[<id>]) with 2 of the 4 missing ids" in lines[3]
    other = tmp_path / "other.sqlite3"
    _write_nnc_rows(other, {"__c__[t-9-0]": B2, "__d__[t-9-0]": B2})
    with pytest.raises(ParameterError, match=r"holds models named 'c', 'd'; none has these ids"):
        model.read(other)


def _write_nnc_rows(path: pathlib.Path, rows: dict[str, np.ndarray]) -> None:
    """Rows as ``ccv_cnnp_model_write`` lays them out: NHWC float32 tensors by name."""
    with TensorFile(path) as f, f.transaction():
        for row, value in rows.items():
            f.write(row, np.asarray(value, np.float32), "NHWC")


def test_a_file_in_nnc_layout_with_named_models_reads_back(tmp_path):
    path = tmp_path / "named.sqlite3"
    ids = ["t-mlp-0-fc1-0-0", "t-mlp-0-fc1-0-1", "t-mlp-0-fc2-0-0", "t-mlp-0-fc2-0-1"]
    _write_nnc_rows(path, {f"__net__[{i}]": v for i, v in zip(ids, (W1, B1, W2, B2))})
    model = _compiled(_mlp(named=True))
    assert sorted(model.parameters()) == ids
    assert model.read(path, name="net") == []
    np.testing.assert_allclose(np.asarray(model.evaluate([X])), _forward(X), atol=1e-6)


def test_a_file_in_nnc_layout_with_internals_reads_back(tmp_path):
    # sequential([dense(8), batch_norm(), relu(), dense(3)]): the batch norm is the
    # second unnamed model with parameters; its running mean and variance are the
    # internals r-1-0 and r-1-1, stored as "<id>(<replica>)".
    scale, bias = np.linspace(0.5, 1.5, 8), np.linspace(-0.2, 0.2, 8)
    mean, var = np.linspace(-0.1, 0.1, 8), np.linspace(0.5, 2.0, 8)
    rows = {"t-0-0": W1, "t-0-1": B1, "t-1-0": scale, "t-1-1": bias, "t-2-0": W2, "t-2-1": B2}
    rows.update({"r-1-0(0)": mean, "r-1-1(0)": var})
    path = tmp_path / "bn.sqlite3"
    _write_nnc_rows(path, rows)
    model = _compiled(Sequential([Dense(8), BatchNorm(epsilon=1e-5), ReLU(), Dense(3)]))
    assert model.read(path) == []
    h = (X @ W1.T + B1 - mean) / np.sqrt(var + 1e-5) * scale + bias
    want = np.maximum(h, 0) @ W2.T + B2
    np.testing.assert_allclose(np.asarray(model.evaluate([X])), want, rtol=1e-5, atol=1e-5)
    model.write(tmp_path / "again.sqlite3")
    assert _rows(tmp_path / "again.sqlite3") == sorted(rows)


def test_checkpoints_name_rows_by_the_same_ids(tmp_path):
    model = _compiled(_mlp())
    model.set_parameters({"t-0-0": W1, "t-0-1": B1, "t-1-0": W2, "t-1-1": B2})
    with Checkpoints(tmp_path / "run.ckpt") as ckpt:
        ckpt.save(3, model)
        rows = ckpt.file.names()
    for pid in ("t-0-0", "t-0-1", "t-1-0", "t-1-1"):
        assert f"__ckpt-3__[{pid}]" in rows, rows
