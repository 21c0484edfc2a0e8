"""Wrong calls of a compiled Program, interpret and backward name the input and the fix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import DTypeError, GraphError, GraphInputError, ShapeError
from fnnc.graph import GraphBuilder, backward, compile, interpret


def _graph():
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    y = b.input((3,), name="y")
    return b.build([b.exec(ops.mul(), x, y, name="m")])


@pytest.fixture(scope="module")
def runners():
    graph = _graph()
    program = compile(graph)
    return {"Program": program, "interpret": lambda *xs: interpret(graph, *xs)}


WHERE = ["Program", "interpret"]
Y = np.array([1.0, 2.0, 3.0], np.float32)


@pytest.mark.parametrize("where", WHERE)
def test_a_string_is_named_with_its_input(runners, where: str) -> None:
    with pytest.raises(DTypeError) as e:
        runners[where]("abc", Y)
    assert str(e.value) == (
        f"{where}: input %0 (x) expects float32[2, 3], got str 'abc'; pass a NumPy or JAX "
        "array (or a nested list of numbers)"
    )
    assert isinstance(e.value, TypeError)


@pytest.mark.parametrize("where", WHERE)
def test_nested_lists_of_numbers_are_arrays(runners, where: str) -> None:
    rows = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    got = runners[where](rows, [1.0, 2.0, 3.0])
    np.testing.assert_allclose(np.asarray(got), np.asarray(rows) * Y)
    with pytest.raises(ShapeError, match=r"input %1 \(y\) expects float32\[3\], got \w+\[2\]"):
        runners[where](rows, [1.0, 2.0])


@pytest.mark.parametrize("where", WHERE)
def test_wrong_arity_says_what_was_given(runners, where: str) -> None:
    rows = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    with pytest.raises(GraphInputError) as e:
        runners[where](rows)
    assert str(e.value) == (
        f"{where}: the graph takes 2 array(s) (%0 (x), %1 (y)), got 6 from 1 argument(s) "
        "(a list of numbers, shape [2, 3]); pass one array per graph input, in order"
    )
    with pytest.raises(GraphInputError, match=r"got 1 from 1 argument\(s\) \(float32\[3\]\)"):
        runners[where](Y)
    given = r"got 3 from 2 argument\(s\) \(float32\[3\], a dict\)"
    with pytest.raises(GraphInputError, match=given):
        runners[where](Y, {"a": Y, "b": Y})


def _loss_graph():
    b = GraphBuilder()
    x = b.input((3,), name="x")
    w = b.input((3,), name="w")
    loss = b.exec(ops.reduce_sum(axes=(0,)), b.exec(ops.mul(), x, w), name="loss")
    return b.build([loss]), x, w, loss


def test_backward_names_a_bad_wrt_item() -> None:
    graph, x, _, loss = _loss_graph()
    with pytest.raises(GraphError) as e:
        backward(graph, loss, [x, "nope"])
    assert str(e.value) == (  # a str names a symbol (the names of compile's donate=)
        "backward: wrt names 'nope', which is no symbol of this graph; pass the symbol "
        "itself or its integer id (the graph inputs are %0 (x), %1 (w))"
    )
    with pytest.raises(GraphError, match=r"wrt\[0\] is True \(a bool\)"):
        backward(graph, loss, [True])
    with pytest.raises(GraphError, match="backward: wrt is a float; it takes a tensor symbol"):
        backward(graph, loss, 1.5)
    by_name, by_symbol = backward(graph, "loss", ["x"]), backward(graph, loss, [x])
    assert by_name[1] == by_symbol[1] and len(by_name[0].nodes) == len(by_symbol[0].nodes)


def test_backward_takes_symbols_and_integer_ids() -> None:
    graph, x, w, loss = _loss_graph()
    xv, wv = np.float32([1.0, -2.0, 3.0]), np.float32([0.5, 4.0, -1.0])
    oracle = jax.grad(lambda a, b: jnp.sum(a * b), argnums=(0, 1))(xv, wv)
    for wrt in ([x, w], [x.id, np.int64(w.id)]):
        grads_graph, _ = backward(graph, loss, wrt)
        _, gx, gw = interpret(grads_graph, xv, wv)
        np.testing.assert_allclose(gx, oracle[0])
        np.testing.assert_allclose(gw, oracle[1])


@pytest.mark.parametrize("where", WHERE)
def test_a_nested_list_beside_an_array_is_one_input(runners, where: str) -> None:
    """With one argument per input, a list stands for one array wherever it is (mixed
    with arrays it was flattened: "got 4 array(s)"); a one-element list is shape [1]."""
    rows = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    x = np.asarray(rows, np.float32)
    for args in ((rows, Y), (x, Y.tolist()), (rows, [1, 2, 3])):
        np.testing.assert_array_equal(np.asarray(runners[where](*args)), x * Y)


@pytest.mark.parametrize("where", ["Program", "interpret"])
def test_python_numbers_take_their_inputs_dtype(where: str) -> None:
    """A list for a bfloat16 input was refused with "convert with .astype(bfloat16)",
    which a list does not have: Python numbers are converted to the input's dtype (as
    NumPy's asarray(x, dtype) rounds them); floats into an integer input are refused."""
    import ml_dtypes

    b = GraphBuilder()
    h, i = b.input((3,), ml_dtypes.bfloat16, name="h"), b.input((1, 3), np.int32, name="i")
    graph = b.build([b.exec(ops.relu(), h), b.exec(ops.reshape(shape=(3,)), i)])
    run = compile(graph) if where == "Program" else (lambda *xs: interpret(graph, *xs))
    values = [1.01, -2.0, 3.3]
    got_h, got_i = run(values, [[7, 8, 2**31 - 1]])
    want = np.maximum(np.asarray(values, ml_dtypes.bfloat16), 0)
    assert got_h.dtype == ml_dtypes.bfloat16 and got_i.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(got_h), want)
    np.testing.assert_array_equal(np.asarray(got_i), [7, 8, 2**31 - 1])
    with pytest.raises(
        DTypeError, match=r"input %1 \(i\) expects int32\[1, 3\], got Python floats"
    ):
        run(values, [[7.5, 8, 9]])
    with pytest.raises(DTypeError, match=r"input %1 \(i\) expects int32\[1, 3\]; a Python int"):
        run(values, [[2**31, 8, 9]])
