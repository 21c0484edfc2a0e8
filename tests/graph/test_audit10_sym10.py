"""Audit 10 (sym10): the symbolic graph's public API against NNC's graph unit tests
(liuliu/ccv test/unit/nnc: symbolic.graph, autograd, autograd.vector, tensor.bind)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import DTypeError, GraphError, GraphInputError, ShapeError
from fnnc.graph import Graph, GraphBuilder, Node, TensorSymbol, backward, compile, interpret

F32 = np.float32


def test_backward_takes_the_symbols_handed_out_before_set_shape():
    """symbolic.graph.tests.c "set tensor symbol shape after computation specified", then
    differentiated: the symbols ``exec`` and ``input(None)`` returned before the shape was
    set name the graph's symbols in ``backward`` as they do in the builder (they were
    rejected as "not a symbol of this graph"). d log(a) / da = 1 / a."""
    b = GraphBuilder()
    a = b.input(None, name="a")
    y = b.exec(ops.ewlog(), a, name="log")
    b.set_shape(a, (1,))
    graph, (da,) = backward(b.build([y]), y, [a])
    got = interpret(graph, F32([1.25]))
    np.testing.assert_allclose(got[0], [np.log(1.25)], rtol=1e-6)
    np.testing.assert_allclose(got[1], [1 / 1.25], rtol=1e-6)
    assert da.shape == (1,)


def test_backward_takes_an_auto_tensor_filled_by_its_writer():
    """An auto tensor (``tensor(None)``, NNC's ``ccv_nnc_tensor_auto``) that a node filled
    is ``f`` as the shape-less symbol the user kept: d sum(x * x) / dx = 2 x."""
    b = GraphBuilder()
    x = b.input((3,), name="x")
    y = b.tensor(None, name="y")
    b.exec(ops.ewprod(), x, x, outputs=[y], name="sqr")
    total = b.tensor(None, name="total")
    b.exec(ops.reduce_sum(axes=(0,)), y, outputs=[total])
    graph, _ = backward(b.build([total]), total, [x])
    got = interpret(graph, F32([1, 2, -3]))
    np.testing.assert_allclose(got[1], [2, 4, -6], rtol=1e-6)


def test_backward_still_rejects_a_symbol_of_another_builder():
    """The shape-less symbols are taken by id and name only from their own graph: a
    shaped symbol of another builder with the same id is still an error."""
    b = GraphBuilder()
    x = b.input((1,), name="x")
    y = b.exec(ops.ewlog(), x, name="log")
    other = GraphBuilder()
    stranger = other.exec(ops.ewexp(), other.input((2,), name="x"), name="log")
    assert stranger.id == y.id and stranger.name == y.name
    with pytest.raises(GraphError, match="not a symbol of this graph"):
        backward(b.build([y]), stranger, [x])


def test_reading_an_auto_tensor_points_nnc_users_to_input_none():
    """NNC's auto tensor read before any node writes it (the ported "set tensor symbol
    shape" case) says how fnnc spells a tensor whose shape is set later."""
    b = GraphBuilder()
    a = b.tensor(None, name="a")
    with pytest.raises(GraphError, match=r"input\(None\) \(or add_input\(it\) .*then set_shape"):
        b.exec(ops.ewlog(), a)


@pytest.fixture(scope="module")
def donating():
    """z = x * y compiled with x donated (NNC's in-place "compile symbolic graph of one
    node")."""
    b = GraphBuilder()
    x, y = b.input((2,), name="x"), b.input((2,), name="y")
    return compile(b.build([b.exec(ops.ewprod(), x, y, name="prod")]), donate=["x"])


def test_a_donated_array_passed_again_is_named(donating):
    """The array a donating call took, passed to the program again, is a GraphInputError
    naming the input and saying what to pass (it was XLA's "Invalid buffer passed to
    Execute() as argument 0")."""
    x, y = jnp.array([1.2, 2.0]), jnp.array([2.3, 3.0])
    np.testing.assert_allclose(donating(x, y), [1.2 * 2.3, 6.0], rtol=1e-6)
    assert x.is_deleted()
    with pytest.raises(GraphInputError, match=r"input %0 \(x\) is an array that was deleted"):
        donating(x, jnp.array([1.0, 1.0]))
    b = GraphBuilder()  # a program that donates nothing, given the array another one took
    z = b.exec(ops.ewexp(), b.input((2,), name="z"))
    with pytest.raises(GraphInputError, match=r"input %0 \(z\) is an array that was deleted"):
        compile(b.build([z]))(x)


def test_one_array_for_a_donated_and_another_input_is_named(donating):
    """The same array for a donated input and another input (XLA's "Attempt to use a
    buffer that was previously donated in the same call") names both inputs."""
    a = jnp.array([1.0, 2.0])
    with pytest.raises(GraphInputError, match=r"input %0 \(x\) is donated, .* input %1 \(y\)"):
        donating(a, a)
    np.testing.assert_allclose(donating(a, jnp.array(a, copy=True)), [1.0, 4.0])


def _layer_norm(x):
    x = x.astype(np.float64)
    return (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)


@pytest.mark.parametrize("shape_later", [False, True], ids=["shaped", "set_shape"])
def test_none_among_outputs_is_an_output_not_kept(shape_later):
    """NNC's ``TENSOR_SYMBOL_LIST(y, NO_TENSOR_SYMBOL, NO_TENSOR_SYMBOL)`` for a command
    whose statistics the caller does not keep: ``outputs=[y, None, None]`` writes y and
    gives the others new symbols (it was "expected a tensor symbol, got NoneType; wrap
    values with builder.constant(value)")."""
    b = GraphBuilder()
    x = b.input(None if shape_later else (2, 3), name="x")
    y = b.tensor(None if shape_later else (2, 3), name="y")
    got = b.exec(ops.layer_norm(axes=(1,), epsilon=1e-5), x, outputs=[y, None, None])
    assert len(got) == 3 and got[0].id == y.id and None not in got
    if shape_later:
        b.set_shape(x, (2, 3))
    graph = b.build([y, got[1]])
    xs = np.array([[1, 2, 4], [-1, 0, 3]], F32)
    out, mean = interpret(graph, xs)
    np.testing.assert_allclose(out, _layer_norm(xs), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mean, xs.mean(1, keepdims=True), rtol=1e-6)


def test_too_few_outputs_say_none_marks_one_not_kept():
    """Fewer outputs than the command has stays an error, which now says how to leave
    one out."""
    b = GraphBuilder()
    x, y = b.input((2, 3), name="x"), b.tensor((2, 3), name="y")
    with pytest.raises(GraphError, match=r"3 outputs, 1 were given; .*None for one not kept"):
        b.exec(ops.layer_norm(axes=(1,)), x, outputs=[y])
    # too many: the count is checked before a None gets a symbol, and none is left behind
    before = len(b.build([]).symbols)
    with pytest.raises(GraphError, match=r"1 outputs, 2 were given"):
        b.exec(ops.ewexp(), x, outputs=[None, None])
    assert len(b.build([]).symbols) == before


def test_an_array_seed_is_the_gradient_written_into_df():
    """NNC seeds a non-scalar f by writing into its gradient tensor (autograd.vector's
    ``tdz->data``); an array as ``df`` is that seed, as in ``DynamicGraph.backward``. It
    was read as a list of symbol ids ("df[0] is np.float32(1.0)"). Oracle: jax.vjp."""
    b = GraphBuilder()
    x = b.input((3,), name="x")
    y = b.exec(ops.ewprod(), x, b.exec(ops.ewexp(), x))
    seed = np.array([1.0, -2.0, 0.5])  # float64: taken as f's float32
    graph, (dx,) = backward(b.build([y]), y, [x], df=seed)
    xs = F32([0.3, -1.0, 2.0])
    want = jax.vjp(lambda v: v * jnp.exp(v), xs)[1](seed.astype(F32))[0]
    np.testing.assert_allclose(interpret(graph, xs)[1], want, rtol=1e-6)
    assert dx.dtype == np.float32
    with pytest.raises(ShapeError, match=r"df for f .* is an array of float64\[2\], f is"):
        backward(b.build([y]), y, [x], df=np.ones(2))


def test_a_seed_symbol_of_another_dtype_is_a_dtype_error():
    """A seed symbol of another dtype than f was a ShapeError; it is a DTypeError that
    says how to convert."""
    b = GraphBuilder()
    x, d = b.input((3,), name="x"), b.input((3,), np.float16, name="d")
    y = b.exec(ops.ewexp(), x)
    with pytest.raises(DTypeError, match=r"df for f .* float16\[3\], f is float32\[3\]; convert"):
        backward(b.build([y]), y, [x], df=d)


def test_an_auto_tensor_made_an_input_takes_its_shape_later():
    """symbolic.graph.tests.c "set tensor symbol shape after computation specified" as
    NNC writes it: ``a`` and ``b`` are auto tensors, log a -> b, then a's shape is set.
    With ``a`` made an input by ``add_input``, ``set_shape`` now gives it its shape (it
    was "not a graph input", and reading ``a`` said to call set_shape). log(1.25)."""
    b = GraphBuilder()
    a, y = b.tensor(None, name="a"), b.tensor(None, name="b")
    b.add_input(a)
    b.exec(ops.ewlog(), a, outputs=[y], name="log")
    b.set_shape(a, (1,))
    graph = b.build([y])
    assert graph.input_specs[0].shape == (1,) and graph.output_specs[0].shape == (1,)
    np.testing.assert_allclose(compile(graph)(F32([1.25])), [np.log(1.25)], rtol=1e-6)


def test_an_empty_view_at_the_end_of_its_root():
    """A view of no elements starting at the root's end (the last, empty chunk of a
    split: NumPy's ``x[4:4]``, ``x[:, 3:]`` of 3 columns) is accepted by ``alias`` but
    raised NumPy's "index 4 is out of bounds" in interpret and compile. It reads as
    empty, and the gradient through it is the other reads' (d sum(x) / dx = 1)."""
    b = GraphBuilder()
    x = b.input((4,), name="x")
    tail = b.alias(x, (0,), offset=(4,), name="x[4:]")
    cols = b.alias(b.exec(ops.reshape(shape=(2, 2)), x), (2, 0), offset=(0, 2), name="[:, 2:]")
    empty = b.exec(ops.reduce_sum(axes=(0,)), tail)
    f = b.exec(ops.ewsum(), empty, b.exec(ops.reduce_sum(axes=(0,)), x))
    graph, _ = backward(b.build([tail, cols, f]), f, [x])
    xs = F32([1, 2, 3, 4])
    got = compile(graph)(xs)  # interpret runs the same view reads (core.evaluate)
    assert got[0].shape == xs[4:].shape and got[1].shape == xs.reshape(2, 2)[:, 2:].shape
    np.testing.assert_allclose(got[2], [xs.sum()], rtol=1e-6)
    np.testing.assert_allclose(got[3], np.ones(4), rtol=0)


def test_a_tensor_no_node_writes_says_to_make_it_an_input():
    """NNC's graphs have no inputs: a tensor symbol no command writes is fed by the caller.
    Ported as ``tensor()``, reading it said only "reads %0 (a) before it is written"; it
    now says how to make it an input, and ``add_input`` does (log(2.34))."""
    b = GraphBuilder()
    a = b.tensor((1,), name="a")
    y = b.exec(ops.ewlog(), a, name="log")
    with pytest.raises(GraphError, match=r"reads %0 \(a\) before it is written; no node .*add_in"):
        b.build([y])
    b.add_input(a)
    np.testing.assert_allclose(interpret(b.build([y]), F32([2.34])), [np.log(2.34)], rtol=1e-6)


def test_records_made_with_lists_compile():
    """The IR records are public and edited with ``dataclasses.replace``; lists given for
    their tuple fields (``outputs=[...]``, a Node's inputs, a symbol's shape) made
    ``compile`` fail with "unhashable type: 'list'". They are held as tuples."""
    b = GraphBuilder()
    x = b.input((2,), name="x")
    e = b.exec(ops.ewexp(), x, name="exp")
    graph = b.build([b.exec(ops.ewlog(), e, name="log")])
    only_exp = dataclasses.replace(graph, outputs=[e.id], nodes=list(graph.nodes[:1]))
    assert only_exp.outputs == (e.id,) and hash(only_exp) == hash(only_exp)
    xs = F32([0.5, -1.0])
    np.testing.assert_allclose(compile(only_exp)(xs), np.exp(xs), rtol=1e-6)
    relu = Node(ops.relu(), [x.id], [2])
    symbols = [x, TensorSymbol(2, [2], np.dtype(np.float32), "r")]
    hand = Graph([*symbols[:1], e, symbols[1]], [relu], [x.id], [2])
    assert hand.symbols[2].shape == (2,) and relu.inputs == (x.id,)
    np.testing.assert_allclose(compile(hand)(xs), np.maximum(xs, 0), rtol=0)
