"""save/load round trips (constants, aliases, output trees) and rejection of non-graphs."""

import json

import jax
import pytest

from fnnc import ops
from fnnc.errors import GraphFormatError, UnknownCommandError
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
    with pytest.raises(GraphFormatError, match="malformed"):
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
