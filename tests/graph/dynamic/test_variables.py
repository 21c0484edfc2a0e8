"""Variables: operators, aliases (NNC's alias rules), writes as new versions, listings."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.graph import DynamicGraph
from tests.helpers import rand

F32 = np.float32


def test_operators_with_variables_and_scalars() -> None:
    dg = DynamicGraph()
    a, b = rand((2, 3), seed=1), rand((2, 3), seed=2) + 3.0
    x, y = dg.variable(a), dg.variable(b)
    w = dg.variable(rand((3, 4), seed=3))
    cases = {
        "x + y": (x + y, a + b),
        "x - y": (x - y, a - b),
        "x * y": (x * y, a * b),
        "x / y": (x / y, a / b),
        "x + 1.5": (x + 1.5, a + 1.5),
        "1.5 + x": (1.5 + x, 1.5 + a),
        "x - 1.5": (x - 1.5, a - 1.5),
        "1.5 - x": (1.5 - x, 1.5 - a),
        "2 * x": (2 * x, 2 * a),
        "x / 4": (x / 4, a / 4),
        "1 / y": (1 / y, 1 / b),
        "-x": (-x, -a),
        "x @ w": (x @ w, a @ np.asarray(w)),
        "sum": ((x * x).sum(), np.sum(a * a, keepdims=True)),
    }
    for what, (got, want) in cases.items():
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, err_msg=what)
    assert x.shape == (2, 3) and x.dtype == np.float32 and x.ndim == 2 and x.size == 6
    assert isinstance(x.numpy(), np.ndarray)


def test_gradients_through_operators() -> None:
    dg = DynamicGraph()
    x = dg.variable(F32([1.0, 2.0, 3.0]))
    f = ((x * x) / 2.0 - x + 1.0).sum()
    (dx,) = dg.backward(f, [x])
    np.testing.assert_allclose(dx.numpy(), [0.0, 1.0, 2.0], rtol=1e-6)
    assert x.grad is dx


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_16_bit_variables_get_gradients_and_minimizer_steps(dtype) -> None:
    """bfloat16 results were once marked non-differentiable (NumPy's issubdtype does not
    count it as inexact): backward raised, or gave a mixed model's bfloat16 parameter a
    zero gradient and SGD left it where it was, silently."""
    dg = DynamicGraph()
    x = dg.variable(jnp.arange(1, 4, dtype=dtype))
    y = (x * x).sum()
    assert y.requires_grad
    np.testing.assert_array_equal(np.asarray(dg.backward(y, [x])[0], F32), [2, 4, 6])
    dg = DynamicGraph()
    v, w = dg.variable(np.ones(3, F32)), dg.variable(jnp.ones(3, dtype))
    wide = dg.exec(ops.datatype_conversion(dtype="float32"), w * w)
    loss = (v * wide).sum() + (v * v).sum()
    gv, gw = dg.backward(loss, [v, w])
    np.testing.assert_array_equal(np.asarray(gv), [3, 3, 3])  # d/dv: w*w + 2v
    np.testing.assert_array_equal(np.asarray(gw, F32), [2, 2, 2])  # d/dw: 2 v w
    dg.zero_grad()  # backward accumulated into w's gradient
    dg.minimize(optax.sgd(0.1), loss, [w])
    np.testing.assert_array_equal(np.asarray(w, F32), np.asarray(jnp.full(3, 0.8, dtype), F32))


def test_alias_of_alias_sees_new_values() -> None:
    """NNC: "dynamic graph alias an alias"."""
    dg = DynamicGraph()
    a = dg.variable(np.arange(10, 16, dtype=F32).reshape(2, 3))
    a0 = dg.alias(a, (1, 3), offset=(1, 0))
    a1 = dg.alias(a0, (2,), offset=(1,), stride=(1,))
    np.testing.assert_array_equal(a0.numpy(), [[13, 14, 15]])
    np.testing.assert_array_equal(a1.numpy(), [14, 15])
    dg.set(a, np.arange(20, 26, dtype=F32).reshape(2, 3))
    np.testing.assert_array_equal(a0.numpy(), [[23, 24, 25]])
    np.testing.assert_array_equal(a1.numpy(), [24, 25])


def test_indexing_and_reshape_are_views() -> None:
    dg = DynamicGraph()
    v = np.arange(24, dtype=F32).reshape(4, 6)
    x = dg.variable(v)
    np.testing.assert_array_equal(x[1].numpy(), v[1])
    np.testing.assert_array_equal(x[:, 2].numpy(), v[:, 2])
    np.testing.assert_array_equal(x[1:3, ::2].numpy(), v[1:3, ::2])
    np.testing.assert_array_equal(x[1:3, ::2][1, 1:].numpy(), v[1:3, ::2][1, 1:])
    np.testing.assert_array_equal(x[..., -1].numpy(), v[..., -1])
    np.testing.assert_array_equal(x.reshape(2, 12)[1].numpy(), v.reshape(2, 12)[1])
    np.testing.assert_array_equal(x[2].reshape(3, -1).numpy(), v[2].reshape(3, -1))
    assert x[1].is_alias and len(x) == 4
    with pytest.raises(ValueError, match="consecutive"):
        x[:, 1:3].reshape(8)


def test_gradient_through_views_sums_into_the_root() -> None:
    dg = DynamicGraph()
    x = dg.variable(np.arange(6, dtype=F32).reshape(2, 3))
    f = (x[0] * x[1]).sum() + (x[:, 1] * 3.0).sum()
    (dx,) = dg.backward(f, [x])
    want = np.array([[3, 4 + 3, 5], [0, 1 + 3, 2]], F32)
    np.testing.assert_allclose(dx.numpy(), want)


def test_setitem_writes_a_new_version_old_readers_keep_theirs() -> None:
    dg = DynamicGraph()
    y = dg.variable(F32([1.0, 2.0, 3.0]), name="y")
    before = y * 1.0
    y[1] = 20.0
    y[2:] = before[:1] * 5.0
    np.testing.assert_array_equal(y.numpy(), [1.0, 20.0, 5.0])
    np.testing.assert_array_equal(before.numpy(), [1.0, 2.0, 3.0])
    (dy,) = dg.backward(y.sum(), [before])
    np.testing.assert_array_equal(dy.numpy(), [5.0, 0.0, 0.0])


def test_listing_shows_writes_as_new_versions() -> None:
    dg = DynamicGraph()
    z = dg.variable(F32([2.0]), name="z")
    y = dg.variable(F32([0.0, 0.0]), name="y")
    dg.exec(ops.scalar_mul(a=10.0), z, outputs=[y[0:1]], name="y0")
    text = str(dg)
    assert "write_view[shape=(1,), base=0, stride=(1,)]" in text
    assert "scalar_mul[a=10.0](%0)  # y0" in text
    assert text.startswith("graph(%0:f32[1] z, %1:f32[2] y)")


def test_exec_returns_tuples_for_multi_output_commands() -> None:
    dg = DynamicGraph()
    logits = dg.variable(rand((2, 3)))
    loss, p = dg.exec(ops.softmax_crossentropy(), logits, np.array([0, 2], np.int32))
    assert loss.shape == (2, 1) and p.shape == (2, 3)
    np.testing.assert_allclose(p.numpy().sum(-1), 1.0, rtol=1e-6)


def _write(dg: DynamicGraph, how: str, c, x) -> None:
    if how == "write":
        dg.write(c, x * 2.0)
    elif how == "write held":  # the value is a live variable: it keeps its gradient
        z = x * 2.0
        dg.write(c, z)
        (dz,) = dg.backward((z * x).sum(), [x])
        np.testing.assert_allclose(dz.numpy(), 4 * X3)
        dg.zero_grad()
    elif how == "exec outputs":
        dg.exec(ops.scalar_mul(a=2.0), x, outputs=[c])
    elif how == "exec outputs, memoised and recorded":  # the recorded loss keeps its path
        loss = (x * 2.0).sum()
        dg.exec(ops.scalar_mul(a=2.0), x, outputs=[c])
        (dl,) = dg.backward(loss, [x])
        np.testing.assert_allclose(dl.numpy(), [2.0, 2.0, 2.0])
        dg.zero_grad()
    elif how == "setitem":
        c[:] = x * 2.0
    else:
        c[0:3] = x * 2.0


X3 = F32([1.0, 2.0, 3.0])
HOWS = ["write", "write held", "exec outputs", "exec outputs, memoised and recorded"]


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("how", [*HOWS, "setitem", "setitem alias"])
def test_a_constant_written_from_a_variable_stays_constant(how: str, lazy: bool) -> None:
    # however a value computed from x is written into a constant, d/dx sum(c * x) = c:
    # the constant holds the value only (NNC asserts an exec never writes a constant)
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(X3, name="x")
    c = dg.constant(np.ones(3, F32), name="c")
    _write(dg, how, c, x)
    assert not c.requires_grad
    (dx,) = dg.backward((c * x).sum(), [x])
    np.testing.assert_allclose(c.numpy(), 2 * X3)
    np.testing.assert_allclose(dx.numpy(), 2 * X3)  # jax.grad of sum(stop_gradient(2x) x)
