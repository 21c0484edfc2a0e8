"""NNC's op and autograd tests (liuliu/ccv ``test/unit/nnc/*.tests.c``), continued from
``test_nnc_op_cases_4.py``: the two ``autograd.tests.c`` cases no other fnnc test ports
on a built graph ("simple autograd ..." and "... D[(x - y) * (x + 1), [x, y]] ..."), the
``autograd.tests.c`` and ``autograd.vector.tests.c`` formulas again on fnnc's dynamic
graph (NNC builds them symbolically; the same numbers must come out of the eager
recording), ``transform.tests.c``'s masked fill of a 3d tensor through a compiled graph
and its backward called as NNC calls it, ``index.tests.c`` / ``transform.tests.c``
views and ``concat.tests.c`` / ``compare.tests.c`` models on the dynamic graph, and
``reduce.tests.c``'s axis-0 reductions written, as NNC writes them, into a ``[3]``
tensor. Each test names the C test case it ports; the expected numbers are NNC's
(stated in the C test, or its closed form).

Translations: NNC's ``one`` tensor holding 1 is a graph input fed 1; ``ADD(1, -1)`` is
``ops.add(p=1, q=-1)``; NNC's tensor views are ``GraphBuilder.alias`` /
``DynamicGraph.alias``; values uniform in (0, 1] (NNC's ``dsfmt_genrand_open_close``)
come from NumPy's generator.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import DynamicGraph, GraphBuilder, backward, compile, interpret
from fnnc.models import CommandLayer, Concat, Dense, Input, Model
from tests.helpers import assert_close

f32, i32 = np.float32, np.int32


def _a(*values):
    """Expected values as float32 arrays (a list would be a pytree of scalars)."""
    arrays = [np.asarray(v, f32) for v in values]
    return arrays[0] if len(arrays) == 1 else arrays


def _both(graph, *args):
    """The graph's outputs from interpret (the oracle) and from the compiled program."""
    return [
        [np.asarray(t) for t in outs] for outs in (interpret(graph, *args), compile(graph)(*args))
    ]


# -- autograd.tests.c ------------------------------------------------------------------------


def _x_squared_plus_log_inverse(b, one, x):
    """NNC's prod (w = x * x), inv (u = 1 / x), log (v = Log[u]) and sum (z = w + v)."""
    w = b.exec(ops.ewprod(), x, x, name="prod")
    u = b.exec(ops.ewdiv(), one, x, name="inv")
    v = b.exec(ops.ewlog(), u, name="log")
    return b.exec(ops.ewsum(), w, v, name="sum")


def test_simple_autograd_x_squared_plus_log_inverse() -> None:
    """NNC: "simple autograd with D[x * x + Log[1 / x], x] when x = 0.84": z = 0.84^2 +
    log(1 / 0.84) and dz/dx = 2 * 0.84 - 1 / 0.84 (NNC's tolerance, 1e-6), interpreted
    and compiled."""
    b = GraphBuilder()
    one, x = b.input((1,), name="1"), b.input((1,), name="x")
    z = _x_squared_plus_log_inverse(b, one, x)
    graph, _ = backward(b.build([z]), z, [x])
    for got_z, got_dx in _both(graph, np.ones(1, f32), np.full(1, 0.84, f32)):
        assert_close(got_z, _a([0.84 * 0.84 + np.log(1 / 0.84)]), rtol=0, atol=1e-6)
        assert_close(got_dx, _a([2 * 0.84 - 1 / 0.84]), rtol=0, atol=1e-6)


def test_simple_autograd_on_a_dynamic_graph() -> None:
    """NNC: "simple autograd with D[x * x + Log[1 / x], x] when x = 0.84", the same nodes
    run eagerly on a dynamic graph and differentiated through its recording."""
    dg = DynamicGraph()
    one, x = dg.constant(np.ones(1, f32), name="1"), dg.variable(np.full(1, 0.84, f32), name="x")
    z = _x_squared_plus_log_inverse(dg, one, x)
    (dx,) = dg.backward(z, [x])
    assert_close(z.numpy(), _a([0.84 * 0.84 + np.log(1 / 0.84)]), rtol=0, atol=1e-6)
    assert_close(dx.numpy(), _a([2 * 0.84 - 1 / 0.84]), rtol=0, atol=1e-6)


XY_VALUE = (43.24 - 0.38) * (0.38 + 1)
XY_DX = 0.38 + 1
XY_DY = -2 * 0.38 + 43.24 - 1


def _difference_times_sum(b, one, x, y):
    """NNC's minus (w = ADD(1, -1) of x, y), plus (u = ADD(1, 1) of y, 1), prod (w * u).
    The case's title says (x + 1); its nodes and numbers are (y + 1)."""
    w = b.exec(ops.add(p=1, q=-1), x, y, name="minus")
    u = b.exec(ops.add(p=1, q=1), y, one, name="plus")
    return b.exec(ops.ewprod(), w, u, name="prod")


def test_autograd_of_difference_times_sum_for_x_and_y() -> None:
    """NNC: "autograd with D[(x - y) * (x + 1), [x, y]] when x = 43.24 and y = 0.38":
    v = 42.86 * 1.38, dv/dx = 1.38 and dv/dy = -2y + x - 1, one backward for both
    (NNC's tolerance 1e-6, relative here: v is 59 and float32's step there is 4e-6)."""
    b = GraphBuilder()
    one, x, y = b.input((1,), name="1"), b.input((1,), name="x"), b.input((1,), name="y")
    v = _difference_times_sum(b, one, x, y)
    graph, _ = backward(b.build([v]), v, [x, y])
    args = np.ones(1, f32), np.full(1, 43.24, f32), np.full(1, 0.38, f32)
    for got in _both(graph, *args):
        assert_close(got, _a([XY_VALUE], [XY_DX], [XY_DY]), rtol=1e-6, atol=1e-6)


def test_autograd_of_difference_times_sum_on_a_dynamic_graph() -> None:
    """NNC: "autograd with D[(x - y) * (x + 1), [x, y]] when x = 43.24 and y = 0.38" on
    fnnc's dynamic graph: one backward gives both gradients."""
    dg = DynamicGraph()
    one = dg.constant(np.ones(1, f32), name="1")
    x, y = dg.variable(np.full(1, 43.24, f32), name="x"), dg.variable(np.full(1, 0.38, f32))
    v = _difference_times_sum(dg, one, x, y)
    dx, dy = dg.backward(v, [x, y])
    got = [v.numpy(), dx.numpy(), dy.numpy()]
    assert_close(got, _a([XY_VALUE], [XY_DX], [XY_DY]), rtol=1e-6, atol=1e-6)


def test_partial_autograd_on_a_dynamic_graph() -> None:
    """NNC: "partial autograd with D[y * x + Log[1 / x], y] when x = 0.84 and y = 1.23"
    on the dynamic graph: dz/dy = x, and x, not asked for, gets no gradient."""
    dg = DynamicGraph()
    one = dg.constant(np.ones(1, f32), name="1")
    x, y = dg.variable(np.full(1, 0.84, f32), name="x"), dg.variable(np.full(1, 1.23, f32))
    w = dg.exec(ops.ewprod(), y, x, name="prod")
    v = dg.exec(ops.ewlog(), dg.exec(ops.ewdiv(), one, x, name="inv"), name="log")
    z = dg.exec(ops.ewsum(), w, v, name="sum")
    (dy,) = dg.backward(z, [y])
    assert_close(z.numpy(), _a([1.23 * 0.84 + np.log(1 / 0.84)]), rtol=0, atol=1e-6)
    assert_close(dy.numpy(), _a([0.84]), rtol=0, atol=1e-6)
    assert dg.grad(x) is None


def test_two_separate_functions_on_a_dynamic_graph() -> None:
    """NNC: "autograd with D[x * x + Log[1 / x], x] D[y * y + Log[1 / y], y] when x = 0.84
    and y = 0.24" on the dynamic graph: one backward of both outputs, each gradient from
    its own function only."""
    dg = DynamicGraph()
    one = dg.constant(np.ones(1, f32), name="1")
    x, y = dg.variable(np.full(1, 0.84, f32), name="x"), dg.variable(np.full(1, 0.24, f32))
    z0 = _x_squared_plus_log_inverse(dg, one, x)
    z1 = _x_squared_plus_log_inverse(dg, one, y)
    dx, dy = dg.backward([z0, z1], [x, y])
    for z, d, v in ((z0, dx, 0.84), (z1, dy, 0.24)):
        assert_close(z.numpy(), _a([v * v + np.log(1 / v)]), rtol=0, atol=1e-6)
        assert_close(d.numpy(), _a([2 * v - 1 / v]), rtol=0, atol=1e-5)


# -- autograd.vector.tests.c on the dynamic graph ----------------------------------------------


def test_autograd_through_views_of_a_sum_on_a_dynamic_graph() -> None:
    """NNC: "autograd with D[y = x + [1 1.5] => x_1 + (y_1 + y_1 ^ 2) + Exp[y_2], x] when
    x = [0.44 -1.18]", its views as dynamic-graph aliases: dx = [1 + 1 + 2 y_1, e^y_2]."""
    dg = DynamicGraph()
    x = dg.variable(np.array([0.44, -1.18], f32), name="x")
    y = dg.exec(ops.ewsum(), x, dg.constant(np.array([1, 1.5], f32), name="[1 1.5]"))
    x_1 = dg.alias(x, (1,), name="x_1")
    y_1, y_2 = dg.alias(y, (1,), name="y_1"), dg.alias(y, (1,), offset=(1,), name="y_2")
    u_1 = dg.exec(ops.ewsum(), dg.exec(ops.ewprod(), y_1, y_1, name="sqr"), y_1)
    v = dg.exec(ops.ewsum(), x_1, u_1, dg.exec(ops.ewexp(), y_2, name="exp"), name="sum")
    (dx,) = dg.backward(v, [x])
    value = 0.44 + (1.44 + 1.44**2) + np.exp(-1.18 + 1.5)
    assert_close(v.numpy(), _a([value]), rtol=1e-6, atol=1e-6)
    assert_close(dx.numpy(), _a([2 + 2 * 1.44, np.exp(-1.18 + 1.5)]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("write_y_2", [True, False], ids=["two-writers", "one-writer"])
def test_autograd_through_written_views_on_a_dynamic_graph(write_y_2) -> None:
    """NNC: "autograd with D[y_1 = Log[x_1], y_2 = x_2 ^ 2 => y_1 ^ 2 + y_1 * y_2, x] when
    x = [0.38 -2.8]" and "autograd with D[y_1 = Log[x_1] => y_1 ^ 2 + y_1, x] when
    x = [0.21 -13.22]": y written through its views by log (and x_2 ^ 2), on the dynamic
    graph; dx_2 is 0 where nothing reads x_2."""
    x0, x1 = (0.38, -2.8) if write_y_2 else (0.21, -13.22)
    dg = DynamicGraph()
    x = dg.variable(np.array([x0, x1], f32), name="x")
    y = dg.variable(np.zeros(2, f32), name="y")
    x_1, y_1 = dg.alias(x, (1,), name="x_1"), dg.alias(y, (1,), name="y_1")
    dg.exec(ops.ewlog(), x_1, outputs=[y_1], name="log")
    if write_y_2:
        x_2, y_2 = dg.alias(x, (1,), offset=(1,)), dg.alias(y, (1,), offset=(1,), name="y_2")
        dg.exec(ops.ewprod(), x_2, x_2, outputs=[y_2], name="x_2_sqr")
    w = dg.exec(ops.ewprod(), y_1, y_1, name="y_1_sqr")
    rest = dg.exec(ops.ewprod(), y_1, y_2, name="prod") if write_y_2 else y_1
    v = dg.exec(ops.ewsum(), w, rest, name="sum")
    (dx,) = dg.backward(v, [x])
    l1 = np.log(x0)
    if write_y_2:
        value, grad = l1 * l1 + l1 * x1**2, [2 * l1 / x0 + x1**2 / x0, 2 * x1 * l1]
    else:
        value, grad = l1 * l1 + l1, [2 * l1 / x0 + 1 / x0, 0]
    assert_close(v.numpy(), _a([value]), rtol=1e-5, atol=1e-5)
    assert_close(dx.numpy(), _a(grad), rtol=1e-5, atol=1e-5)


def test_autograd_through_concatenated_views_on_a_dynamic_graph() -> None:
    """NNC: "autograd with concatenated tensors to check dependencies done correctly
    (similar to observation / action concatenation for critics)": obs [B, 4] and act
    [B, 1] written by format transforms into the two views of obs_act [B, 5], read by two
    gemms (w1, w2 [5, 1]); one backward of v1 and v2: each of obs and act gets the sum of
    both critics' gradients (NNC checks a sum node before each; jax.grad as the oracle,
    B = 3 for NNC's 64)."""
    rng = np.random.default_rng(3)
    obs_v, act_v = rng.random((3, 4)).astype(f32), rng.random((3, 1)).astype(f32)
    w1_v, w2_v = rng.random((5, 1)).astype(f32), rng.random((5, 1)).astype(f32)
    dg = DynamicGraph()
    obs, act = dg.variable(obs_v, name="obs"), dg.variable(act_v, name="act")
    w1, w2 = dg.variable(w1_v, name="w1"), dg.variable(w2_v, name="w2")
    obs_act = dg.variable(np.zeros((3, 5), f32), name="obs_act")
    obs0 = dg.alias(obs_act, (3, 4), stride=(5, 1), name="obs0")
    act0 = dg.alias(obs_act, (3, 1), (0, 4), stride=(5, 1), name="act0")
    # NNC's obst / actt are FORMAT_TRANSFORM between two NHWC tensors: a plain copy
    same = ops.format_transform(src="NHWC", dst="NHWC")
    dg.exec(same, obs, outputs=[obs0], name="obst")
    dg.exec(same, act, outputs=[act0], name="actt")
    v1 = dg.exec(ops.gemm(), obs_act, w1, name="gemm1")
    v2 = dg.exec(ops.gemm(), obs_act, w2, name="gemm2")
    ones = np.ones((3, 1), f32)
    got = dg.backward([v1, v2], [w1, w2, obs, act], df=[ones, ones])

    def critics(w1, w2, obs, act):
        x = jax.numpy.concatenate([obs, act], 1)
        return (x @ w1).sum() + (x @ w2).sum()

    want = jax.grad(critics, argnums=(0, 1, 2, 3))(w1_v, w2_v, obs_v, act_v)
    assert_close([g.numpy() for g in got], list(want), rtol=1e-5, atol=1e-6)


def test_format_transform_between_the_same_format_is_a_copy_at_rank_2() -> None:
    """NNC: "autograd with concatenated tensors to check dependencies done correctly
    (similar to observation / action concatenation for critics)": its obst and actt
    nodes are CMD_FORMAT_TRANSFORM_FORWARD() from NHWC [64, 4] / [64, 1] into NHWC views;
    NNC's kernel copies when the formats agree, whatever the rank. Forward and
    backward are the identity."""
    x = np.arange(12, dtype=f32).reshape(3, 4)
    cmd = ops.format_transform(src="NHWC", dst="NHWC")
    np.testing.assert_array_equal(np.asarray(cmd(x)), x)
    spec = jax.ShapeDtypeStruct(x.shape, f32)
    (dx,) = cmd.definition.backward((x,), (spec,), (None,), **cmd.kwargs)
    np.testing.assert_array_equal(np.asarray(dx), x)


# -- transform.tests.c: masked fill of a 3d tensor ----------------------------------------------


def _masked_fill_data():
    """NNC's a [6, 5, 4] uniform in (0, 1] and b [5, 4] = 1, 0, 1, 0, ... (int32); the
    positions MASKED_FILL(0, -1e8) hits are the odd j of each [5, 4] plane."""
    a = (1 - np.random.default_rng(0).random((6, 5, 4))).astype(f32)
    b = np.where(np.arange(20) % 2 == 1, 0, 1).astype(i32).reshape(5, 4)
    hit = np.broadcast_to((np.arange(20) % 2 == 1).reshape(5, 4), a.shape)
    return a, b, hit


def test_masked_fill_forward_and_backward_a_3d_tensor_through_a_graph() -> None:
    """NNC: "masked fill forward a 3d tensor" and "masked fill backward a 3d tensor":
    c = -1e8 where the broadcast mask is 0, else a (exactly), and the gradient passes
    where it is not, 0 where it is; built, differentiated and compiled as one graph."""
    a, b, hit = _masked_fill_data()
    gb = GraphBuilder()
    xs, ms = gb.input(a.shape, name="a"), gb.input(b.shape, i32, name="b")
    c = gb.exec(ops.masked_fill(eq=0, fill=-1e8), xs, ms, name="masked fill")
    g = gb.input(a.shape, name="g")
    graph, _ = backward(gb.build([c]), c, [xs], df=g)
    for got_c, got_da in _both(graph, a, b, a):
        np.testing.assert_array_equal(got_c, np.where(hit, f32(-1e8), a))
        np.testing.assert_array_equal(got_da, np.where(hit, f32(0), a))


def test_masked_fill_backward_a_3d_tensor_without_the_input() -> None:
    """NNC: "masked fill backward a 3d tensor" calls MASKED_FILL_BACKWARD(0, -1e8) on
    (g, 0, b): the gradient needs only the mask. fnnc's backward gets the unused input
    as its ShapeDtypeStruct (fnnc's convention for a tensor the backward does not use)."""
    a, b, hit = _masked_fill_data()
    cmd = ops.masked_fill(eq=0, fill=-1e8)
    spec = jax.ShapeDtypeStruct(a.shape, f32)
    da, db = cmd.definition.backward((a,), (spec, b), (None,), **cmd.kwargs)
    assert db is None
    np.testing.assert_array_equal(np.asarray(da), np.where(hit, f32(0), a))


# -- index.tests.c and transform.tests.c: views on the dynamic graph ---------------------------


def test_index_select_a_tensor_view_forward_and_backward_on_a_dynamic_graph() -> None:
    """NNC: "index select a tensor view" and "backward index select a tensor view" with
    dynamic-graph aliases: rows [1, 1] of columns 1:3 of a [3, 4] land in columns 1:3 of
    a zeroed [2, 4]; the gradient, columns 1:3 of [[0, 3, 4, 0], [0, 1, 5, 0]], sums
    into row 1 of columns 1:3 of a zeroed [3, 4] gradient tensor."""
    dg = DynamicGraph()
    a = dg.variable(np.array([[1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]], f32), name="a")
    av = dg.alias(a, (3, 2), (0, 1), name="av")
    idx = dg.constant(np.array([1, 1], i32), name="indices")
    b = dg.variable(np.zeros((2, 4), f32), name="b")
    bv = dg.alias(b, (2, 2), (0, 1), name="bv")
    dg.exec(ops.index_select(), av, idx, outputs=[bv])
    np.testing.assert_array_equal(b.numpy(), [[0, 3, 4, 0], [0, 3, 4, 0]])
    g = np.array([[0, 3, 4, 0], [0, 1, 5, 0]], f32)[:, 1:3]
    ga = dg.variable(np.zeros((3, 4), f32), name="ga")
    dg.backward(bv, [av], df=[g], into=[dg.alias(ga, (3, 2), (0, 1))])
    np.testing.assert_array_equal(ga.numpy(), [[0, 0, 0, 0], [0, 4, 9, 0], [0, 0, 0, 0]])


def test_format_transform_between_tensor_views_on_a_dynamic_graph() -> None:
    """NNC: "format transform between NHWC and NCHW tensor views": the HWC view [4, 3, 2]
    at (3, 2, 1) of an iota [7, 6, 5] written as CHW into the view [2, 4, 3] at (3, 2, 1)
    of a zeroed [8, 7, 6]; everything outside the view stays 0."""
    iota = np.arange(7 * 6 * 5, dtype=f32).reshape(7, 6, 5)
    dg = DynamicGraph()
    a = dg.variable(iota, name="a")
    b = dg.variable(np.zeros((8, 7, 6), f32), name="b")
    dg.exec(
        ops.format_transform(src="NHWC", dst="NCHW"),
        dg.alias(a, (4, 3, 2), (3, 2, 1)),
        outputs=[dg.alias(b, (2, 4, 3), (3, 2, 1))],
    )
    want = np.zeros((8, 7, 6), f32)
    want[3:5, 2:6, 1:4] = iota[3:7, 2:5, 1:3].transpose(2, 0, 1)
    np.testing.assert_array_equal(b.numpy(), want)


# -- concat.tests.c and compare.tests.c: models evaluated on the dynamic graph -----------------


def test_concatenate_several_tensors_in_a_model_on_a_dynamic_graph() -> None:
    """NNC: "concatenate several tensors together": concat of [-0.5] and [0.3, 2], then a
    dense(1) without bias, its weights set to 1 (NNC's parameters_map of SET(1)),
    evaluated on the dynamic graph: 1.8, and the gradient of each input is 1."""
    x, y = Input(), Input()
    dense = Dense(1, no_bias=True, name="linear")
    model = Model([x, y], [dense(Concat(axis=0)(x, y))], name="full")
    dg = DynamicGraph()
    a, b = dg.variable(np.array([-0.5], f32)), dg.variable(np.array([0.3, 2], f32))
    dg.evaluate(model, [a, b])
    for p in dg.parameters(model).values():
        dg.set(p, np.ones(p.numpy().shape, f32))
    c = dg.evaluate(model, [a, b])
    assert_close(c.numpy(), _a([-0.5 + 0.3 + 2]), rtol=1e-5, atol=1e-5)
    da, db = dg.backward(c, [a, b])
    assert_close([da.numpy(), db.numpy()], _a([1], [1, 1]), rtol=0, atol=0)


@pytest.mark.parametrize("name, shift", [("min", -1), ("max", 1)])
def test_min_max_of_two_tensors_with_model_on_a_dynamic_graph(name, shift) -> None:
    """NNC: "min of two tensors with model" / "max of two tensors with model": a = i,
    b = i - 1 (min) or i + 1 (max) over a [2, 2, 3]; the result is b, evaluated as a
    model on the dynamic graph, and the gradient goes to b alone (b wins everywhere)."""
    x, y = Input(), Input()
    model = Model([x, y], [CommandLayer(getattr(ops, name)(), name=name)(x, y)])
    av = np.arange(12, dtype=f32).reshape(2, 2, 3)
    dg = DynamicGraph()
    a, b = dg.variable(av), dg.variable(av + shift)
    c = dg.evaluate(model, [a, b])
    np.testing.assert_array_equal(c.numpy(), av + shift)
    da, db = dg.backward(c, [a, b], df=[np.ones((2, 2, 3), f32)])
    np.testing.assert_array_equal(da.numpy(), np.zeros((2, 2, 3), f32))
    np.testing.assert_array_equal(db.numpy(), np.ones((2, 2, 3), f32))


# -- reduce.tests.c: NNC's [3] output of an axis-0 reduction -----------------------------------

A23 = np.array([[1, 2, 3], [4, 5, 6]], f32)


@pytest.mark.parametrize(
    "name, want",
    [
        ("reduce_sum", [5, 7, 9]),
        ("reduce_mean", [2.5, 3.5, 4.5]),
        ("reduce_max", [4, 5, 6]),
        ("reduce_min", [1, 2, 3]),
        ("reduce_norm2", np.sqrt([17, 29, 45])),
    ],
)
def test_reduce_on_axis_0_into_nnc_s_flat_output(name, want) -> None:
    """NNC: "reduce sum / mean / max / min / norm2 for [[1, 2, 3], [4, 5, 6]] on axis 0":
    NNC writes the result into a tensor of shape [3] (the kept axis is implicit); on the
    dynamic graph a [3] variable passed as ``outputs=`` takes the [1, 3] result."""
    dg = DynamicGraph()
    a = dg.constant(A23, name="a")
    b = dg.variable(np.zeros(3, f32), name="b")
    dg.exec(getattr(ops, name)(axes=(0,)), a, outputs=[b])
    assert b.numpy().shape == (3,)
    assert_close(b.numpy(), np.asarray(want, f32), rtol=1e-6, atol=1e-6)
