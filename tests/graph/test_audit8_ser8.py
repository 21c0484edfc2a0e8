"""Audit 8 of graph files: what a save/load round trip must keep, checked against NumPy."""

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import GraphFormatError
from fnnc.graph import GraphBuilder, interpret, load, save
from fnnc.io import TensorFile


def test_a_big_endian_constant_keeps_its_values_through_a_file(tmp_path):
    """A constant from a big-endian array was kept in its byte order: the builder refused
    to add it to a float32 input ("float32[2], float32[2]"), and a file, which names
    only the dtype, read its bytes back as little-endian (1.0 became 4.6e-41)."""
    value = np.array([1.5, -2.0, 3.25], ">f4")
    b = GraphBuilder()
    x = b.input((3,), name="x")
    c = b.constant(value, name="c")
    g = b.build([b.exec(ops.add(), x, c), c])
    save(g, tmp_path / "g.json")
    back = load(tmp_path / "g.json")
    assert back == g
    xs = np.array([0.5, 0.25, -1.0], np.float32)
    for graph in (g, back):
        total, constant = interpret(graph, xs)
        np.testing.assert_array_equal(np.asarray(constant), value.astype(np.float32))
        np.testing.assert_array_equal(np.asarray(total), xs + value.astype(np.float32))


def test_loading_a_tensor_file_without_name_says_to_pass_it(tmp_path):
    """``load(model.sqlite)`` read the SQLite bytes as JSON: "not JSON: 'utf-8' codec
    can't decode byte 0xf8", with no word of ``name=`` or of the graphs stored there."""
    b = GraphBuilder()
    x = b.input((3,), name="x")
    g = b.build([b.exec(ops.relu(), x)])
    path = tmp_path / "model.sqlite"
    with TensorFile(path) as f:
        f.write("w", np.ones(2, np.float32))
    with pytest.raises(GraphFormatError, match=r"NNC SQLite tensor file.*graphs in it: none"):
        load(path)
    save(g, path, name="forward")
    with pytest.raises(GraphFormatError, match=r"name=.*graphs in it: 'forward'"):
        load(path)
    assert load(path, name="forward") == g
