"""Audit 8 of graph files: what a save/load round trip must keep, checked against NumPy."""

import base64
import json

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from fnnc import ops
from fnnc.errors import GraphFormatError, UnknownCommandError
from fnnc.graph import GraphBuilder, backward, interpret, load, save, scan, trace
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


def _modules(path):
    """Every jax.export module a graph file holds, deserialized."""
    found = []

    def walk(value):
        if isinstance(value, dict):
            if "$stablehlo" in value:
                found.append(
                    jax.export.deserialize(bytearray(base64.b64decode(value["$stablehlo"])))
                )
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(json.loads(path.read_text()))
    return found


def test_a_saved_module_runs_on_every_platform_not_only_the_saving_one(tmp_path):
    """A generic primitive was exported for the saving machine's platform alone: a graph
    traced and saved on a CPU loaded on a GPU and failed there when run ("exported for
    platforms ('cpu',) but it is used on ('cuda',)")."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    graph = trace(lambda v: jax.lax.cumsum(v, axis=1) * 2, x)
    assert any(n.cmd.name == "primitive" for n in graph.nodes)
    b = GraphBuilder.from_graph(graph)
    total = b.exec(ops.reduce_sum(axes=(0, 1)), graph.symbols[graph.outputs[0]])
    grads, _ = backward(b.build([total]), total, [graph.symbols[graph.inputs[0]]])
    for g, name in ((graph, "forward.json"), (grads, "backward.json")):
        save(g, tmp_path / name)
        modules = _modules(tmp_path / name)
        assert modules
        for module in modules:
            assert {"cpu", "cuda", "rocm", "tpu"} <= set(module.platforms)
            assert {"cpu", "cuda", "tpu"} <= set(module.vjp().platforms)
    want = np.cumsum(x, axis=1) * 2
    np.testing.assert_allclose(np.asarray(interpret(load(tmp_path / "forward.json"), x)), want)
    # d/dx_j sum_i cumsum(x)_i * 2 = 2 * (number of later-or-equal positions in the row)
    grad = interpret(load(tmp_path / "backward.json"), x)[-1]
    np.testing.assert_allclose(np.asarray(grad), np.tile([6.0, 4.0, 2.0], (2, 1)))


def test_save_refuses_to_write_json_over_a_safetensors_file(tmp_path):
    """An NNC SQLite file was protected from save() without name=, a safetensors file
    was not: its weights were silently replaced with the graph's JSON."""
    b = GraphBuilder()
    x = b.input((3,), name="x")
    g = b.build([b.exec(ops.relu(), x)])
    path = tmp_path / "weights.safetensors"
    tensors = {"w": np.arange(3, dtype=np.float32)}
    save_file(tensors, str(path))
    before = path.read_bytes()
    with pytest.raises(GraphFormatError, match=r"is a safetensors file.*lose its tensors"):
        save(g, path)
    assert path.read_bytes() == before
    np.testing.assert_array_equal(load_file(str(path))["w"], tensors["w"])
    save(g, tmp_path / "g.json")  # a JSON graph file is still replaced, as before
    save(g, tmp_path / "g.json")
    assert load(tmp_path / "g.json") == g


def test_an_error_in_a_sub_graph_names_the_node_holding_it(tmp_path):
    """A sub-graph's error counted the sub-graph's own nodes: 'node 0: gemm has no
    parameter' in a file whose node 0 is a relu, the gemm being in node 1's scan body."""
    b = GraphBuilder()
    h, w = b.input((2, 3), name="h"), b.input((3, 3), name="w")
    body = b.build([b.exec(ops.tanh(), b.exec(ops.gemm(), h, w))])
    outer = GraphBuilder()
    x, ws = outer.input((2, 3), name="x"), outer.input((4, 3, 3), name="ws")
    (y,) = scan(outer, body, [outer.exec(ops.relu(), x)], [ws], name="blocks")
    g = outer.build([y])
    path = tmp_path / "g.json"
    save(g, path)
    assert [n.cmd.name for n in g.nodes] == ["relu", "scan"]
    text = path.read_text()
    path.write_text(
        text.replace('"name":"gemm","params":[', '"name":"gemm","params":[["bogus",1],')
    )
    with pytest.raises(GraphFormatError, match=r"no parameter 'bogus'.*sub-graph of node 1 "):
        load(path)
    path.write_text(text.replace('"name":"tanh"', '"name":"tanhh"'))
    with pytest.raises(UnknownCommandError, match=r"'tanhh'.*sub-graph of node 1 "):
        load(path)
    path.write_text(text)
    assert load(path) == g


def test_a_module_one_platform_cannot_lower_is_saved_for_the_others_with_a_warning(tmp_path):
    """The export for ("cpu", "cuda", "rocm", "tpu") was all or nothing: tridiagonal_solve,
    which lowers for cpu, cuda and tpu but not rocm, was saved silently for ('cpu',)
    alone, so the file failed on a GPU. Oracle: NumPy's dense solve in float64."""
    dl = np.float32([0.0, 1.0, -0.5, 2.0])
    d = np.float32([4.0, 5.0, 3.0, 6.0])
    du = np.float32([1.0, 0.5, 1.5, 0.0])
    rhs = np.arange(8, dtype=np.float32).reshape(4, 2) / 3
    graph = trace(jax.lax.linalg.tridiagonal_solve, dl, d, du, rhs)
    assert any(n.cmd.name == "primitive" for n in graph.nodes)
    with pytest.warns(UserWarning, match=r"saved for \('cpu', 'cuda', 'tpu'\) only.*rocm") as w:
        save(graph, tmp_path / "g.json")
    assert len(w) == 1 and "rocm (ValueError: " in str(w[0].message)
    (module,) = _modules(tmp_path / "g.json")
    assert "cuda" in module.platforms and "rocm" not in module.platforms
    assert set(module.platforms) == {"cpu", "cuda", "tpu"}
    dense = np.diag(d) + np.diag(dl[1:], -1) + np.diag(du[:-1], 1)
    want = np.linalg.solve(dense.astype(np.float64), rhs.astype(np.float64))
    back = load(tmp_path / "g.json")
    np.testing.assert_allclose(np.asarray(interpret(back, dl, d, du, rhs)), want, rtol=1e-6)
    # the module keeps its VJP: d sum(A^-1 b) / db = A^-T 1
    b = GraphBuilder.from_graph(back)
    total = b.exec(ops.reduce_sum(axes=(0, 1)), back.symbols[back.outputs[0]])
    grads, _ = backward(b.build([total]), total, [back.symbols[back.inputs[3]]])
    got = interpret(grads, dl, d, du, rhs)[-1]
    want_grad = np.linalg.solve(dense.T.astype(np.float64), np.ones((4, 2)))
    np.testing.assert_allclose(np.asarray(got), want_grad, rtol=1e-5)
