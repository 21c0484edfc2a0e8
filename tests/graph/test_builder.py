"""GraphBuilder: NNC's autograd example, the SSA listing, Graphviz, and aliases read and
written against NumPy views worked out independently."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError, ShapeError
from fnnc.graph import AliasSymbol, Graph, GraphBuilder, compile, interpret, to_dot, verify
from tests.helpers import assert_close


def _run_both(graph: Graph, *xs: np.ndarray) -> tuple[list, list]:
    n = len(graph.outputs)
    got_i, got_c = interpret(graph, *xs), compile(graph)(*xs)
    return (list(got_i), list(got_c)) if n > 1 else ([got_i], [got_c])


# -- NNC's autograd example ------------------------------------------------------------


def _autograd_example() -> Graph:
    """w = x*x, u = 1/x, v = log u, z = w + v (NNC's test/unit/nnc/autograd.tests.c)."""
    b = GraphBuilder()
    x = b.input((), name="x")
    w = b.exec(ops.ewprod(), x, x, name="w")
    u = b.exec(ops.ewdiv(), b.constant(np.float32(1.0), name="one"), x, name="u")
    v = b.exec(ops.ewlog(), u, name="v")
    z = b.exec(ops.ewsum(), w, v, name="z")
    return b.build([z])


def test_autograd_example_value() -> None:
    graph = _autograd_example()
    x = np.float32(0.84)
    closed_form = 0.84 * 0.84 + np.log(1 / 0.84)
    assert abs(closed_form - 0.879953387) < 1e-9
    for got in (interpret(graph, x), compile(graph)(x)):
        got = np.asarray(got)
        assert got.dtype == np.float32 and got.shape == ()
        assert abs(float(got) - 0.879953387) < 1e-6


def test_autograd_example_structure() -> None:
    graph = _autograd_example()
    assert [n.cmd.name for n in graph.nodes] == ["ewprod", "constant", "ewdiv", "ewlog", "ewsum"]
    assert [n.name for n in graph.nodes] == ["w", "one", "u", "v", "z"]
    assert graph.output_specs[0].shape == () and graph.input_specs[0].dtype == np.float32


# -- text and dot -------------------------------------------------------------------------


def _small_graph() -> Graph:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    w = b.input((4, 3), name="w")
    h = b.exec(ops.gemm(transpose_b=True), x, w, name="fc")
    t = b.tensor((2, 8), name="cat")
    left = b.alias(t, (2, 4), name="left")
    right = b.alias(t, (2, 4), offset=(0, 4), name="right")
    b.exec(ops.scalar_mul(a=0.5), h, outputs=[left], name="half")
    b.exec(ops.clamp(min=0.0), h, outputs=[right], name="relu")
    y = b.exec(ops.ewsum(), t, b.constant(np.float32(1.0)))
    return b.build([y, h])


GOLDEN = """\
graph(%0:f32[2,3] x, %1:f32[4,3] w) {
  tensor %3:f32[2,8]  # cat
  %4:f32[2,4] = alias %3[base=0, stride=(8,1)]  # left
  %5:f32[2,4] = alias %3[base=4, stride=(8,1)]  # right
  %2:f32[2,4] = gemm[transpose_b=True](%0, %1)  # fc
  %4:f32[2,4] = scalar_mul[a=0.5](%2)  # half
  %5:f32[2,4] = clamp[min=0.0](%2)  # relu
  %6:f32[] = constant[value=1.0]()
  %7:f32[2,8] = ewsum(%3, %6)
  return %7, %2
}"""


def test_golden_listing() -> None:
    assert str(_small_graph()) == GOLDEN


def test_small_graph_values() -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
    w = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
    h = x.astype(np.float64) @ w.T.astype(np.float64)
    want = [np.concatenate([0.5 * h, np.maximum(h, 0)], axis=1) + 1.0, h]
    for got in _run_both(_small_graph(), x, w):
        assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_to_dot_names_every_node_and_symbol() -> None:
    graph = _small_graph()
    dot = to_dot(graph)
    assert dot.startswith("digraph fnnc {") and dot.endswith("}")
    for sym in graph.symbols:
        assert f"  t{sym.id} [shape=ellipse" in dot
        assert f"%{sym.id}:f32[{','.join(map(str, sym.shape))}]" in dot
        if sym.name:
            assert f'label="{sym.name}\\n%{sym.id}:' in dot
        if isinstance(sym, AliasSymbol):
            assert f"  t{sym.root} -> t{sym.id} [style=dashed" in dot
    for i, node in enumerate(graph.nodes):
        assert f'  n{i} [shape=box, label="{node.cmd}' in dot
        for s in node.inputs:
            assert f"  t{s} -> n{i};" in dot
        for s in node.outputs:
            assert f"  n{i} -> t{s};" in dot
    assert dot.count("[shape=box") == len(graph.nodes)
    assert dot.count("[shape=ellipse") == len(graph.symbols)


def test_to_dot_quotes_names_with_backslashes_quotes_and_line_breaks() -> None:
    """Each label is one well-formed DOT string (a name ending in a backslash must not
    escape its closing quote) that reads back as the name."""
    import re

    names = ["layer\\", 'say "hi"', "two\nlines"]
    b = GraphBuilder()
    h = b.input((2,), name="x")
    for name in names:
        h = b.exec(ops.relu(), h, name=name)
    dot = to_dot(b.build([h]))
    quoted = re.compile(r'^  n\d+ \[shape=box, label="((?:[^"\\]|\\.)*)"\];$', re.M)
    labels = [m.group(1) for m in quoted.finditer(dot)]
    assert len(labels) == len(names)
    unescape = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
    read = [re.sub(r"\\.", lambda m: unescape[m.group(0)], text) for text in labels]
    assert read == [f"relu\n{name}" for name in names]


# -- aliases read ---------------------------------------------------------------------------


def test_aliases_read_like_numpy_views() -> None:
    """Slices, reshapes, aliases of aliases and explicit NNC strides, read as node inputs
    and returned directly, against NumPy views of the same buffer."""
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    flat = np.arange(32, dtype=np.float32)
    b = GraphBuilder()
    xs = b.input((4, 5), name="x")
    fs = b.input((32,), name="flat")
    root48 = b.alias(fs, (4, 8), name="as4x8")  # a reshape of the flat input
    views = {
        "slice": (b.alias(xs, (2, 3), offset=(1, 2)), x[1:3, 2:5]),
        "row block": (b.alias(xs, (2, 5), offset=(2, 0)), x[2:4]),
        "reshape down": (b.alias(xs, (20,)), x.reshape(-1)),
        "reshape up": (b.alias(xs, (2, 2, 5)), x.reshape(2, 2, 5)),
        "reshape same rank": (b.alias(xs, (5, 4), stride=(4, 1)), x.reshape(5, 4)),
        "transpose by strides": (b.alias(xs, (5, 4), stride=(1, 5)), x.T),
        "column": (b.alias(xs, (4, 1), offset=(0, 3)), x[:, 3:4]),
    }
    outer = b.alias(xs, (3, 4), offset=(1, 1))  # x[1:4, 1:5]
    inner = b.alias(outer, (2, 2), offset=(1, 2))  # outer[1:3, 2:4] == x[2:4, 3:5]
    views["alias of alias"] = (inner, x[1:4, 1:5][1:3, 2:4])
    block = b.alias(xs, (2, 5), offset=(1, 0))  # x[1:3], contiguous
    views["reshape of a contiguous alias"] = (b.alias(block, (10,)), x[1:3].reshape(-1))
    # NNC's rule: the view starts at sum(offset[d] * stride[d]) of the root's buffer.
    nnc = b.alias(root48, (2, 2), offset=(1, 2), stride=(8, 2))
    views["nnc offset rule"] = (nnc, np.array([[12, 14], [20, 22]], np.float32))
    nested = b.alias(nnc, (1, 2), offset=(1, 0))  # row 1 of the nnc view
    views["nnc alias of alias"] = (nested, np.array([[20, 22]], np.float32))

    assert inner.root == xs.id and inner.base == 2 * 5 + 3 and inner.stride == (5, 1)
    assert nnc.root == fs.id and nnc.base == 12 and nested.base == 20

    outs, want = [], []
    for sym, value in views.values():
        outs += [sym, b.exec(ops.scalar_mul(a=2.0), sym)]  # returned as is, and read by a node
        want += [value, 2 * value]
    graph = b.build(outs)
    for got in _run_both(graph, x, flat):
        for k, (name, g, w) in enumerate(zip(np.repeat(list(views), 2), got, want)):
            assert_close(g, w, rtol=0, atol=0, what=f"{name} (output {k})")


def test_reshape_of_a_strided_view_needs_explicit_strides() -> None:
    """A default reshape of a non-contiguous slice is not a view of consecutive
    elements; the builder refuses it instead of silently reading other elements."""
    b = GraphBuilder()
    x = b.input((4, 4), name="x")
    corner = b.alias(x, (2, 2), offset=(1, 1), name="corner")
    with pytest.raises(ShapeError, match=r"corner.*stride="):
        b.alias(corner, (4,))
    # With explicit strides the same elements can still be viewed (as a [2, 1, 2] view).
    view = b.alias(corner, (2, 1, 2), stride=(4, 1, 1))
    xs = np.arange(16, dtype=np.float32).reshape(4, 4)
    got = interpret(b.build([view]), xs)
    assert_close(got, xs[1:3, 1:3].reshape(2, 1, 2), rtol=0, atol=0)


def test_alias_outside_its_root_is_refused() -> None:
    b = GraphBuilder()
    x = b.input((4, 5), name="x")
    with pytest.raises(ShapeError, match=r"tail.*%0 \(x\) has 20 elements"):
        b.alias(x, (2, 3), offset=(3, 0), name="tail")
    with pytest.raises(ShapeError, match="one entry per view axis"):
        b.alias(x, (2, 3), offset=(0, 0, 0))


# -- aliases written ------------------------------------------------------------------------


def test_disjoint_alias_writes_assemble_the_root() -> None:
    """Three disjoint writes (a row block, a column slice, a transposed strided view)
    fill a fresh tensor; a later node reads it whole and through a piece."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, (2, 6)).astype(np.float32)
    y = rng.uniform(-2, 2, (2, 3)).astype(np.float32)
    b = GraphBuilder()
    xs = b.input((2, 6), name="x")
    ys = b.input((2, 3), name="y")
    t = b.tensor((4, 6), name="t")
    top = b.alias(t, (2, 6), name="top")  # rows 0:2
    lower_left = b.alias(t, (2, 3), offset=(2, 0), name="lower_left")
    lower_right_t = b.alias(t, (3, 2), offset=(3, 2), stride=(1, 6), name="lower_right_t")
    assert lower_right_t.base == 15
    b.exec(ops.ewexp(), xs, outputs=[top], name="w_top")
    b.exec(ops.scalar_mul(a=-3.0), ys, outputs=[lower_left], name="w_ll")
    yt = b.alias(ys, (3, 2), stride=(1, 3), name="y_t")
    b.exec(ops.ewabs(), yt, outputs=[lower_right_t], name="w_lr")
    total = b.exec(ops.ewsum(), t, b.constant(np.float32(0.5)), name="read_whole")
    piece = b.exec(ops.ewprod(), lower_left, lower_left, name="read_piece")
    graph = b.build([t, total, piece])

    want_t = np.empty((4, 6))
    want_t[0:2] = np.exp(x.astype(np.float64))
    want_t[2:4, 0:3] = -3.0 * y
    want_t[2:4, 3:6] = np.abs(y)  # written transposed from a transposed read
    want = [want_t, want_t + 0.5, (-3.0 * y.astype(np.float64)) ** 2]
    for got in _run_both(graph, x, y):
        assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_unwritten_part_of_an_alias_written_root_is_zero() -> None:
    b = GraphBuilder()
    x = b.input((2,), name="x")
    t = b.tensor((3, 2), name="t")
    b.exec(ops.ewsum(), x, outputs=[b.alias(t, (2,), stride=(1,))])  # row 0
    b.exec(ops.scalar_mul(a=2.0), x, outputs=[b.alias(t, (2,), offset=(4,), stride=(1,))])
    graph = b.build([t])
    xs = np.array([1.5, -2.0], np.float32)
    for got in _run_both(graph, xs):
        assert_close(got, [np.array([[1.5, -2.0], [0.0, 0.0], [3.0, -4.0]])], rtol=0, atol=0)


def test_exec_into_outputs_checks_their_spec() -> None:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    wrong = b.tensor((3, 2), name="wrong")
    with pytest.raises(ShapeError, match=r"%1 \(wrong\) is float32\[3, 2\].*float32\[2, 3\]"):
        b.exec(ops.ewexp(), x, outputs=[wrong], name="e")


def test_exec_wants_a_command_and_symbols() -> None:
    b = GraphBuilder()
    x = b.input((2,), name="x")
    with pytest.raises(CommandError, match="call the factory"):
        b.exec(ops.ewexp, x)
    with pytest.raises(CommandError, match=r"builder\.constant"):
        b.exec(ops.ewexp(), np.ones(2, np.float32))


# -- the graph value -------------------------------------------------------------------------


def test_builder_keeps_going_after_build_and_graphs_stay_frozen() -> None:
    b = GraphBuilder()
    x = b.input((3,), name="x")
    y = b.exec(ops.ewexp(), x)
    first = b.build([y])
    z = b.exec(ops.ewlog(), y)
    second = b.build([z])
    assert len(first.nodes) == 1 and len(second.nodes) == 2
    assert verify(first) is first
    xs = np.array([0.0, 1.0, -1.0], np.float32)
    assert_close(interpret(second, xs), xs, rtol=1e-6, atol=1e-6)
    with pytest.raises((AttributeError, TypeError)):
        first.nodes = ()  # type: ignore[misc]


def test_equal_builds_give_equal_hashable_graphs() -> None:
    def build(c: float) -> Graph:
        b = GraphBuilder()
        x = b.input((2, 2), name="x")
        return b.build([b.exec(ops.ewsum(), x, b.constant(np.float32(c)))])

    g1, g2, g3 = build(1.0), build(1.0), build(2.0)
    assert g1 == g2 and hash(g1) == hash(g2) and g1 is not g2
    assert g1 != g3
    assert len({g1, g2, g3}) == 2


def test_an_output_of_the_same_elements_takes_the_result_through_a_reshape():
    """NNC writes a reduction's [1, 3] result into a [3] output tensor: the builder adds
    a reshape node (as the dynamic graph's exec does); values and gradients are NumPy's
    sum over axis 0; a shape of other elements is still a ShapeError naming the node."""
    import jax

    from fnnc.graph import backward

    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    y = b.tensor((3,), name="y")
    assert b.exec(ops.reduce_sum(axes=(0,)), x, outputs=[y], name="sum") is y
    z = b.exec(ops.ewprod(), y, y, name="square")
    s = b.exec(ops.reduce_sum(axes=(0,)), z, name="total")
    g = b.build([z, s])
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = a.sum(0) ** 2
    assert_close(interpret(g, a)[0], want)
    assert_close(compile(g)(a)[0], want)
    gg, (_dx,) = backward(g, s, [x])
    assert_close(interpret(gg, a)[2], jax.grad(lambda v: (v.sum(0) ** 2).sum())(a))
    with pytest.raises(ShapeError, match=r"node 'bad' .*output %\d+ \(w\) is float32\[2\]"):
        b.exec(ops.reduce_sum(axes=(0,)), x, outputs=[b.tensor((2,), name="w")], name="bad")


def test_a_view_with_a_negative_stride_reads_backwards_and_must_stay_in_its_root() -> None:
    """base 3, stride -1 is x[::-1] (NumPy); base 0, stride -1 reaches element -3, which
    is outside the root, as an error (not wrapped around to the end)."""
    b = GraphBuilder()
    x = b.input((4,), name="x")
    t = b.exec(ops.scalar_mul(a=1.0), x, name="copy")
    rev = b.alias(t, (4,), stride=(-1,), base=3, name="rev")
    assert (rev.first_index(), rev.last_index()) == (0, 3)
    g = verify(b.build([b.exec(ops.relu(), rev, name="r")]))
    xs = np.array([1.0, -2.0, 3.0, 4.0], np.float32)
    for got in _run_both(g, xs):
        np.testing.assert_array_equal(np.asarray(got[0]), np.maximum(xs[::-1], 0))
    with pytest.raises(ShapeError, match=r"reaches element -3, but the root .* has 4 elements"):
        b.alias(t, (4,), stride=(-1,), name="below")


def test_views_with_negative_strides_are_not_taken_as_disjoint() -> None:
    """{3, 2} (base 3, stride -1) and {2} share element 2: the pass helper must not call
    them disjoint from their bases alone."""
    from fnnc.graph.passes._view_sets import disjoint

    down = AliasSymbol(5, 1, (2,), np.dtype(np.float32), 3, (-1,))
    two = AliasSymbol(6, 1, (1,), np.dtype(np.float32), 2, (1,))
    one = AliasSymbol(7, 1, (1,), np.dtype(np.float32), 1, (1,))
    assert not disjoint(down, two) and not disjoint(two, down)
    assert disjoint(down, one) and disjoint(one, down)
