"""More of NNC's dynamic graph cases (test/unit/nnc/dynamic.graph.tests.c), float32:
single commands, aliases, batch norm written in place, a gradient command run directly,
frees, detach and dependency. The cnnp cases are in ``test_nnc_cases_3.py``.

Each docstring names the C test case. Oracles: NNC's numbers, closed forms, NumPy, and
the command run on arrays outside the graph.
"""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import DynamicGraph

F32 = np.float32


def test_log_of_19() -> None:
    """NNC: "dynamic graph to compute log(19)"."""
    dg = DynamicGraph()
    a = dg.variable(F32([19.0]), name="a")
    b = dg.exec(ops.ewlog(), a)
    assert float(b.numpy()[0]) == pytest.approx(np.log(19.0), abs=1e-5)


def test_reciprocal_with_a_ones_numerator() -> None:
    """NNC: "dynamic graph to compute reciprocal" (NNC's nil numerator; fnnc's
    ``ewdiv`` spells it as a ones tensor)."""
    dg = DynamicGraph()
    a = dg.variable(F32([19.0]), name="a")
    b = dg.exec(ops.ewdiv(), F32([1.0]), a)
    assert float(b.numpy()[0]) == pytest.approx(1.0 / 19, abs=1e-5)
    (da,) = dg.backward(b, [a])
    assert float(da.numpy()[0]) == pytest.approx(-1.0 / 19**2, rel=1e-5)


def test_aliases_see_each_value_the_root_is_set_to() -> None:
    """NNC: "dynamic graph with alias": views at offsets 1 and 0 of a 2-vector follow
    ``set`` (NNC's ``ccv_nnc_tensor_variable_set``)."""
    dg = DynamicGraph()
    a = dg.variable(np.zeros(2, F32), name="a")
    a0 = dg.alias(a, (1,), offset=(1,))
    a1 = dg.alias(a, (1,))
    dg.set(a, F32([10.0, 11.0]))
    assert float(a0.numpy()[0]) == 11.0 and float(a1.numpy()[0]) == 10.0
    dg.set(a, F32([20.0, 21.0]))
    assert float(a0.numpy()[0]) == 21.0 and float(a1.numpy()[0]) == 20.0
    assert a0.is_alias and a1.is_alias and a0.shape == a1.shape == (1,)


def test_gradient_with_respect_to_an_intermediate_variable() -> None:
    """NNC: "dynamic graph to compute f(x) = x * log(x) + 1.2 * x, f'(x) where x = 19",
    the part not in test_nnc_cases.py: ``df/dz`` for the computed ``z = x * y`` is 1."""
    dg = DynamicGraph()
    x = dg.variable(F32([19.0]), name="x")
    y = dg.variable(F32([1.2]), name="y")
    f = dg.exec(ops.ewlog(), x)
    dg.exec(ops.ewprod(), x, f, outputs=[f])
    z = dg.exec(ops.ewprod(), x, y)
    dg.exec(ops.ewsum(), f, z, outputs=[f])
    assert float(f.numpy()[0]) == pytest.approx(19 * np.log(19) + 1.2 * 19, rel=1e-6)
    (dz,) = dg.backward(f, [z])
    assert float(dz.numpy()[0]) == pytest.approx(1.0, abs=1e-5)
    (dx,) = dg.backward(f, [x])  # x's own gradient is untouched by the one above
    assert float(dx.numpy()[0]) == pytest.approx(np.log(19) + 1 + 1.2, abs=1e-5)


def test_batch_norm_writes_running_statistics_into_its_inputs() -> None:
    """NNC: "batch norm in dynamic graph (enforce inplace)": the running mean and
    variance are both inputs and outputs; the handles stay the same and every output
    equals the command run on plain arrays (NNC's check) and NumPy."""
    rng = np.random.default_rng(1)
    xv = (1.0 - rng.random((2, 2, 2, 10))).astype(F32)  # (0, 1], as dsfmt's open_close
    ones, zeros = np.ones(10, F32), np.zeros(10, F32)
    cmd = ops.batch_norm(axes=(0, 1, 2), epsilon=0.0, momentum=0.9, is_test=False)
    dg = DynamicGraph()
    x, scale, bias = dg.variable(xv), dg.variable(ones), dg.variable(zeros)
    mean, var = dg.variable(zeros, name="mean"), dg.variable(zeros, name="var")
    y, saved_mean, saved_inv_std = (dg.variable(np.zeros(s, F32)) for s in (xv.shape, 10, 10))
    outs = dg.exec(
        cmd, x, scale, bias, mean, var, outputs=[y, mean, var, saved_mean, saved_inv_std]
    )
    assert outs[1] is mean and outs[2] is var
    want = cmd(xv, ones, zeros, zeros, zeros)
    for got, w in zip((y, mean, var, saved_mean, saved_inv_std), want):
        np.testing.assert_allclose(got.numpy(), np.asarray(w), rtol=1e-6, atol=1e-7)
    mu, sigma2 = xv.mean(axis=(0, 1, 2)), xv.var(axis=(0, 1, 2))
    np.testing.assert_allclose(y.numpy(), (xv - mu) / np.sqrt(sigma2), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mean.numpy(), 0.1 * mu, rtol=1e-5)
    np.testing.assert_allclose(var.numpy(), 0.1 * sigma2, rtol=1e-5)
    np.testing.assert_allclose(saved_inv_std.numpy(), 1 / np.sqrt(sigma2), rtol=1e-5)


def test_division_gradient_command_run_directly() -> None:
    """NNC: "empty inputs / outputs for dynamic graph": EWDIV's backward run as a
    command for the numerator's gradient only, ``d(1 / x)/d(numerator) = 1 / 10``.
    fnnc's spelling: ``ops.gradient(of=ops.ewdiv(), wants=(0,))`` reads the forward
    inputs its ``backward_uses`` names, so the (ones) numerator is passed."""
    s = ((1,), np.dtype(F32))
    cmd = ops.gradient(
        of=ops.ewdiv(), in_specs=(s, s), out_specs=(s,), grad_mask=(True,), wants=(0,)
    )
    dg = DynamicGraph()
    df = dg.variable(F32([1.0]), name="df")
    x = dg.variable(F32([10.0]), name="x")
    y = dg.exec(cmd, df, F32([1.0]), x)
    assert float(y.numpy()[0]) == pytest.approx(1.0 / 10, abs=1e-5)


def test_repeated_product_with_a_constant_freeing_each_step() -> None:
    """NNC: "repeat multiple x * y with y as a constant": ten products, each freeing
    the factor before, give 32 * 0.5^10; with the trainable start freed and the other
    factor a constant, nothing stays recorded."""
    dg = DynamicGraph()
    x = dg.variable(F32([32.0]), name="x")
    y = dg.constant(F32([0.5]), name="y")
    for _ in range(10):
        z = dg.exec(ops.ewprod(), x, y)
        dg.free(x)
        x = z
    assert float(x.numpy()[0]) == pytest.approx(32 * 0.5**10, abs=1e-5)
    assert dg.num_nodes == 0


def test_set_then_log() -> None:
    """NNC: "dynamic graph with binded value" (``set`` gives the variable a value)."""
    dg = DynamicGraph()
    x = dg.variable(F32([0.0]), name="x")
    dg.set(x, F32([10.0]))
    y = dg.exec(ops.ewlog(), x)
    assert float(y.numpy()[0]) == pytest.approx(np.log(10.0), abs=1e-5)
    (dx,) = dg.backward(y, [x])  # set keeps the variable trainable
    assert float(dx.numpy()[0]) == pytest.approx(0.1, rel=1e-6)


def _x_log_x_plus_alias(dg: DynamicGraph, two_aliases: bool):
    x = dg.variable(F32([19.0]), name="x")
    f = dg.exec(ops.ewlog(), x)
    dg.exec(ops.ewprod(), x, f, outputs=[f])
    z = dg.variable(F32([1.2]), name="z")
    y = dg.variable(F32([0.0]), name="y")
    y_hat = dg.alias(y, (1,))
    y_written = dg.alias(y, (1,)) if two_aliases else y
    dg.exec(ops.ewprod(), x, z, outputs=[y_written])
    dg.exec(ops.ewsum(), f, y_hat, outputs=[f])
    return x, z, y, y_hat, y_written, f


@pytest.mark.parametrize("two_aliases", [False, True])
def test_sum_through_an_alias_then_free_everything(two_aliases: bool) -> None:
    """NNC: "dynamic graph to compute f(x) = x * log(x) + y' where y = 1.2 * x and y' is
    an alias to y" and its twin "... where y'' = 1.2 * x and both y'' and y' are aliases
    to y": the alias read after the write sees it; once every variable is freed no
    tensor is left."""
    dg = DynamicGraph()
    handles = _x_log_x_plus_alias(dg, two_aliases)
    x, f = handles[0], handles[-1]
    assert float(f.numpy()[0]) == pytest.approx(19 * np.log(19) + 1.2 * 19, rel=1e-6)
    (dx,) = dg.backward(f, [x])  # an extra check: d/dx through the aliased write
    assert float(dx.numpy()[0]) == pytest.approx(np.log(19) + 1 + 1.2, rel=1e-5)
    dg.free(dx)
    freed = set()
    for v in handles:
        if id(v) not in freed:
            freed.add(id(v))
            dg.free(v)
    assert dg.num_nodes == 0 and dg.num_tensors == 0


def test_aliases_freed_before_their_root_is_read() -> None:
    """NNC: "dynamic graph to compute f(x) = x * y, where y[0] = 10 * z, y[1] = 2 * z,
    z = [2], x = [10], freed y[0], y[1] before use": the writes stay in y, and the
    graph keeps NNC's 3 ops (the two products written through the aliases and x * y).
    """
    dg = DynamicGraph()
    x = dg.variable(F32([0.0]), name="x")
    y = dg.variable(F32([0.0, 0.0]), name="y")
    z = dg.variable(F32([0.0]), name="z")
    dg.exec(ops.set(shape=(1,), value=2.0), outputs=[z])
    dg.exec(ops.set(shape=(1,), value=10.0), outputs=[x])
    y_1 = dg.alias(y, (1,), stride=(1,))
    y_2 = dg.alias(y, (1,), offset=(1,), stride=(1,))
    dg.exec(ops.scalar_mul(a=10.0), z, outputs=[y_1])
    dg.exec(ops.scalar_mul(a=2.0), z, outputs=[y_2])
    dg.free(y_1)
    dg.free(y_2)
    f = dg.exec(ops.mul(), x, y)
    assert dg.num_nodes == 3
    np.testing.assert_allclose(f.numpy(), [10 * 2 * 10, 2 * 2 * 10], atol=1e-5)
    for v in (z, x, y, f):
        dg.free(v)
    assert dg.num_nodes == 0 and dg.num_tensors == 0


def test_set_into_a_variable_keeps_it_trainable() -> None:
    """NNC: "dynamic graph to accumulate gradients cross cnnp models" (and its alias
    twin) make ``a`` with ``CMD_SET_FORWARD(0.2485)`` into a new variable, then take
    gradients with respect to ``a`` and train it. Minimal form of that pattern."""
    dg = DynamicGraph()
    a = dg.variable(F32([0.0]), name="a")
    dg.exec(ops.set(shape=(1,), value=0.2485), outputs=[a])
    x = dg.constant(F32([3.0]), name="x")
    f = dg.exec(ops.mul(), x, a)
    (da,) = dg.backward(f, [a])
    assert float(da.numpy()[0]) == pytest.approx(3.0)


def test_exp_times_log_detach_one_factor_then_the_other() -> None:
    """NNC: "compute f(x) = exp(x) * log(x), detach log(x) means nothing changed".

    Node counts are NNC's (3, 3, 2, 0). NNC's effect query is read here through
    gradients (every step is strictly monotone at x = 10, so an effect is a non-zero
    derivative): both factors, then exp(x) only, then none.
    """
    dg = DynamicGraph()
    x = dg.variable(F32([10.0]), name="x")
    a = dg.exec(ops.ewexp(), x)
    y = dg.exec(ops.ewlog(), x)
    z = dg.exec(ops.mul(), a, y)
    assert float(a.numpy()[0]) == pytest.approx(np.exp(10.0), abs=1e-2)
    assert float(y.numpy()[0]) == pytest.approx(np.log(10.0), abs=1e-5)
    assert float(z.numpy()[0]) == pytest.approx(np.exp(10.0) * np.log(10.0), abs=1e-2)
    assert dg.num_nodes == 3

    def dz_dx() -> float:
        (g,) = dg.backward(z, [x])
        value = float(g.numpy()[0])
        dg.free(g)
        return value

    assert dz_dx() == pytest.approx(np.exp(10.0) * (np.log(10.0) + 0.1), rel=1e-5)
    dg.detach(y)
    assert dg.num_nodes == 3  # exp(x) still reaches z through a
    assert dz_dx() == pytest.approx(np.exp(10.0) * np.log(10.0), rel=1e-5)
    dg.detach(a)
    assert dg.num_nodes == 2  # a * y goes
    assert dz_dx() == 0.0
    dg.free(a)
    dg.free(x)
    assert dg.num_nodes == 0
    dg.free(y)
    dg.free(z)
    assert dg.num_tensors == 0


def _dependency_graph(dg: DynamicGraph):
    a = dg.variable(F32([10.0]), name="a")
    b = dg.exec(ops.scalar_mul(a=0.5), a)
    c = dg.variable(F32([9.0]), name="c")
    d = dg.exec(ops.scalar_mul(a=0.4), c)
    e = dg.exec(ops.scalar_mul(a=2.0), d)
    f = dg.exec(ops.ewsum(), a, c)
    g = dg.exec(ops.ewsum(), e, b)
    return a, b, c, d, e, f, g


def test_which_variables_reach_another() -> None:
    """NNC: "query whether a tensor variable depends on another", values and the
    dependencies read through gradients (all steps are linear with non-zero factors,
    so an ancestor is exactly a variable with a non-zero derivative)."""
    dg = DynamicGraph()
    a, b, c, _, e, f, g = _dependency_graph(dg)
    assert float(f.numpy()[0]) == pytest.approx(10 + 9, abs=1e-5)
    assert float(g.numpy()[0]) == pytest.approx(10 * 0.5 + 9 * 0.4 * 2, abs=1e-5)
    grads = [float(v.numpy()[0]) for v in dg.backward(g, [a, b, c, e])]
    assert grads == pytest.approx([0.5, 1.0, 0.8, 1.0])
    dg.zero_grad()
    grads = [float(v.numpy()[0]) for v in dg.backward(f, [a, e, c])]
    assert grads == pytest.approx([1.0, 0.0, 1.0])


def test_has_effect_query() -> None:
    """NNC: "query whether a tensor variable depends on another", the query itself
    (NNC's bitmasks 3, 7 and 5 as lists)."""
    dg = DynamicGraph()
    a, b, c, _, e, f, g = _dependency_graph(dg)
    assert dg.has_effect([a, b, f], [g]) == [True, True, False]
    assert dg.has_effect([a, e, c, f], [g]) == [True, True, True, False]
    assert dg.has_effect([a, e, c], [f]) == [True, False, True]


def test_has_effect_stops_at_a_detached_value() -> None:
    """exp(x) * log(x): both factors carry x to f; once log(x) is detached, x reaches f
    through exp(x) alone, and the detached factor itself affects nothing."""
    dg = DynamicGraph()
    x = dg.variable(F32([10.0]), name="x")
    y, z = dg.exec(ops.ewexp(), x), dg.exec(ops.ewlog(), x)
    f = dg.exec(ops.mul(), y, z)
    assert dg.has_effect([x, y, z], [f]) == [True, True, True]
    dg.detach(z)
    assert dg.has_effect([x, y, z], [f]) == [True, True, False]
    assert dg.has_effect([f], [x]) == [False]
