"""NNC's ``parallel`` copies in the dynamic graph (fnnc/graph/dynamic/parallel.py), from
test/int/nnc/dynamic.graph.tests.c: "run dynamic graph minimize on multiple devices" and
"run dynamic graph backward & apply gradients on multiple devices" (NNC runs them on two
GPUs; here the copies share a device, then live on two CPU devices)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import GraphError
from fnnc.graph import DynamicGraph
from tests.helpers import rand, run_on_cpu_devices

# NNC's "minimizer" CMD_ADD_FORWARD(1, 1): x <- x + g
ADD = optax.GradientTransformation(lambda p: optax.EmptyState(), lambda g, s, p=None: (g, s))


def _copies(dg):
    x0, x1 = dg.variable(np.float32([2.0])), dg.variable(np.float32([-1.0]))
    y0, y1 = dg.exec(ops.scalar_mul(a=1.1), x0, x1, parallel=2)
    return x0, x1, y0, y1


def test_nnc_minimize_on_copies_sums_their_gradients():
    dg = DynamicGraph()
    x0, x1, y0, y1 = _copies(dg)
    dg.minimize(ADD, [y0, y1], [x0, x1], parallel=2)
    np.testing.assert_allclose([x0.numpy()[0], x1.numpy()[0]], [2 + 1.1 * 2, -1 + 1.1 * 2], 1e-6)


def test_nnc_backward_twice_then_apply_gradients_on_copies():
    dg = DynamicGraph()
    x0, x1, y0, y1 = _copies(dg)
    for _ in range(2):
        dg.backward([y0, y1], [x0, x1])
    dg.apply_gradients(ADD, [x0, x1], parallel=2)
    np.testing.assert_allclose([x0.numpy()[0], x1.numpy()[0]], [2 + 1.1 * 4, -1 + 1.1 * 4], 1e-6)


def test_exec_runs_the_command_on_each_copy_in_nnc_layout():
    dg = DynamicGraph()
    a0, b0, a1, b1 = (dg.variable(rand((2, 3), seed=s)) for s in range(4))
    s0, s1 = dg.exec(ops.ewsum(), a0, b0, a1, b1, parallel=2)
    np.testing.assert_allclose(s0.numpy(), a0.numpy() + b0.numpy(), 1e-6)
    np.testing.assert_allclose(s1.numpy(), a1.numpy() + b1.numpy(), 1e-6)
    out0, out1 = (
        dg.variable(np.zeros((2, 3), np.float32)),
        dg.variable(np.zeros((2, 3), np.float32)),
    )
    got = dg.exec(ops.ewsum(), a0, b0, a1, b1, outputs=[out0, out1], parallel=2)
    assert got == (out0, out1)
    np.testing.assert_allclose(out1.numpy(), a1.numpy() + b1.numpy(), 1e-6)


def test_copies_that_start_equal_train_as_one_variable_on_the_summed_loss():
    """Adam on each copy with the gradients summed over copies equals Adam on one
    variable whose loss is the sum of the copies' losses (jax.grad + optax)."""
    w = rand((3,), seed=7)
    data = [rand((4, 3), seed=8), rand((4, 3), seed=9)]
    dg = DynamicGraph()
    copies = [dg.variable(w), dg.variable(w)]
    opt = optax.adam(0.1)
    for _ in range(3):
        fs = [(dg.constant(d) * c).sum() ** 2 for d, c in zip(data, copies)]
        dg.minimize(opt, fs, copies, parallel=2)
    ref, state = jnp.asarray(w), opt.init(jnp.asarray(w))
    loss = lambda v: sum(jnp.sum(jnp.asarray(d) * v[None]) ** 2 for d in data)
    for _ in range(3):
        updates, state = opt.update(jax.grad(loss)(ref), state, ref)
        ref = optax.apply_updates(ref, updates)
    for c in copies:
        np.testing.assert_allclose(c.numpy(), ref, rtol=1e-5, atol=1e-6)


def _scalar_mul_on_two_copies(place):
    """NNC's CMD_SCALAR_MUL_FORWARD(0.4) on x0 = 10 and x1 = 9 with parallel 2; NNC's
    stream wait is reading the values (JAX's dispatch is asynchronous)."""
    dg = DynamicGraph()
    x0, x1 = dg.variable(place(np.float32([10.0]))), dg.variable(place(np.float32([9.0])))
    y0, y1 = dg.exec(ops.scalar_mul(a=0.4), x0, x1, parallel=2)
    np.testing.assert_allclose([y0.numpy()[0], y1.numpy()[0]], [10 * 0.4, 9 * 0.4], 1e-5)
    np.testing.assert_array_equal([x0.numpy()[0], x1.numpy()[0]], [10, 9])  # not written
    return dg, x0, x1, y0, y1


def test_parallel_exec_with_a_stream_focus_on_uma_tensors():
    """NNC's "parallel exec with a stream, focus on uma tensors" (dynamic.graph.tests.c):
    two [1] copies of host tensors through one command."""
    _scalar_mul_on_two_copies(np.asarray)


def test_parallel_exec_with_a_stream_focus_on_potential_memory_issues():
    """NNC's "parallel exec with a stream, focus on potential memory issues": the same on
    tensors placed on a named CPU device (NNC's CPU_NUMA_TENSOR_NHWC(000, ...)); the
    results stay on that device."""
    cpu0 = jax.devices("cpu")[0]
    dg, *_, y0, y1 = _scalar_mul_on_two_copies(lambda v: jax.device_put(v, cpu0))
    assert dg.value_of(y0).devices() == {cpu0} and dg.value_of(y1).devices() == {cpu0}


def test_copies_that_do_not_divide_are_refused_with_the_counts():
    dg = DynamicGraph()
    x0, x1, y0, y1 = _copies(dg)
    with pytest.raises(GraphError, match=r"parallel=3 .* divide by 3; got 2"):
        dg.exec(ops.scalar_mul(a=2.0), x0, x1, parallel=3)
    with pytest.raises(GraphError, match="an int >= 1; got True"):
        dg.minimize(ADD, [y0, y1], [x0, x1], parallel=True)
    dg.zero_grad()
    dg.backward([y0], [x0])
    with pytest.raises(GraphError, match="has no gradient to sum"):
        dg.apply_gradients(ADD, [x0, x1], parallel=2)


ON_TWO_DEVICES = """
import jax, numpy as np, optax
from fnnc import ops
from fnnc.graph import DynamicGraph, GraphBuilder, compile
d0, d1 = jax.devices()
ADD = optax.GradientTransformation(lambda p: optax.EmptyState(), lambda g, s, p=None: (g, s))

def copies():
    dg = DynamicGraph()
    x0 = dg.variable(jax.device_put(np.float32([2.0]), d0))
    x1 = dg.variable(jax.device_put(np.float32([-1.0]), d1))
    y0, y1 = dg.exec(ops.scalar_mul(a=1.1), x0, x1, parallel=2)
    return dg, x0, x1, y0, y1

dg, x0, x1, y0, y1 = copies()
dg.minimize(ADD, [y0, y1], [x0, x1], parallel=2)
assert np.allclose([x0.numpy()[0], x1.numpy()[0]], [4.2, 1.2], atol=1e-5)
assert dg.value_of(x1).devices() == {d1} and dg.value_of(x0).devices() == {d0}
dg, x0, x1, y0, y1 = copies()
dg.backward([y0, y1], [x0, x1])  # one gradient program per device
dg.backward([y0, y1], [x0, x1])
dg.apply_gradients(ADD, [x0, x1], parallel=2)
assert np.allclose([x0.numpy()[0], x1.numpy()[0]], [6.4, 3.4], atol=1e-5)
assert dg.value_of(x1).devices() == {d1}
# a one-device Program given arrays that all live on another device runs there
b = GraphBuilder()
x = b.input((2,))
prog = compile(b.build([b.exec(ops.scalar_mul(a=3.0), x)]))
out = prog(jax.device_put(np.float32([1, 2]), d1))
assert out.devices() == {d1} and np.allclose(out, [3, 6])
print("OK")
"""


def test_copies_on_two_devices_stay_there():
    run_on_cpu_devices(ON_TWO_DEVICES, devices=2)
