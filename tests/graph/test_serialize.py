"""save/load round trips (constants, aliases, output trees) and rejection of non-graphs."""

import contextlib
import json
import sqlite3
import sys

import jax
import pytest

from fnnc import ops
from fnnc.errors import GraphError, GraphFormatError, UnknownCommandError
from fnnc.graph import GraphBuilder, from_data, interpret, load, save, to_data
from tests.helpers import assert_close, rand


def _graph():
    b = GraphBuilder()
    x = b.input((4, 6), name="x")
    w = b.input((3, 6), name="w")
    c = b.constant(rand([1, 3], seed=3), name="c")
    y = b.exec(ops.gemm(transpose_b=True), x, w, name="fc")
    y = b.exec(ops.add(q=-1.0), y, c)
    y = b.exec(ops.clamp(min=0.0, max=float("inf")), y)
    v = b.alias(x, (2, 3), offset=(1, 2), name="view")
    r = b.tensor((2, 3), name="r")
    b.exec(ops.scalar_mul(a=2.0), v, outputs=[b.alias(r, (2, 3))])
    tree = jax.tree.structure({"y": 0, "pair": (0, None, [0])})
    return b.build([y, r, v], out_tree=tree)


def test_round_trip_is_equal_and_computes_the_same(tmp_path):
    g = _graph()
    path = tmp_path / "g.json"
    save(g, path)
    back = load(path)
    assert back == g and str(back) == str(g)
    xs = (rand([4, 6]), rand([3, 6], seed=1))
    assert_close(interpret(back, *xs), interpret(g, *xs))
    assert set(interpret(back, *xs)) == {"y", "pair"}


def test_a_backward_graph_round_trips():
    """Gradient graphs hold ``set`` nodes whose dtype parameter is a ``np.dtype``."""
    from fnnc.graph.passes.backward import backward

    g = _graph()
    b = GraphBuilder.from_graph(g)
    y = g.symbols[g.outputs[0]]
    f = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.ewexp(), y))
    grads, _ = backward(b.build([f]), f, [g.symbols[g.inputs[1]]])
    assert any(n.cmd.name == "set" for n in grads.nodes)
    back = from_data(json.loads(json.dumps(to_data(grads))))
    assert back == grads


def test_data_is_plain_json():
    text = json.dumps(to_data(_graph()))
    assert from_data(json.loads(text)) == _graph()


def test_not_a_graph_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("hello")
    with pytest.raises(GraphFormatError, match="not an fnnc graph"):
        load(bad)
    bad.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(GraphFormatError, match="not an fnnc graph"):
        load(bad)
    bad.write_bytes(b"\x80\x81\x00")
    with pytest.raises(GraphFormatError):
        load(bad)
    assert issubclass(GraphFormatError, ValueError)


def test_malformed_and_unknown_command():
    data = to_data(_graph())
    broken = dict(
        data,
        nodes=[
            {"cmd": {"name": "no_such_cmd", "params": []}, "inputs": [], "outputs": [0], "name": ""}
        ],
    )
    with pytest.raises(UnknownCommandError, match="no_such_cmd"):
        from_data(broken)
    with pytest.raises(GraphFormatError, match=r"shape .x. must be a list of non-negative"):
        from_data(dict(data, symbols=[{"shape": "x"}]))
    lit = dict(data)
    lit["nodes"] = [dict(n) for n in data["nodes"]]
    const = next(n for n in lit["nodes"] if n["cmd"]["name"] == "constant")
    const["cmd"] = {
        "name": "constant",
        "params": [["value", {"$literal": "AAAA", "shape": [9], "dtype": "float32"}]],
    }
    with pytest.raises(GraphFormatError, match="bytes"):
        from_data(lit)


def _edited(edit):
    import copy

    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    w = b.input((4, 3), name="w")
    g = b.build([b.exec(ops.gemm(transpose_b=True), x, w, name="fc")])
    data = copy.deepcopy(to_data(g))
    edit(data)
    return data


def _param(data, key, value):
    params = data["nodes"][0]["cmd"]["params"]
    for p in params:
        if p[0] == key:
            p[1] = value
            return
    params.append([key, value])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: _param(d, "transpose_b", "yes"), r"node 0.*'transpose_b' is 'yes'.*bool"),
        (lambda d: _param(d, "no_such", 1), r"gemm has no parameter 'no_such'"),
        (lambda d: d["symbols"][0].update(shape=[-2, 3]), r"symbol %0: shape \[-2, 3\]"),
        (lambda d: d["symbols"][0].update(dtype="O"), r"symbol %0: dtype 'O' is not a tensor"),
    ],
)
def test_hand_edited_files_fail_naming_the_place(edit, message):
    with pytest.raises(GraphFormatError, match=message):
        from_data(_edited(edit))


def test_a_missing_parameter_takes_its_default():
    def drop(d):
        d["nodes"][0]["cmd"]["params"] = [
            p for p in d["nodes"][0]["cmd"]["params"] if p[0] != "transpose_a"
        ]

    g = from_data(_edited(drop))
    assert g.nodes[0].cmd.param("transpose_a") is False


def test_a_huge_literal_without_data_is_refused_before_allocating():
    from fnnc.graph.serialize import _dec

    bad = {"$literal": "", "shape": [2**32, 2**32], "dtype": "float32"}
    with pytest.raises(GraphFormatError, match="has 0 bytes"):
        _dec(bad, "node 0")


def test_save_cleans_up_when_the_write_fails(tmp_path, monkeypatch):
    import os

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        save(_graph(), str(tmp_path / "g.json"))
    assert list(tmp_path.iterdir()) == []


def test_nan_hyper_parameter_graphs_are_equal_after_a_round_trip(tmp_path):
    """``clamp(max=nan)``: NaN != NaN, yet the command, a rebuilt graph and a loaded
    copy compare equal and hash alike (one NaN object is kept)."""
    import numpy as np

    def build():
        b = GraphBuilder()
        x = b.input((2,), name="x")
        return b.build([b.exec(ops.clamp(max=float("nan")), x)])

    graph = build()
    assert ops.clamp(max=np.float64("nan")) == ops.clamp(max=float("nan"))
    assert graph == build() and hash(graph) == hash(build())
    save(graph, tmp_path / "g.json")
    assert load(tmp_path / "g.json") == graph


def test_negative_zero_hyper_parameters_are_not_positive_zero(tmp_path):
    """``0.0 == -0.0`` in Python, yet ``scalar_mul(a=-0.0)`` gives -0.0 (``1 / x``:
    -inf): the two commands shared compiled programs and CSE merged their nodes, so
    whichever ran first answered for both. They differ now, and stay so through a file
    and a pickle."""
    import pickle

    import numpy as np

    from fnnc.graph import compile, interpret
    from fnnc.graph.passes import cse

    neg, pos = ops.scalar_mul(a=-0.0), ops.scalar_mul(a=0.0)
    assert neg != pos and hash(neg) != hash(pos) and neg == ops.scalar_mul(a=-0.0)
    assert pickle.loads(pickle.dumps(neg)) == neg
    ones = np.ones(2, np.float32)
    np.testing.assert_array_equal(np.signbit(np.asarray(neg(ones))), [True, True])
    np.testing.assert_array_equal(np.signbit(np.asarray(pos(ones))), [False, False])
    b = GraphBuilder()
    x = b.input((2,), name="x")
    outs = [b.exec(ops.ewdiv(), x, b.exec(c, x)) for c in (neg, pos)]
    graph = b.build(outs)
    want = [np.full(2, -np.inf), np.full(2, np.inf)]
    for run in (interpret, compile(graph), compile(cse(graph))):
        got = run(graph, ones) if run is interpret else run(ones)
        np.testing.assert_array_equal(np.asarray(got[0]), want[0])
        np.testing.assert_array_equal(np.asarray(got[1]), want[1])
    save(graph, tmp_path / "g.json")
    assert load(tmp_path / "g.json") == graph


def test_save_refuses_to_write_json_over_a_tensor_file(tmp_path):
    """save(graph, "x.sqlite3") without name= replaced an NNC tensor file (its weights)
    with JSON; it refuses, saying to pass name=, and the tensors stay readable."""
    import numpy as np

    from fnnc.io import TensorFile

    path = tmp_path / "model.sqlite3"
    weights = np.arange(9, dtype=np.float32).reshape(3, 3)
    with TensorFile(path) as f:
        f.write("weights", weights)
    before = path.read_bytes()
    g = _graph()
    with pytest.raises(GraphFormatError, match=r"SQLite tensor file.*Pass name=") as info:
        save(g, str(path))
    assert str(path) in str(info.value)
    assert path.read_bytes() == before
    save(g, str(path), name="graph")  # what the error says to do works
    assert load(str(path), name="graph") == g
    with TensorFile(path) as f:
        np.testing.assert_array_equal(f.read("weights"), weights)


def _file_with(tmp_path, edit):
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(_edited(edit)))
    return path


@pytest.mark.parametrize(
    ("edit", "kind", "message"),
    [
        (lambda d: d["nodes"][0]["cmd"].update(name="gemm9"), UnknownCommandError, "'gemm9'"),
        (lambda d: d["symbols"][2].update(shape=[2, 5]), GraphError, r"declares %2 \(fc\)"),
        (lambda d: d["symbols"][2].update(dtype="int32"), GraphError, r"%2 \(fc\)"),
    ],
)
def test_every_load_error_names_the_file_and_keeps_its_kind(tmp_path, edit, kind, message):
    """Only GraphFormatError named the file; an unknown command (a file from a newer
    fnnc) or a verify failure did not. Each names it now and stays its own kind."""
    path = _file_with(tmp_path, edit)
    with pytest.raises(kind, match=message) as info:
        load(path)
    assert type(info.value) is kind and f"(file {path})" in str(info.value)
    tensors = tmp_path / "t.sqlite3"  # the same graph in a tensor file
    save(_graph(), tensors, name="g")
    with contextlib.closing(sqlite3.connect(tensors)) as db, db:
        db.execute("UPDATE fnnc_graphs SET data=? WHERE name='g'", (path.read_text(),))
    with pytest.raises(kind, match=message) as info:
        load(tensors, name="g")
    assert type(info.value) is kind and "(graph 'g' in " in str(info.value)


@pytest.mark.parametrize(
    ("edit", "where", "bad"),
    [
        (lambda d: d["nodes"][0].update(inputs=[0, 7]), "node 0 (fc): input", 7),
        (lambda d: d["nodes"][0].update(inputs=[-1, 1]), "node 0 (fc): input", -1),
        (lambda d: d["nodes"][0].update(outputs=[3]), "node 0 (fc): output", 3),
        (lambda d: d.update(outputs=[9]), "graph output", 9),
        (lambda d: d.update(inputs=[0, 5]), "graph input", 5),
    ],
)
def test_an_out_of_range_symbol_id_is_reported_as_such(tmp_path, edit, where, bad):
    """A node input past the symbols was reported as 'gemm cannot take the file's
    parameters {}' (the shape rule's IndexError), and -1 silently meant the last symbol."""
    path = _file_with(tmp_path, edit)
    with pytest.raises(GraphFormatError) as info:
        load(path)
    message = str(info.value)
    assert f"load: {where} {bad} is not a symbol id: the file has 3 symbols (%0..%2)" in message
    assert "parameters" not in message and f"(file {path})" in message


def test_an_id_past_the_symbols_is_not_blamed_on_the_parameters(tmp_path, monkeypatch):
    """_rule_failure indexed the symbols inside its try, so an id that escaped _check_ids
    became 'gemm cannot take the file's parameters {} (IndexError)'; verify's error, which
    names the id, now stands."""
    monkeypatch.setattr(sys.modules["fnnc.graph.serialize"], "_check_ids", lambda graph: None)
    path = _file_with(tmp_path, lambda d: d["nodes"][0].update(inputs=[0, 7]))
    with pytest.raises(GraphError, match="%7") as info:
        load(path)
    assert "parameters" not in str(info.value)
