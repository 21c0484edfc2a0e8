"""NNC's dynamic graph cases (test/unit/nnc/dynamic.graph.tests.c), float32, the parts
the other ports leave out: the bookkeeping counts and effect queries of the detach
cases, the destructor-hook case, and the cases that write ``CMD_SET_FORWARD`` into a
variable, in eager and lazy mode. (test/unit/nnc/tape.tests.c tests NNC's C tape for
while loops; fnnc differentiates without a tape, so it has nothing to port.)

NNC's ``ccv_nnc_dynamic_graph_bookkeeping_count(graph, CCV_NNC_SYMBOL_GRAPH_EXEC)`` is
``dg.num_nodes``, its ``CCV_NNC_SYMBOL_TENSOR`` count is ``dg.num_tensors``; its
``has_effect_to_tensor_variables`` bitmask is ``dg.has_effect``'s list. Each docstring
names the C test case; oracles are NNC's numbers and closed forms.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import DynamicGraph

F32 = np.float32
LAZY = pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])


def _counts(dg: DynamicGraph) -> tuple[int, int]:
    return dg.num_nodes, dg.num_tensors


# -- detach cases: node and tensor counts, effect queries ------------------------------


@LAZY
def test_half_log_detach_frees_the_product_and_cuts_the_effect(lazy: bool) -> None:
    """NNC: "compute f(x) = 0.5 * log(x), detach log(x) means 0.5 * y should be freed":
    counts (2, 3) then (1, 3) after the detach, x stops having an effect on z, and
    freeing x then y and z leaves nothing."""
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(F32([10.0]), name="x")
    y = dg.exec(ops.ewlog(), x)
    assert float(y.numpy()[0]) == pytest.approx(np.log(10), abs=1e-5)
    z = dg.exec(ops.scalar_mul(a=0.5), y)
    assert float(z.numpy()[0]) == pytest.approx(0.5 * np.log(10), abs=1e-5)
    assert _counts(dg) == (2, 3)  # nothing freed
    assert dg.has_effect([x], [z]) == [True]
    dg.detach(y)
    assert _counts(dg) == (1, 3)  # 0.5 * y freed
    assert dg.has_effect([x], [z]) == [False]
    dg.free(x)
    assert _counts(dg) == (0, 1)  # x and y (detached, read by nothing) freed: z is left
    dg.free(y)
    dg.free(z)
    assert _counts(dg) == (0, 0)


@LAZY
def test_free_x_then_detach_log_frees_every_node(lazy: bool) -> None:
    """NNC: "compute f(x) = 0.5 * log(x), detach log(x) after freeing x means all
    computations on the graph should be freed": (2, 3), then (1, 2) once x (and log(x))
    is freed, then no node once y is detached; nothing left after y and z go."""
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(F32([10.0]), name="x")
    y = dg.exec(ops.ewlog(), x)
    z = dg.exec(ops.scalar_mul(a=0.5), y)
    assert float(z.numpy()[0]) == pytest.approx(0.5 * np.log(10), abs=1e-5)
    assert _counts(dg) == (2, 3)
    dg.free(x)
    assert _counts(dg) == (1, 2)  # log(x) and x freed
    dg.detach(y)
    assert _counts(dg) == (0, 1)  # x and y freed: z is left
    assert float(y.numpy()[0]) == pytest.approx(np.log(10), abs=1e-5)  # values stay
    dg.free(y)
    dg.free(z)
    assert _counts(dg) == (0, 0)


@LAZY
def test_a_times_log_detach_keeps_nodes_but_cuts_the_effect(lazy: bool) -> None:
    """NNC: "compute f(x) = a * log(x), detach log(x) means nothing changed": counts
    (2, 4) before and after the detach, x's effect on z is cut, freeing a frees a * y
    (1, 3), freeing x frees the rest."""
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(F32([10.0]), name="x")
    a = dg.variable(F32([5.0]), name="a")
    y = dg.exec(ops.ewlog(), x)
    assert float(y.numpy()[0]) == pytest.approx(np.log(10), abs=1e-5)
    z = dg.exec(ops.mul(), a, y)
    assert float(z.numpy()[0]) == pytest.approx(5 * np.log(10), abs=1e-5)
    assert _counts(dg) == (2, 4)
    assert dg.has_effect([x], [z]) == [True]
    dg.detach(y)
    assert _counts(dg) == (2, 4)  # nothing freed
    assert dg.has_effect([x], [z]) == [False]
    dg.free(a)
    assert _counts(dg) == (1, 3)  # a * y and a freed
    dg.free(x)
    assert _counts(dg) == (0, 1)  # x and y freed
    dg.free(y)
    dg.free(z)
    assert _counts(dg) == (0, 0)


@LAZY
def test_exp_times_log_counts_and_effect_through_either_factor(lazy: bool) -> None:
    """NNC: "compute f(x) = exp(x) * log(x), detach log(x) means nothing changed": the
    effect query and tensor counts next to the node counts test_nnc_cases_2.py checks:
    (3, 4) with an effect, (3, 4) still with an effect through exp(x) after detaching
    log(x), (2, 4) and no effect after detaching exp(x), 3 tensors once a is freed."""
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(F32([10.0]), name="x")
    a = dg.exec(ops.ewexp(), x)
    y = dg.exec(ops.ewlog(), x)
    z = dg.exec(ops.mul(), a, y)
    assert float(z.numpy()[0]) == pytest.approx(np.exp(10) * np.log(10), abs=1e-2)
    assert _counts(dg) == (3, 4)
    assert dg.has_effect([x], [z]) == [True]
    dg.detach(y)
    assert _counts(dg) == (3, 4)
    assert dg.has_effect([x], [z]) == [True]  # through exp(x)
    dg.detach(a)
    assert _counts(dg) == (2, 4)  # a * y freed
    assert dg.has_effect([x], [z]) == [False]
    dg.free(a)
    assert dg.num_tensors == 3
    dg.free(x)
    assert _counts(dg) == (0, 1)  # x and y freed
    dg.free(y)
    dg.free(z)
    assert _counts(dg) == (0, 0)


@LAZY
def test_exp_of_half_log_detach_keeps_exp_until_f_is_freed(lazy: bool) -> None:
    """NNC: "compute f(x) = exp(0.5 * log(x)), detach log(x) won't free exp(_)": the whole
    sequence of NNC's counts, (2, 4), (1, 3), (1, 2), (0, 1), (0, 0), and the effect of x
    on f before and after the detach."""
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(F32([10.0]), name="x")
    y = dg.exec(ops.ewlog(), x)
    assert float(y.numpy()[0]) == pytest.approx(np.log(10), abs=1e-5)
    z = dg.exec(ops.scalar_mul(a=0.5), y)
    assert float(z.numpy()[0]) == pytest.approx(0.5 * np.log(10), abs=1e-5)
    f = dg.exec(ops.ewexp(), z)
    assert float(f.numpy()[0]) == pytest.approx(np.exp(0.5 * np.log(10)), abs=1e-5)
    assert dg.has_effect([x], [f]) == [True]
    dg.detach(y)
    assert _counts(dg) == (2, 4)  # 0.5 * y freed
    assert dg.has_effect([x], [f]) == [False]
    dg.free(f)
    assert _counts(dg) == (1, 3)  # exp(_) freed
    dg.free(z)
    assert _counts(dg) == (1, 2)  # z freed, nothing else changes
    dg.free(y)
    assert _counts(dg) == (0, 1)  # log(x) freed
    dg.free(x)
    assert _counts(dg) == (0, 0)


# -- destructor hook ---------------------------------------------------------------------


@LAZY
def test_constant_products_release_their_tensors_only_after_backward(lazy: bool) -> None:
    """NNC: "repeat multiple x * y with y as a constant, compute d(x)": NNC's destructor
    hook (``ccv_nnc_tensor_variable_destructor_hook``) is a ``weakref.finalize`` on each
    variable's array. The freed intermediates stay alive until backward needs them no
    more: 0 released before, 4 (x and three products) after backward and freeing x,
    the other 3 (y, dx, the last product) when the graph goes."""
    released: list[str] = []

    def hook(v, tag: str) -> None:
        weakref.finalize(v.value, released.append, tag)

    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(F32([32.0]), name="x")
    y = dg.constant(F32([0.9]), name="y")
    ox = x
    hook(x, "x")
    hook(y, "y")
    for i in range(4):
        z = dg.exec(ops.ewprod(), x, y)
        hook(z, f"z{i}")
        if i > 0:
            dg.free(x)
        x = z
    gc.collect()
    assert released == []  # none of these are freed
    (dx,) = dg.backward(x, [ox])
    hook(dx, "dx")
    dg.free(ox)
    gc.collect()
    assert sorted(released) == ["x", "z0", "z1", "z2"]  # all freed except dx (and y, z)
    assert float(dx.numpy()[0]) == pytest.approx(0.9**4, abs=1e-5)
    released.clear()
    del dg, x, y, z, dx, ox
    gc.collect()
    assert sorted(released) == ["dx", "y", "z3"]


# -- CMD_SET_FORWARD into a variable -------------------------------------------------------


@LAZY
def test_set_then_alias_writes_then_free_everything(lazy: bool) -> None:
    """NNC: "dynamic graph to compute f(x) = x * y, where y[0] = 10 * z, y[1] = 2 * z,
    z = [2], x = [10], should free all variables": z and x get their values from
    ``CMD_SET_FORWARD``, y's halves from ``CMD_SCALAR_MUL_FORWARD`` through aliases."""
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(F32([0.0]), name="x")
    y = dg.variable(F32([0.0, 0.0]), name="y")
    z = dg.variable(F32([0.0]), name="z")
    dg.exec(ops.set(shape=(1,), value=2.0), outputs=[z])
    dg.exec(ops.set(shape=(1,), value=10.0), outputs=[x])
    y_1 = dg.alias(y, (1,), stride=(1,))
    y_2 = dg.alias(y, (1,), offset=(1,), stride=(1,))
    dg.exec(ops.scalar_mul(a=10.0), z, outputs=[y_1])
    dg.exec(ops.scalar_mul(a=2.0), z, outputs=[y_2])
    f = dg.exec(ops.mul(), x, y)
    np.testing.assert_allclose(f.numpy(), [10 * 2 * 10, 2 * 2 * 10], atol=1e-5)
    for v in (z, y_1, y_2, x, y, f):
        dg.free(v)
    assert _counts(dg) == (0, 0)


@LAZY
def test_gradient_seed_from_set_accumulates_onto_x_itself(lazy: bool) -> None:
    """NNC: "compute f(x) = x * log(x) + x, f'(x) when x = 10 (and intermediate results
    all freed)": the seed df is a variable made 1 by ``CMD_SET_FORWARD(1)``, and x is
    its own gradient's target: x becomes 10 + log(10) + 1 + 1."""
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(F32([10.0]), name="x")
    y = dg.exec(ops.ewlog(), x)
    dg.exec(ops.ewprod(), x, y, outputs=[y])
    f = dg.exec(ops.ewsum(), y, x)
    df = dg.variable(F32([0.0]), name="df")
    dg.exec(ops.set(shape=(1,), value=1.0), outputs=[df])
    dg.backward(f, [x], df=df, into=[x])
    assert float(x.numpy()[0]) == pytest.approx(10 + np.log(10) + 1 + 1, abs=1e-5)


@LAZY
def test_gradient_against_a_reshaping_alias_after_its_root_is_freed(lazy: bool) -> None:
    """NNC: "dynamic graph to compute f(x) = x * y', where y[0, 0] = 2, y[0, 1] = 4,
    x = [10], y' = y^T, gradient against y": x from ``CMD_SET_FORWARD(10)``, y' a
    [2, 1] alias of the 2-vector y; x and y are freed before backward, the gradient
    against y' is [10, 10], and freeing y' and f frees every node."""
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(F32([0.0]), name="x")
    y = dg.variable(F32([4.0, 0.0]), name="y")  # NNC writes data[0] twice: 2, then 4
    dg.exec(ops.set(shape=(1,), value=10.0), outputs=[x])
    y_t = dg.alias(y, (2, 1))
    f = dg.exec(ops.mul(), x, y_t)
    dg.free(x)
    dg.free(y)
    (dy_t,) = dg.backward(f, [y_t], df=np.ones((2, 1), F32))
    np.testing.assert_allclose(dy_t.numpy().ravel(), [10.0, 10.0], atol=1e-5)
    dg.free(y_t)
    dg.free(f)
    assert _counts(dg) == (0, 0)  # dy_t, backward's result, has no symbol (as in NNC)


# -- eager cases run lazily ---------------------------------------------------------------


def test_dense_net_written_through_aliases_lazily() -> None:
    """NNC: "dynamic graph with dense net (extensive use of alias)", lazy mode: three
    gemms each read a prefix of x and write the next element of x through NNC's
    [4, 1]-strided aliases; NNC's x and d x[3] / d w1."""
    dg = DynamicGraph(lazy=True)
    x = dg.variable(F32([[0.472, 0.0, 0.0, 0.0]]), name="x")
    ws = [[0.234], [0.374, 0.886], [0.484, 0.912, 0.235]]
    w = [dg.variable(F32([row])) for row in ws]
    b = [dg.variable(F32([c])) for c in (0.1, 0.2, 0.3)]
    for k in range(3):
        src = dg.alias(x, (1, k + 1), stride=(4, 1))
        dst = dg.alias(x, (1, 1), offset=(0, k + 1), stride=(4, 1))
        dg.exec(ops.gemm(transpose_b=True), src, w[k], b[k], outputs=[dst])
    want = [0.472, 0.0, 0.0, 0.0]
    want[1] = want[0] * 0.234 + 0.1
    want[2] = want[0] * 0.374 + want[1] * 0.886 + 0.2
    want[3] = want[0] * 0.484 + want[1] * 0.912 + want[2] * 0.235 + 0.3
    np.testing.assert_allclose(x.numpy()[0], want, rtol=1e-6)
    (dw1,) = dg.backward(x, [w[0]], df=F32([[0.0, 0.0, 0.0, 1.0]]))
    assert float(dw1.numpy()[0, 0]) == pytest.approx((0.235 * 0.886 + 0.912) * 0.472, abs=1e-5)


def test_alias_of_an_alias_lazily() -> None:
    """NNC: "dynamic graph alias an alias", lazy mode, with NNC's strides: a0 is row 1 of
    a [2, 3] variable (stride (3, 1)), a1 the last two elements of a0; both follow
    each value ``set`` gives the root."""
    dg = DynamicGraph(lazy=True)
    a = dg.variable(np.zeros((2, 3), F32), name="a")
    a0 = dg.alias(a, (1, 3), offset=(1, 0), stride=(3, 1))
    a1 = dg.alias(a0, (2,), offset=(1,), stride=(1,))
    dg.set(a, np.arange(10, 16, dtype=F32).reshape(2, 3))
    np.testing.assert_array_equal(a0.numpy(), [[13, 14, 15]])
    np.testing.assert_array_equal(a1.numpy(), [14, 15])
    dg.set(a, np.arange(20, 26, dtype=F32).reshape(2, 3))
    np.testing.assert_array_equal(a0.numpy(), [[23, 24, 25]])
    np.testing.assert_array_equal(a1.numpy(), [24, 25])


def test_long_chain_with_frees_between_backwards_lazily() -> None:
    """NNC: "long chain to autograd, simulate random free of unused tensors due to
    garbage collection", lazy mode: f[i] = x[i] * y, backward of f[5], f[6] into fresh
    gradients and of f[7..9] into one, f[0..4] freed after step 7: f[9] = 13, the
    shared gradient 8 + 9 + 10."""
    dg = DynamicGraph(lazy=True)
    y = dg.variable(F32([1.3]), name="y")
    xs, fs, dys = [], [], []
    for i in range(10):
        xs.append(dg.variable(F32([i + 1])))
        fs.append(dg.exec(ops.mul(), xs[i], y))
        if i >= 5:
            if i - 5 < 3:
                dys.append(dg.variable(F32([0.0])))
            dg.backward(fs[i], [y], into=[dys[min(2, i - 5)]])
        if i == 7:
            for j in range(5):
                dg.free(fs[j])
    assert float(fs[9].numpy()[0]) == pytest.approx(1.3 * 10, abs=1e-5)
    assert [float(d.numpy()[0]) for d in dys] == pytest.approx([6.0, 7.0, 8 + 9 + 10])
