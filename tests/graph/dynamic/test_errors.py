"""Bad input gets an FnncError that names the variable and the command."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import FnncError, GraphError, ShapeError
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
    with pytest.raises(ShapeError, match="not a scalar"):
        dg.backward(dg.exec(ops.ewexp(), dg.variable(F32([1.0, 2.0]))), [x])
    other = DynamicGraph().variable(F32([1.0]), name="o")
    with pytest.raises(GraphError, match="another DynamicGraph"):
        dg.exec(ops.ewsum(), x, other)
    with pytest.raises(FnncError, match=r"optax\.GradientTransformation"):
        dg.backward(x * x, [x])
        dg.apply_gradients("sgd", [x])
