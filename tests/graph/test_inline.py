"""inline: a graph copied into a builder computes what it computed on its own (NumPy)."""

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import GraphInputError, ShapeError
from fnnc.graph import GraphBuilder, inline, interpret, verify


def _tail_of_each_row():
    """An inner graph taking (2, 4) and returning relu of its columns 2:4 (a view)."""
    inner = GraphBuilder()
    a = inner.input((2, 4), name="a")
    tail = inner.alias(a, (2, 2), offset=(0, 2), name="tail")
    return inner.build([inner.exec(ops.relu(), tail, name="r")])


def test_inline_names_nodes_with_the_prefix_and_keeps_the_numbers():
    inner = GraphBuilder()
    a = inner.input((3,), name="a")
    g_inner = inner.build([inner.exec(ops.scalar_mul(a=2.0), a, name="twice")])
    b = GraphBuilder()
    x = b.input((3,), name="x")
    (out,) = inline(b, g_inner, [x], prefix="layer")
    g = verify(b.build([out]))
    assert [n.name for n in g.nodes] == ["layer/twice"]
    xs = np.array([1.0, -2.0, 3.0], np.float32)
    np.testing.assert_array_equal(np.asarray(interpret(g, xs)), 2 * xs)


def test_a_view_of_an_input_fed_a_view_reads_the_view_of_the_view():
    """The inner graph takes a[2:4] of its input; fed t[4:8] it reads t[6:8]."""
    inner = GraphBuilder()
    a = inner.input((4,), name="a")
    tail = inner.alias(a, (2,), offset=(2,), name="tail")
    g_inner = inner.build([inner.exec(ops.relu(), tail, name="r")])
    b = GraphBuilder()
    x = b.input((8,), name="x")
    t = b.exec(ops.scalar_mul(a=1.0), x, name="copy")
    half = b.alias(t, (4,), offset=(4,), name="half")
    (out,) = inline(b, g_inner, [half])
    g = verify(b.build([out]))
    xs = np.arange(8, dtype=np.float32) - 7
    np.testing.assert_array_equal(np.asarray(interpret(g, xs)), np.maximum(xs[4:8][2:4], 0))


def test_a_view_of_an_input_fed_a_strided_view_composes_the_strides():
    """Fed the block [1:3, 2:6] of a (4, 8) tensor (not contiguous), the inner view of
    columns 2:4 reads columns 4:6 of rows 1:3."""
    b = GraphBuilder()
    x = b.input((4, 8), name="x")
    t = b.exec(ops.scalar_mul(a=1.0), x, name="copy")
    block = b.alias(t, (2, 4), offset=(1, 2), name="block")
    (out,) = inline(b, _tail_of_each_row(), [block])
    g = verify(b.build([out]))
    xs = np.arange(32, dtype=np.float32).reshape(4, 8) - 12
    want = np.maximum(xs[1:3, 2:6][:, 2:4], 0)
    np.testing.assert_array_equal(np.asarray(interpret(g, xs)), want)


def test_a_reshape_of_an_input_fed_a_strided_view_is_a_clear_error():
    inner = GraphBuilder()
    a = inner.input((2, 4), name="a")
    flat = inner.alias(a, (8,), name="flat")
    g_inner = inner.build([inner.exec(ops.relu(), flat, name="r")])
    b = GraphBuilder()
    x = b.input((4, 8), name="x")
    t = b.exec(ops.scalar_mul(a=1.0), x, name="copy")
    block = b.alias(t, (2, 4), offset=(1, 2), name="block")
    with pytest.raises(ShapeError, match=r"flat.*strided view \[2, 4\].*contiguous tensor"):
        inline(b, g_inner, [block])


def test_wrong_arguments_name_the_input():
    b = GraphBuilder()
    x = b.input((3, 4), name="x")
    with pytest.raises(GraphInputError, match=r"takes 1 inputs, got 2"):
        inline(b, _tail_of_each_row(), [x, x])
    with pytest.raises(
        GraphInputError, match=r"input %0 \(a\) is float32\[2, 4\].*float32\[3, 4\]"
    ):
        inline(b, _tail_of_each_row(), [x])
