"""The numerics check names the first node that makes a NaN or an infinity; the
interpreter's hook sees (and can replace) every node's values; profiles see node names."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import config, ops
from fnnc.errors import GraphError, NumericsError
from fnnc.graph import GraphBuilder, compile, interpret, tensor_stats
from tests.helpers import assert_close


def _nan_maker():
    """log(x - x) is -inf, and -inf * 0 is NaN: node 'log' is the first bad one."""
    b = GraphBuilder()
    x = b.input((3,), name="x")
    z = b.exec(ops.add(q=-1.0), x, x, name="zero")
    lg = b.exec(ops.ewlog(), z, name="log")
    y = b.exec(ops.scalar_mul(a=0.0), lg, name="times0")
    return b.build([y])


X = np.array([1.0, 2.0, 3.0], np.float32)


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_numerics_names_the_first_bad_node(mode):
    graph = _nan_maker()
    run = (lambda *a: interpret(graph, *a)) if mode == "interpret" else None
    with config.override(numerics=True):
        run = run or compile(graph)
        with pytest.raises(NumericsError, match=r"node 1 \(log, ewlog\)") as err:
            run(X)
    text = str(err.value)
    assert "input  %1 (zero): f32[3] min=0 max=0" in text
    assert "inf=3" in text
    assert "already held" not in text  # node 'log' made it from finite inputs
    bad = np.array([1.0, np.inf, 3.0], np.float32)  # the data is the cause: it says so
    with config.override(numerics=True), pytest.raises(NumericsError) as err:
        (interpret(graph, bad) if mode == "interpret" else compile(graph)(bad))
    assert "Input %0 (x) already held a NaN or an infinity" in str(err.value)


def test_numerics_off_by_default_and_finite_runs_pass():
    graph = _nan_maker()
    out = compile(graph)(X)
    assert np.isnan(np.asarray(out)).all()
    b = GraphBuilder()
    x = b.input((3,), name="x")
    ok = b.build([b.exec(ops.tanh(), x)])
    with config.override(numerics=True):
        assert_close(compile(ok)(X), np.tanh(X))


def test_on_node_sees_and_replaces_values():
    graph = _nan_maker()
    seen = []

    def hook(index, node, inputs, outputs):
        seen.append((node.name, tensor_stats(outputs[0]).finite))
        if node.name == "log":
            return (np.zeros(3, np.float32),)
        return None

    out = interpret(graph, X, on_node=hook)
    assert seen == [("zero", True), ("log", False), ("times0", True)]
    assert_close(out, np.zeros(3))
    with pytest.raises(GraphError, match="on_node replaced"):
        interpret(graph, X, on_node=lambda i, n, a, o: (np.zeros(2, np.float32),))


def test_tensor_stats():
    s = tensor_stats(np.array([1.0, np.nan, np.inf, 3.0], np.float32))
    assert (s.min, s.max, s.mean, s.nan, s.inf, s.finite) == (1.0, 3.0, 2.0, 1, 1, False)
    assert tensor_stats(np.arange(4, dtype=np.int32)).max == 3.0


def test_tensor_stats_counts_nan_in_every_float_type_and_complex_parts():
    """float8_e4m3fn (NumPy kind 'V') holds NaN too; a complex value is NaN where a
    part is NaN, else infinite where a part is, and the statistics are of |z|."""
    import ml_dtypes

    for dtype in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.bfloat16):
        s = tensor_stats(np.array([1.0, np.nan, 2.0], dtype))
        assert (s.nan, s.inf, s.finite, s.min, s.max) == (1, 0, False, 1.0, 2.0), dtype
    z = np.array([complex(np.nan, np.inf), complex(1, np.inf), 3 + 4j, 0 + 1j], np.complex64)
    s = tensor_stats(z)
    assert (s.nan, s.inf) == (1, 1)
    np.testing.assert_allclose([s.min, s.max, s.mean], [1.0, 5.0, 3.0])


def test_compiled_hlo_carries_node_names():
    assert "times0" in compile(_nan_maker()).compiled_text()


def test_on_node_hooks_of_fewer_arguments_get_the_node_and_its_values():
    """Issue 16's hook "called after each node with the node and its values": a function
    of (node, outputs) or (node, inputs, outputs) is called so, and may replace outputs
    as the four-argument form does; other arities are a GraphError."""
    b = GraphBuilder()
    x = b.input((2,))
    graph = b.build([b.exec(ops.ewexp(), b.exec(ops.relu(), x))])
    seen = []

    def two(node, values):
        seen.append((node.cmd.name, np.asarray(values[0]).tolist()))
        return [values[0] * 0] if node.cmd.name == "relu" else None

    out = interpret(graph, np.array([-1.0, 2.0], np.float32), on_node=two)
    assert seen == [("relu", [0.0, 2.0]), ("ewexp", [1.0, 1.0])]
    np.testing.assert_array_equal(np.asarray(out), [1.0, 1.0])  # exp(0): the replacement
    three = []
    interpret(graph, np.ones(2, np.float32), on_node=lambda n, i, o: three.append(len(i)))
    assert three == [1, 1]
    kept = []
    interpret(graph, np.ones(2, np.float32), on_node=lambda n, o, verbose=False: kept.append(o))
    assert [len(o) for o in kept] == [1, 1] and kept[1][0].shape == (2,)  # outputs, not inputs
    with pytest.raises(GraphError, match="takes 1 positional argument"):
        interpret(graph, np.ones(2, np.float32), on_node=lambda node: None)
    with pytest.raises(GraphError, match="is not callable"):
        interpret(graph, np.ones(2, np.float32), on_node="print")
