"""Bad input gets an FnncError that names the variable and the command."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import CommandError, DTypeError, FnncError, GraphError, ShapeError
from fnnc.graph import DynamicGraph

F32 = np.float32


def test_freed_variable_used_again_is_named() -> None:
    dg = DynamicGraph()
    x = dg.variable(F32([1.0]), name="x")
    dg.free(x)
    with pytest.raises(GraphError, match=r"exec ewlog: variable 'x' was freed"):
        dg.exec(ops.ewlog(), x)
    with pytest.raises(GraphError, match="'x' was freed"):
        x.numpy()
    with pytest.raises(GraphError, match="'x' was freed"):
        dg.free(x)
    with pytest.raises(GraphError, match="'x' was freed"):
        _ = x + 1.0


def test_backward_on_a_constant_is_an_error() -> None:
    dg = DynamicGraph()
    c = dg.constant(F32([2.0]), name="c")
    x = dg.variable(F32([3.0]), name="x")
    f = x * c
    with pytest.raises(GraphError, match=r"wrt 'c' is a constant"):
        dg.backward(f, [c])
    with pytest.raises(GraphError, match=r"f 'c2' is a constant"):
        c2 = dg.exec(ops.ewexp(), c)
        c2.name = "c2"
        dg.backward(c2, [x])
    with dg.no_grad():
        g = x * 2.0
    g.name = "g"
    with pytest.raises(GraphError, match="'g' is a constant"):
        dg.backward(g, [x])


def test_shape_mismatch_in_exec_names_command_and_variables() -> None:
    dg = DynamicGraph()
    a = dg.variable(np.ones((2, 3), F32), name="a")
    b = dg.variable(np.ones((4, 4), F32), name="b")
    with pytest.raises(ShapeError) as e:
        dg.exec(ops.gemm(), a, b, name="fc")
    msg = str(e.value)
    assert "exec gemm ('fc')" in msg and "'a':float32[2, 3]" in msg and "'b':float32[4, 4]" in msg


def test_write_of_the_wrong_shape_names_the_variable() -> None:
    dg = DynamicGraph()
    y = dg.variable(np.zeros(3, F32), name="y")
    z = dg.variable(np.ones(2, F32))
    with pytest.raises(ShapeError, match="into variable 'y'"):
        dg.exec(ops.ewexp(), z, outputs=[y])
    with pytest.raises(ShapeError, match="out of range"):
        y[5] = 1.0


def test_other_mistakes() -> None:
    dg = DynamicGraph()
    x = dg.variable(F32([1.0]), name="x")
    with pytest.raises(GraphError, match="has no gradient"):
        dg.apply_gradients(optax.sgd(0.1), [x])
    with pytest.raises(GraphError, match="expected a Command"):
        dg.exec(ops.ewlog, x)
    v = dg.variable(F32([1.0, 2.0]))  # no df for a non-scalar f: ones, as NNC seeds it
    (dv,) = dg.backward(dg.exec(ops.ewexp(), v), [v])
    np.testing.assert_allclose(dv.numpy(), np.exp(F32([1.0, 2.0])), rtol=1e-6)
    other = DynamicGraph().variable(F32([1.0]), name="o")
    with pytest.raises(GraphError, match="another DynamicGraph"):
        dg.exec(ops.ewsum(), x, other)
    with pytest.raises(FnncError, match=r"optax\.GradientTransformation"):
        dg.backward(x * x, [x])
        dg.apply_gradients("sgd", [x])


W2 = F32([1.0, -2.0])
ADAM1 = W2 - 0.1 * np.sign(W2)  # Adam's first step moves each entry by the learning rate


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("how", ["minimize", "backward", "after a prune", "derived"])
def test_a_loss_recorded_before_the_step_is_not_differentiated_again(how, lazy) -> None:
    # its gradient with respect to w's new value would be zero, and Adam would keep
    # moving on its momentum: a clear error instead, and w stays where the step left it
    dg = DynamicGraph(lazy=lazy)
    w = dg.variable(W2, name="w")
    loss = (w * w).sum()
    dg.minimize(optax.adam(0.1), loss, [w])
    np.testing.assert_allclose(w.numpy(), ADAM1, rtol=1e-5)
    if how == "after a prune":  # the nodes the old w fed are dropped: loss is a leaf
        for _ in range(3):
            _ = (w * 3.0).sum()
        dg.collect()
        assert loss._slot.version.node is None
    f = loss * 2.0 + (w * w).sum() if how == "derived" else loss
    with pytest.raises(GraphError, match=r"f #\d+ was computed from an earlier value of "
                       r"variable 'w'.*Compute f again .* after the step"):  # fmt: skip
        if how == "backward":
            dg.backward(f, [w])
        else:
            dg.minimize(optax.adam(0.1), f, [w])
    np.testing.assert_allclose(w.numpy(), ADAM1, rtol=1e-5)


@pytest.mark.parametrize("lazy", [False, True])
def test_after_a_step_fresh_losses_and_unrelated_variables_differentiate(lazy) -> None:
    dg = DynamicGraph(lazy=lazy)
    w = dg.variable(W2, name="w")
    b = dg.variable(F32([5.0]), name="b")
    # a step, then a write from the new value (clipping): fine, also in lazy mode, where
    # the next step's parameter is still pending (its optimizer used to read None)
    for _ in range(3):
        dg.minimize(optax.sgd(0.1), (w * w).sum(), [w])
        dg.write(w, w * 0.5)
        dg.collect()
    want = W2 * (0.8 * 0.5) ** 3
    np.testing.assert_allclose(w.numpy(), want, rtol=1e-6)
    loss = (w * w).sum()
    (dw,) = dg.backward(loss, [w])
    np.testing.assert_allclose(dw.numpy(), 2 * want, rtol=1e-6)  # d/dw sum(w^2)
    (db,) = dg.backward(loss, [b])  # b never fed loss: zero, as jax.grad gives
    np.testing.assert_allclose(db.numpy(), [0.0])


def test_a_none_input_before_a_given_one_says_what_to_pass() -> None:
    """As GraphBuilder.exec: a node leaves out trailing inputs only; a None in between
    gets the builder's message (not a DTypeError about None), trailing ones are dropped."""
    x0 = np.float32([[1.0, 2.0, 4.0, 9.0], [0.0, -1.0, 1.0, 0.5]])
    dg = DynamicGraph()
    x = dg.variable(x0, name="x")
    with pytest.raises(CommandError, match=r"input 1 is None but input 2 is given.*neutral"):
        dg.exec(ops.layer_norm(), x, None, dg.variable(np.ones(4, F32)))
    y = dg.exec(ops.layer_norm(), x, None, None)[0]
    centred = x0 - x0.mean(-1, keepdims=True)
    want = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6)


def test_backward_of_an_integer_says_integers_have_no_gradient() -> None:
    dg = DynamicGraph()
    i = dg.variable(np.int32([1, 2, 3]), name="i")
    with pytest.raises(DTypeError, match=r"is int32, which has no gradient") as info:
        dg.backward((i * i).sum(), [i])
    assert "dg.constant" not in str(info.value)  # it is a variable, not a constant
    with pytest.raises(DTypeError, match=r"wrt .* is int32"):  # a float f: the wrt says
        x = dg.variable(F32([1.0, 2.0, 3.0]), name="x")
        dg.backward((x * dg.exec(ops.datatype_conversion(dtype="float32"), i)).sum(), [i])


def test_misuse_of_backward_write_and_set_names_the_variable() -> None:
    """An array where backward takes a variable was an AttributeError; a value that does
    not broadcast in write was NumPy's ValueError; set with another dtype was a
    ShapeError; an integer wrt was named by its symbol id (%0), not its name."""
    dg = DynamicGraph()
    x = dg.variable(np.ones((2, 3), F32), name="x")
    f = dg.exec(ops.reduce_sum(axes=(0, 1)), x)
    iv = dg.variable(np.ones(3, np.int32), name="iv")
    fi = dg.exec(ops.reduce_sum(axes=(0,)), dg.exec(ops.datatype_conversion(dtype="float32"), iv))
    with pytest.raises(GraphError, match=r"backward: f is an array float64\[3\], not a Var"):
        dg.backward(np.ones(3), [x])
    with pytest.raises(GraphError, match=r"backward: wrt 1 is an array float64\[3\], not a Var"):
        dg.backward(f, [x, np.ones(3)])
    with pytest.raises(GraphError, match=r"apply_gradients: variable is a list"):
        dg.apply_gradients(optax.sgd(0.1), [[1.0]])
    with pytest.raises(DTypeError, match=r"backward: wrt 'iv' is int32, which has no gradient"):
        dg.backward(fi, [iv])
    with pytest.raises(ShapeError, match=r"write into 'x': the value is \[7\].*shape \[2, 3\]"):
        dg.write(x, np.ones((7,), F32))
    with pytest.raises(DTypeError, match=r"set: variable 'x' is float32\[2, 3\].*int32\[2, 3\]"):
        dg.set(x, np.ones((2, 3), np.int32))
    with pytest.raises(ShapeError, match=r"set: variable 'x' is float32\[2, 3\].*\[3\]"):
        dg.set(x, np.ones(3, F32))
    # the same calls done right: d(sum x)/dx is ones, and a broadcast write fills x
    (g,) = dg.backward(f, [x])
    np.testing.assert_array_equal(g.numpy(), np.ones((2, 3), F32))
    dg.write(x, np.arange(3, dtype=F32))
    np.testing.assert_array_equal(x.numpy(), np.broadcast_to(np.arange(3, dtype=F32), (2, 3)))
