"""Graphs stored in the same SQLite file as the tensors."""

import json
import sqlite3

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import GraphFormatError, TensorFileError
from fnnc.graph import GraphBuilder, interpret, to_data
from fnnc.io import (
    SafetensorsFile,
    TensorFile,
    graph_names,
    load_from,
    save_to,
    write_parameters,
)
from tests.helpers import fetch_rows


def mlp():
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    w = b.input((4, 3), name="w")
    return b.build([b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w, name="fc"))])


def test_graph_and_weights_in_one_file(tmp_path):
    path = str(tmp_path / "model.sqlite")
    w = np.arange(12, dtype=np.float32).reshape(4, 3) - 6
    write_parameters(path, {"w": w})
    save_to(path, mlp(), "forward")
    with TensorFile(path) as f:
        save_to(f, mlp(), "again")
        assert f.names() == ["w"]
        assert graph_names(f) == ["again", "forward"]
    back = load_from(path, "forward")
    assert back == mlp()
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(interpret(back, x, w), interpret(mlp(), x, w))
    stored = fetch_rows(path, "SELECT data FROM fnnc_graphs WHERE name='forward'")
    assert json.loads(stored[0][0]) == json.loads(json.dumps(to_data(mlp())))


def test_missing_and_damaged_graphs(tmp_path):
    path = str(tmp_path / "model.sqlite")
    with TensorFile(path) as f, f.transaction():  # opening creates nothing; a write does
        pass
    assert graph_names(path) == []
    with pytest.raises(GraphFormatError, match=r"no graph 'g'.*none"):
        load_from(path, "g")
    save_to(path, mlp(), "g")
    conn = sqlite3.connect(path)
    conn.execute('UPDATE fnnc_graphs SET data=\'{"format": "x"}\'')
    conn.commit()
    conn.close()
    with pytest.raises(GraphFormatError, match=r"not an fnnc graph.*graph 'g' in"):
        load_from(path, "g")


def test_fnnc_graph_save_and_load_route_to_the_tensor_file(tmp_path):
    import numpy as np

    from fnnc import ops
    from fnnc.graph import GraphBuilder, load, save
    from fnnc.io import TensorFile

    b = GraphBuilder()
    x = b.input((3,), name="x")
    g = b.build([b.exec(ops.relu(), x)])
    path = tmp_path / "model.sqlite3"
    with TensorFile(path) as f:
        f.write("w", np.ones(3, np.float32))
    save(g, path, name="forward")
    assert load(path, name="forward") == g
    with TensorFile(path) as f:
        assert f.names() == ["w"]  # the tensors are untouched
        save(g, f)
        assert load(f) == g


def test_graphs_in_a_safetensors_file_are_a_clear_error(tmp_path):
    path = tmp_path / "w.safetensors"
    SafetensorsFile(path).write("w", np.ones(2, np.float32))
    before = path.read_bytes()
    calls = {
        "save graph 'fwd'": lambda: save_to(path, mlp(), "fwd"),
        "list graphs": lambda: graph_names(path),
        "load graph 'fwd'": lambda: load_from(path, "fwd"),
    }
    for what, call in calls.items():
        with pytest.raises(TensorFileError) as e:
            call()
        assert str(e.value).startswith(f"{what}: {path} is opened as a SafetensorsFile")
        assert "only in NNC SQLite tensor files" in str(e.value)
    assert path.read_bytes() == before
    with pytest.raises(TensorFileError, match="only in NNC SQLite"):
        save_to(tmp_path / "new.safetensors", mlp(), "fwd")
    assert not (tmp_path / "new.safetensors").exists()
