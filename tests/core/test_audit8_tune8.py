"""Audit 8 (tuning): autotune table keys say what a command computes, and damaged
table files are clear errors."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.core.command import lookup
from fnnc.graph import GraphBuilder, interpret
from fnnc.graph.autotune import autotune_graph

HERE = jax.default_backend()
SPEC = [jax.ShapeDtypeStruct((4,), np.float32)]


def body(second):
    """A graph of exp then ``second`` on a float32[4]."""
    b = GraphBuilder()
    x = b.input((4,))
    return b.build([b.exec(second(), b.exec(ops.ewexp(), x))])


@pytest.fixture
def fused_rival():
    """A second backend of fused_elementwise that compiles here (the reference forward)."""
    forward = lookup("fused_elementwise").forward
    ops.register_backend("fused_elementwise", ops.Backend("rival", forward, (HERE,), priority=0))
    yield
    ops.unregister_backend("fused_elementwise", "rival")
    ops.autotune.TABLE.clear()


def test_chains_fused_on_the_same_shapes_get_keys_of_their_own():
    """Every sub-graph printed as <Graph: 1 inputs, 2 nodes, 1 outputs>: exp+relu and
    exp+sigmoid shared one key, so one's winner ran the other."""
    relu = ops.fused_elementwise(body=body(ops.relu))
    sigmoid = ops.fused_elementwise(body=body(ops.sigmoid))
    again = ops.fused_elementwise(body=body(ops.relu))
    key = ops.autotune.key
    assert key(relu, SPEC, "cpu") != key(sigmoid, SPEC, "cpu")
    assert key(relu, SPEC, "cpu") == key(again, SPEC, "cpu")  # equal graphs, one key


def test_a_sub_graph_key_is_the_same_in_another_process():
    """A saved table applies to the same graph built again elsewhere: the key of a graph
    built separately (other objects, other addresses) is the same, and its text holds
    no memory address or object identity, the parts that differ between processes.
    (In-process: a child process importing JAX had cost 4 s.)"""
    import re

    first = ops.fused_elementwise(body=body(ops.relu))
    keep = [body(ops.sigmoid) for _ in range(3)]  # other graphs alive: other addresses
    second = ops.fused_elementwise(body=body(ops.relu))
    assert first.param("body") is not second.param("body") and keep
    key = ops.autotune.key(first, SPEC, "cpu")
    assert key == ops.autotune.key(second, SPEC, "cpu")
    assert re.search(r"0x[0-9a-f]+| at 0x|<Graph|object at", key) is None
    ids = {str(id(x)) for x in (first, first.param("body"), *first.param("body").nodes)}
    assert not any(i in key for i in ids)


def test_a_function_parameter_keys_by_name_not_address():
    from fnnc.core.backends import stable_param

    text = repr(stable_param((("policy", _policy),)))
    assert "0x" not in text and "_policy" in text


def _policy(*args):
    return True


def test_autotune_graph_times_each_fused_chain(fused_rival):
    """Both chains are timed and keep winners of their own (before, the second node
    was skipped as already pending under the first's key)."""
    b = GraphBuilder()
    x = b.input((4,), name="x")
    relu = b.exec(ops.fused_elementwise(body=body(ops.relu)), x, name="a")
    sig = b.exec(ops.fused_elementwise(body=body(ops.sigmoid)), x, name="b")
    graph = b.build([relu, sig])
    value = np.linspace(-1, 1, 4, dtype=np.float32)
    tuned = autotune_graph(graph, value, repeats=1, check=False, libraries=False)
    assert set(tuned) == {0, 1}
    keys = {ops.autotune.key(n.cmd, SPEC, HERE) for n in graph.nodes}
    assert len(keys) == 2 and keys <= set(ops.autotune.TABLE)
    got = interpret(graph, value)
    np.testing.assert_allclose(got[0], np.maximum(np.exp(value), 0), rtol=1e-6)
    np.testing.assert_allclose(got[1], 1 / (1 + np.exp(-np.exp(value))), rtol=1e-6)


@pytest.mark.parametrize("content", [b"\xff\xfe\x00 not text", b"[1, 2]", b"{"])
def test_a_table_file_of_other_bytes_is_a_clear_error(tmp_path, content):
    """Bytes that are not UTF-8 raised a bare UnicodeDecodeError naming no file (and
    save over such a file too); a JSON list in the defaults file an AttributeError."""
    from fnnc.core import measured
    from fnnc.errors import GraphFormatError

    path = tmp_path / "table.json"
    path.write_bytes(content)
    with pytest.raises(GraphFormatError, match=r"table\.json: not an fnnc autotune table"):
        ops.autotune.load(path)
    with pytest.raises(GraphFormatError, match=r"save: .*table\.json: not an fnnc autotune"):
        ops.autotune.save(path)
    assert path.read_bytes() == content  # left as it was
    with pytest.raises(
        GraphFormatError, match=r"measured defaults .*table\.json: .*regenerate|not JSON"
    ):
        measured.read(path)


def test_measure_defaults_refuses_no_repeats_before_timing(monkeypatch, capsys):
    """--repeats 0 compiled every case, then failed in statistics.median of no runs. A
    command-line mistake: argparse's usage line and exit status 2, in check_repeats'
    words."""
    from fnnc.errors import BackendError
    from fnnc.ops import measure_defaults

    def never(*args, **kwargs):
        raise AssertionError("timed something")

    monkeypatch.setattr(measure_defaults, "_ratios", never)
    with pytest.raises(SystemExit) as exit_:
        measure_defaults.main(["--repeats", "0", "--sizes", "small"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ")
    assert "error: --repeats must be an int >= 1, got 0" in err
    with pytest.raises(BackendError, match=r"measure_defaults: repeats must be an int >= 1"):
        measure_defaults.measure("cpu", sizes=["small"], repeats=0)


def _scaled(x, *, a):
    return x * a


def test_partials_of_one_function_key_by_their_arguments():
    """A partial was keyed by its function alone: partial(f, a=1) and partial(f, a=2)
    shared an autotune key, so one's measured winner ran the other. Oracle: the key
    follows what the partial computes (its value at 1.0)."""
    from fnnc.core.backends import stable_param

    def key(p):
        return repr(stable_param((("policy", p),)))

    one, two = functools.partial(_scaled, a=1), functools.partial(_scaled, a=2)
    assert one(1.0) != two(1.0) and key(one) != key(two)
    assert key(one) == key(functools.partial(_scaled, a=1))  # equal partials, one key
    assert key(functools.partial(_scaled, 1)) != key(functools.partial(_scaled, 2))
    assert "0x" not in key(one) and "_scaled" in key(one)


def with_constant(value):
    """A graph of exp then + a float32[3] constant filled with ``value``."""
    b = GraphBuilder()
    x = b.input((3,))
    c = b.exec(ops.constant(np.full(3, value, np.float32)))
    return b.build([b.exec(ops.add(), b.exec(ops.ewexp(), x), c)])


def test_chains_differing_only_in_a_constant_get_keys_of_their_own():
    """A constant inside a sub-graph prints as <float32[3]> whatever its value; the key
    now holds a sha256 of its bytes. Oracle: interpret gives different values for the
    two chains, so they must not share a measured winner."""
    spec = [jax.ShapeDtypeStruct((3,), np.float32)]
    one, two = with_constant(1.0), with_constant(2.0)
    x = np.zeros(3, np.float32)
    assert not np.array_equal(interpret(one, [x])[0], interpret(two, [x])[0])
    key = ops.autotune.key
    k1 = key(ops.fused_elementwise(body=one), spec, "cpu")
    assert k1 != key(ops.fused_elementwise(body=two), spec, "cpu")
    assert k1 == key(ops.fused_elementwise(body=with_constant(1.0)), spec, "cpu")
    assert key(ops.constant(np.float32(1)), [], "cpu") != key(
        ops.constant(np.float32(2)), [], "cpu"
    )
