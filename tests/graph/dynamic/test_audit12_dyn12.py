"""Audit 12 of the dynamic graph: regression tests, each against an independent oracle
(NumPy, jax.grad, Optax) or the error a user must get."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import DTypeError, GraphError, ShapeError
from fnnc.graph import DynamicGraph, GraphBuilder
from fnnc.models import Dense, Input, Model


@pytest.mark.parametrize("lazy", [False, True])
def test_a_variable_of_another_graph_is_refused_and_left_intact(lazy: bool) -> None:
    # d2.free(a) freed d1's variable and d2.set(b, ...) wrote d1's slot through d2's
    # record (lazily, silently); both now say whose variable it is and change nothing
    d1, d2 = DynamicGraph(lazy=lazy), DynamicGraph(lazy=lazy)
    a = d1.variable(np.float32([1.0, 2.0]), name="a")
    b = a * 2.0
    for call in (
        lambda: d2.set(b, np.float32([0.0, 0.0])),
        lambda: d2.free(a),
        lambda: d2.grad(a),
        lambda: d2.zero_grad([a]),
        lambda: d2.value_of(b),
        lambda: d2.alias(a, (1,)),
    ):
        with pytest.raises(GraphError, match="belongs to another DynamicGraph"):
            call()
    np.testing.assert_array_equal(a.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(b.numpy(), [2.0, 4.0])
    (da,) = d1.backward((b * a).sum(), [a])
    np.testing.assert_allclose(da.numpy(), 4 * np.float32([1.0, 2.0]))  # d(2a²)/da
    # copying the value in is the documented way, lazily too (it read None before)
    c = d2.variable(b)
    np.testing.assert_array_equal((c * 3.0).numpy(), [6.0, 12.0])


def test_64_bit_integers_that_32_bits_do_not_hold_are_refused_not_wrapped() -> None:
    # JAX (64-bit types off) holds an int64 array in int32: 2**40 became 0 with a warning
    dg = DynamicGraph()
    big = np.int64([2**40, 3])
    for call in (
        lambda: dg.variable(big, name="n"),
        lambda: dg.constant([2**40]),
        lambda: dg.variable(np.uint64([2**63])),
        lambda: dg.exec(ops.ewsum(), dg.variable(np.int32([1, 1])), big),
        lambda: dg.set(dg.variable(np.int32([0, 0])), big),
    ):
        with pytest.raises(DTypeError, match=r"do not fit in u?int32"):
            call()
    # in range they keep NumPy's values (held as int32); floats still round as before
    small = np.int64([-(2**31), 2**31 - 1, 5])
    got = dg.variable(small)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.numpy(), small)
    np.testing.assert_array_equal(
        dg.variable(np.float64([0.1, 2.0])).numpy(), np.float64([0.1, 2.0]).astype(np.float32)
    )


def test_integer_array_operands_the_variables_type_does_not_hold_are_refused() -> None:
    # the variable's type wins, so an array operand is cast to it: int8 + int32([300])
    # gave 45 (300 wrapped); a number that does not fit was already refused
    dg = DynamicGraph()
    i8 = dg.variable(np.int8([1, 2]), name="i8")
    i32 = dg.variable(np.int32([1, 2]))
    u8 = dg.variable(np.uint8([1, 2]))
    for call in (
        lambda: i8 + np.int32([300, 1]),
        lambda: np.int16([300, 1]) + i8,  # reflected
        lambda: i32 * np.int64([2**40, 1]),
        lambda: i32 - np.uint32([2**32 - 1, 1]),
        lambda: u8 + np.int32([-1, 1]),
    ):
        with pytest.raises(DTypeError, match=r"outside u?int(8|32)'s range"):
            call()
    # values the type holds give NumPy's results, computed in the wider type
    for var, other in ((i8, np.int32([100, -3])), (i32, np.int64([7, -(2**31) + 2])), (u8, [3, 9])):
        want = np.asarray(var.numpy(), np.int64) + np.asarray(other, np.int64)
        got = var + other
        assert got.dtype == var.dtype
        np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("lazy", [False, True])
def test_a_write_through_an_alias_under_no_grad_keeps_the_variable_trainable(lazy: bool) -> None:
    # w[0] = 10 under no_grad made w a constant for good ('f is a constant'), where a
    # whole write under no_grad (dg.write(w, w * 0.5)) keeps w a variable, as set does
    dg = DynamicGraph(lazy=lazy)
    w = dg.variable(np.float32([3.0, -2.0, 1.0]), name="w")
    with dg.no_grad():
        w[0] = 10.0
        dg.exec(ops.scalar_mul(a=2.0), w[1:], outputs=[w[1:]])
    want = np.float32([10.0, -4.0, 2.0])  # NumPy's w after the same writes
    assert w.requires_grad
    np.testing.assert_array_equal(w.numpy(), want)
    (g,) = dg.backward((w * w).sum(), [w])
    np.testing.assert_allclose(g.numpy(), 2 * want)  # d/dw sum(w^2), as jax.grad
    dg.zero_grad()
    dg.minimize(optax.sgd(0.1), (w * w).sum(), [w])
    np.testing.assert_allclose(w.numpy(), want - 0.1 * 2 * want, rtol=1e-6)
    c = dg.constant(np.float32([1.0, 2.0]))  # a constant written so stays one
    with dg.no_grad():
        c[0] = 5.0
    assert not c.requires_grad


def test_detach_of_an_alias_is_refused_instead_of_detaching_the_whole_variable() -> None:
    # dg.detach(x[0:1]) made all of x a constant (NNC asserts a detached variable is no
    # alias; PyTorch refuses detach_ of a view): the next backward said 'wrt is a constant'
    dg = DynamicGraph()
    x0 = np.float32([1.0, 2.0, 3.0])
    x = dg.variable(x0, name="x")
    with pytest.raises(GraphError, match=r"detach: .* is an alias"):
        dg.detach(x[0:1])
    assert x.requires_grad
    c = dg.constant(x[0:1])  # the way to a detached copy of the view
    (g,) = dg.backward((x * x * c).sum(), [x])
    np.testing.assert_allclose(g.numpy(), 2 * x0 * x0[0])  # jax.grad, c a stop_gradient


@pytest.mark.parametrize("lazy", [False, True])
def test_a_models_parameter_set_or_written_in_the_graph_is_the_models_too(lazy: bool) -> None:
    # only minimize/apply_gradients wrote parameter variables back: after dg.set(w, 0)
    # the graph computed with 0 while model.evaluate (and model.save) kept the old w
    x = Input()
    model = Model(x, Dense(2, name="lin")(x))
    dg = DynamicGraph(lazy=lazy)
    xs = np.float32([[1.0, 2.0], [0.5, -1.0]])
    dg.evaluate(model, [xs])
    params = dg.parameters(model)
    w_id = next(p for p, v in params.items() if v.ndim == 2)
    b_id = next(p for p in params if p != w_id)
    w, b = params[w_id], params[b_id]
    dg.set(w, np.float32([[1.0, -1.0], [2.0, 0.5]]))
    w[1] = np.float32([3.0, -2.0])  # through an alias
    b0 = np.asarray(model.parameters()[b_id])
    dg.exec(ops.scalar_mul(a=2.0), b, outputs=[b])
    want_w, want_b = np.float32([[1.0, -1.0], [3.0, -2.0]]), 2 * b0
    got = {p: np.asarray(v) for p, v in model.parameters().items()}
    np.testing.assert_array_equal(got[w_id], want_w)
    np.testing.assert_array_equal(got[b_id], want_b)
    want = xs @ want_w.T + want_b  # Dense: x W^T + b
    np.testing.assert_allclose(np.asarray(model.evaluate(xs)), want, rtol=1e-6)
    np.testing.assert_allclose(dg.evaluate(model, [xs]).numpy(), want, rtol=1e-6)
    gb = GraphBuilder()  # evaluate(outputs=[b]) writes the parameter too
    v = gb.input((2,))
    dg.evaluate(
        gb.build([gb.exec(ops.scalar_mul(a=3.0), v)]), [np.ones(2, np.float32)], outputs=[b]
    )
    np.testing.assert_array_equal(np.asarray(model.parameters()[b_id]), [3.0, 3.0])


def test_truth_value_of_a_variable_is_numpys() -> None:
    # Python fell back on __len__: [0.0] was true and any [2, 2] was true
    dg = DynamicGraph()
    for value in (np.float32([0.0]), np.float32([[3.0]]), np.int32(0), np.float32([-1.5])):
        assert bool(dg.variable(value)) is bool(np.asarray(value))
    for value in (np.float32([[1.0, 0.0], [2.0, 3.0]]), np.zeros((0, 2), np.float32)):
        with pytest.raises(ValueError, match="ambiguous"):
            bool(np.asarray(value))  # the oracle refuses too
        with pytest.raises(ShapeError, match="ambiguous"):
            bool(dg.variable(value))


def test_minimize_names_itself_when_its_loss_has_no_gradient() -> None:
    # minimize's f checks said 'backward: f ... is a constant' (the call made was minimize)
    dg = DynamicGraph()
    w = dg.variable(np.float32([1.0, 2.0]), name="w")
    with dg.no_grad():
        loss = (w * w).sum()
    with pytest.raises(GraphError, match=r"^minimize: f #\d+ is a constant"):
        dg.minimize(optax.sgd(0.1), loss, [w])
    with pytest.raises(GraphError, match=r"^minimize: f is an array"):
        dg.minimize(optax.sgd(0.1), np.ones(1), [w])
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])  # nothing stepped


def test_abs_of_a_variable_is_ewabs_with_its_gradient():
    """``abs(v)`` was a bare TypeError (no ``__abs__``); it is NumPy's abs, and its
    gradient sign(x) (jax.grad)."""
    dg = DynamicGraph()
    x0 = np.array([-1.5, 2.0, -3.0], np.float32)
    x = dg.variable(x0)
    y = abs(x)
    np.testing.assert_array_equal(y.numpy(), np.abs(x0))
    dg.backward(y.sum(), [x])
    want = jax.grad(lambda a: jax.numpy.abs(a).sum())(x0)
    np.testing.assert_array_equal(np.asarray(dg.grad(x)), np.asarray(want))
    ints = dg.variable(np.array([-4, 5], np.int32))
    np.testing.assert_array_equal(abs(ints).numpy(), [4, 5])


def test_writes_of_integers_the_variable_does_not_hold_are_refused_not_wrapped() -> None:
    # dg.write / x[i] = v cast unchecked: int8[0] = 300 gave 44, int32 of 2**40 gave 0,
    # where NumPy's np.int8([1, 2])[0] = 300 raises OverflowError
    dg = DynamicGraph()
    i8, i32, u8 = (dg.variable(np.array([1, 2], t)) for t in (np.int8, np.int32, np.uint8))
    writes = [
        (lambda: i8.__setitem__(0, 300), "300 is outside int8's range"),
        (lambda: dg.write(i8, 300), "300 is outside int8's range"),
        (lambda: dg.write(i32, np.int64([2**40, 1])), "1099511627776 is outside int32"),
        (lambda: u8.__setitem__(0, -1), "-1 is outside uint8's range"),
    ]
    for write, message in writes:
        with pytest.raises(DTypeError, match=message):
            write()
    for var, want in ((i8, [1, 2]), (i32, [1, 2]), (u8, [1, 2])):
        np.testing.assert_array_equal(var.numpy(), want)  # nothing written
    i8[1] = np.int64(-128)  # in range: NumPy's value
    np.testing.assert_array_equal(i8.numpy(), np.array([1, -128], np.int8))


def test_parallel_exec_reads_outputs_by_presence_not_truth() -> None:
    # `if outputs` took a one-element Variable's value: [0.] dropped outputs silently
    dg = DynamicGraph()
    a, b, y = (dg.variable(np.float32([v])) for v in (1.0, 2.0, 0.0))
    with pytest.raises(GraphError, match="their number must divide by 2; got 1"):
        dg.exec(ops.ewsum(), a, b, outputs=y, parallel=2)
