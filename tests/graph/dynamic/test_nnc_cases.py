"""NNC's dynamic graph cases (test/unit/nnc/dynamic.graph.tests.c), float32."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import DynamicGraph

F32 = np.float32


def _f(dg: DynamicGraph, x, y):
    """f = x * log(x) + y * x, written into f as NNC writes it."""
    f = dg.exec(ops.ewlog(), x, name="log")
    dg.exec(ops.ewprod(), x, f, outputs=[f])
    z = dg.exec(ops.ewprod(), x, y)
    dg.exec(ops.ewsum(), f, z, outputs=[f])
    return f


def test_x_log_x_value_and_gradients() -> None:
    dg = DynamicGraph()
    x = dg.variable(F32([19.0]), name="x")
    y = dg.variable(F32([1.2]), name="y")
    f = _f(dg, x, y)
    assert float(f.numpy()[0]) == pytest.approx(78.744340604, rel=1e-6)
    (dx,) = dg.backward(f, [x])
    assert float(dx.numpy()[0]) == pytest.approx(5.144438979, rel=1e-6)
    (dy,) = dg.backward(f, [y])
    assert float(dy.numpy()[0]) == pytest.approx(19.0, rel=1e-6)
    assert dg.grad(x) is dx and dg.grad(y) is dy


def test_second_backward_accumulates_into_dx() -> None:
    dg = DynamicGraph()
    x = dg.variable(F32([19.0]), name="x")
    y = dg.variable(F32([1.2]), name="y")
    f = _f(dg, x, y)
    (dx,) = dg.backward(f, [x])
    dg.free(x)
    x = dg.variable(F32([10.0]), name="x")
    dg.exec(ops.ewlog(), x, outputs=[f])
    dg.exec(ops.ewprod(), x, f, outputs=[f])
    z = dg.exec(ops.ewprod(), x, y)
    dg.exec(ops.ewsum(), f, z, outputs=[f])
    assert float(f.numpy()[0]) == pytest.approx(10 * np.log(10) + 12, rel=1e-6)
    # NNC passes the same dx again: the gradient adds up (log 19 + 2.2 + log 10 + 2.2).
    (g,) = dg.backward(f, [x], into=[dx])
    assert g is dx and dg.grad(x) is dx
    assert float(dx.numpy()[0]) == pytest.approx(9.647024072, rel=1e-6)


def test_gradient_set_to_zero_then_accumulated_again() -> None:
    dg = DynamicGraph()
    x = dg.variable(F32([19.0]), name="x")
    y = dg.variable(F32([1.2]), name="y")
    f = _f(dg, x, y)
    (dx,) = dg.backward(f, [x])
    dg.exec(ops.set(shape=(1,), value=0.0), outputs=[dx])
    dy, dx2 = dg.backward(f, [y, x])
    assert dx2 is dx
    assert float(dx.numpy()[0]) == pytest.approx(5.144438979, rel=1e-6)
    assert float(dy.numpy()[0]) == pytest.approx(19.0, rel=1e-6)


def test_repeated_product_with_a_constant() -> None:
    dg = DynamicGraph()
    x = dg.variable(F32([32.0]), name="x")
    y = dg.constant(F32([0.9]), name="y")
    ox, z = x, x
    for i in range(4):
        nz = dg.exec(ops.ewprod(), z, y)
        if i > 0:
            dg.free(z)
        z = nz
    (dx,) = dg.backward(z, [ox])
    assert float(dx.numpy()[0]) == pytest.approx(0.6561, rel=1e-6)
    assert float(z.numpy()[0]) == pytest.approx(32 * 0.6561, rel=1e-6)
    dg.free(ox)
    assert dg.num_nodes == 0


def test_alias_writes_then_product() -> None:
    dg = DynamicGraph()
    x = dg.variable(F32([0.0]), name="x")
    y = dg.variable(F32([0.0, 0.0]), name="y")
    z = dg.variable(F32([0.0]), name="z")
    dg.exec(ops.set(shape=(1,), value=2.0), outputs=[z])
    dg.exec(ops.set(shape=(1,), value=10.0), outputs=[x])
    y_1 = dg.alias(y, (1,))
    y_2 = dg.alias(y, (1,), offset=(1,))
    dg.exec(ops.scalar_mul(a=10.0), z, outputs=[y_1])
    dg.exec(ops.scalar_mul(a=2.0), z, outputs=[y_2])
    f = dg.exec(ops.mul(), x, y)
    np.testing.assert_allclose(f.numpy(), [200.0, 40.0], rtol=1e-6)
    for v in (z, y_1, y_2, x, y, f):
        dg.free(v)
    assert dg.num_nodes == 0 and dg.num_tensors == 0


def test_item_assignment_writes_a_new_version_gradients_flow() -> None:
    dg = DynamicGraph()
    z = dg.variable(F32([2.0]), name="z")
    x = dg.variable(F32([10.0]), name="x")
    y = dg.variable(F32([0.0, 0.0]), name="y")
    y[0:1] = z * 10.0
    y[1:2] = z * 2.0
    f = x * y
    np.testing.assert_allclose(f.numpy(), [200.0, 40.0], rtol=1e-6)
    (dz,) = dg.backward(f.sum(), [z])
    np.testing.assert_allclose(dz.numpy(), [120.0], rtol=1e-6)


def test_dense_net_with_aliases() -> None:
    dg = DynamicGraph()
    x = dg.variable(F32([[0.472, 0, 0, 0]]), name="x")
    w = [
        dg.variable(F32([[0.234]])),
        dg.variable(F32([[0.374, 0.886]])),
        dg.variable(F32([[0.484, 0.912, 0.235]])),
    ]
    b = [dg.variable(F32([0.1])), dg.variable(F32([0.2])), dg.variable(F32([0.3]))]
    for k in range(3):
        src = dg.alias(x, (1, k + 1))
        dst = dg.alias(x, (1, 1), offset=(0, k + 1))
        dg.exec(ops.gemm(transpose_b=True), src, w[k], b[k], outputs=[dst])
    want = [0.472, 0, 0, 0]
    want[1] = want[0] * 0.234 + 0.1
    want[2] = want[0] * 0.374 + want[1] * 0.886 + 0.2
    want[3] = want[0] * 0.484 + want[1] * 0.912 + want[2] * 0.235 + 0.3
    np.testing.assert_allclose(x.numpy()[0], want, rtol=1e-6)
    (dw1,) = dg.backward(x, [w[0]], df=np.ones((1, 4), F32) * F32([0, 0, 0, 1]))
    assert float(dw1.numpy()[0, 0]) == pytest.approx((0.235 * 0.886 + 0.912) * 0.472, rel=1e-5)


def test_detach_then_free_prunes_as_nnc() -> None:
    dg = DynamicGraph()
    x = dg.variable(F32([10.0]), name="x")
    y = dg.exec(ops.ewlog(), x)
    z = dg.exec(ops.scalar_mul(a=0.5), y)
    assert float(z.numpy()[0]) == pytest.approx(0.5 * np.log(10), rel=1e-6)
    assert dg.num_nodes == 2 and dg.num_tensors == 3
    (dx,) = dg.backward(z, [x])
    assert float(dx.numpy()[0]) == pytest.approx(0.05, rel=1e-6)
    dg.zero_grad()
    dg.detach(y)
    assert dg.num_nodes == 1
    assert not y.requires_grad
    with pytest.raises(Exception, match="constant"):
        dg.backward(z, [y])
    (dx,) = dg.backward(z, [x])  # x no longer influences z
    assert float(dx.numpy()[0]) == 0.0
    dg.free(x)
    assert dg.num_nodes == 0


def test_free_then_detach_prunes_as_nnc() -> None:
    dg = DynamicGraph()
    x = dg.variable(F32([10.0]), name="x")
    y = dg.exec(ops.ewlog(), x)
    z = dg.exec(ops.scalar_mul(a=0.5), y)
    dg.free(x)
    assert dg.num_nodes == 1  # log(x) goes with x; y, a leaf now, still feeds z
    dg.detach(y)
    assert dg.num_nodes == 0
    assert float(z.numpy()[0]) == pytest.approx(0.5 * np.log(10), rel=1e-6)


def test_a_times_log_x_detach_keeps_both_until_a_is_freed() -> None:
    dg = DynamicGraph()
    x = dg.variable(F32([10.0]), name="x")
    a = dg.variable(F32([5.0]), name="a")
    y = dg.exec(ops.ewlog(), x)
    z = dg.exec(ops.mul(), a, y)
    dg.detach(y)
    assert dg.num_nodes == 2
    dg.free(a)
    assert dg.num_nodes == 1
    dg.free(x)
    assert dg.num_nodes == 0
    assert z.shape == (1,)


def test_exp_half_log_detach_keeps_exp() -> None:
    dg = DynamicGraph()
    x = dg.variable(F32([10.0]), name="x")
    y = dg.exec(ops.ewlog(), x)
    z = dg.exec(ops.scalar_mul(a=0.5), y)
    f = dg.exec(ops.ewexp(), z)
    dg.detach(y)
    assert dg.num_nodes == 2
    dg.free(f)
    assert dg.num_nodes == 1
    dg.free(z)
    assert dg.num_nodes == 1
    dg.free(y)
    assert dg.num_nodes == 0


def test_long_chain_of_frees_keeps_values() -> None:
    """NNC's "long dynamic graph with unused variables freed": x = 32, y = 0.5; ten steps
    z = x y (the first seven) or z = x x (y freed before the eighth), each x freed once
    used but the last; x ends as 32 * 0.5^7 squared three times."""
    dg = DynamicGraph()
    x = dg.variable(F32([32.0]))
    y = dg.variable(F32([0.5]))
    for i in range(10):
        if i == 7:
            dg.free(y)  # no longer needed
        z = dg.exec(ops.ewprod(), x, y) if i < 7 else dg.exec(ops.ewprod(), x, x)
        if i < 9:
            dg.free(x)
        x = z
    g = 32.0
    for i in range(10):
        g = g * 0.5 if i < 7 else g * g
    assert float(x.numpy()[0]) == pytest.approx(g, rel=1e-5)


def test_backward_through_an_alias_wrt() -> None:
    dg = DynamicGraph()
    x = dg.variable(F32([10.0]))
    y = dg.variable(F32([2.0, 4.0]))
    y_t = dg.alias(y, (2, 1))
    f = dg.exec(ops.mul(), x, y_t)
    dg.free(x)
    dg.free(y)
    (dy_t,) = dg.backward(f, [y_t], df=np.ones((2, 1), F32))
    np.testing.assert_allclose(dy_t.numpy(), [[10.0], [10.0]])
    dg.free(y_t)
    dg.free(f)
    assert dg.num_nodes == 0


def test_sum_of_last_three_gradients() -> None:
    dg = DynamicGraph()
    y = dg.variable(F32([1.3]))
    xs, fs, dys = [], [], []
    for i in range(10):
        xs.append(dg.variable(F32([i + 1])))
        fs.append(dg.exec(ops.mul(), xs[i], y))
        if i >= 5:
            target = [dys[min(2, i - 5)]] if i - 5 >= 3 else None
            (g,) = dg.backward(fs[i], [y], into=target)
            if i - 5 < 3:
                dys.append(g)
                dg.grads.clear()
        if i == 7:
            for j in range(5):
                dg.free(fs[j])
    assert float(fs[9].numpy()[0]) == pytest.approx(13.0, rel=1e-6)
    assert float(dys[2].numpy()[0]) == pytest.approx(8 + 9 + 10, rel=1e-6)


def test_accumulate_into_x_itself() -> None:
    dg = DynamicGraph()
    x = dg.variable(F32([10.0]))
    y = dg.exec(ops.ewlog(), x)
    dg.exec(ops.ewprod(), x, y, outputs=[y])
    f = dg.exec(ops.ewsum(), y, x)
    dg.backward(f, [x], df=F32([1.0]), into=[x])
    assert float(x.numpy()[0]) == pytest.approx(10 + np.log(10) + 2, rel=1e-6)
