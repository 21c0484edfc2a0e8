"""NNC's op tests (liuliu/ccv ``test/unit/nnc/*.tests.c``), continued from
``test_nnc_op_cases_2.py``: the cases of ``scatter_add``, ``sort``, ``partition``,
``unique_consecutive``, ``reduce``, ``compare`` and ``histogram.tests.c`` that no other
fnnc test ports. Each test names the C test case it ports; the expected tensors are
NNC's.

Translations: NNC's tensor views are alias symbols (``GraphBuilder.alias``), and what a
C test leaves outside a written view is merged back with ``np.where``, as in
``test_nnc_op_cases.py``. NNC's "with model" cases run the command as a
``CommandLayer`` of a cnnp ``Model``. NNC reduces into ``[3]`` where fnnc keeps the
reduced axis (``[1, 3]``): the same memory. A ``null`` output gradient is NNC's
spelling of ones; fnnc passes the ones. Cross-entropy, ``conform_data_format``,
``numa``, minimizers, group / batch norm and attention are in
``test_nnc_op_cases_4.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, compile, interpret
from fnnc.models import CommandLayer, Input, Model
from tests.helpers import assert_close

f32, i32 = np.float32, np.int32


def _bwd(cmd, grads, inputs, outputs=None):
    """The command's backward, NNC's convention: gradients of the inputs."""
    outputs = (None,) * len(grads) if outputs is None else outputs
    return cmd.definition.backward(tuple(grads), tuple(inputs), tuple(outputs), **cmd.kwargs)


def _evaluate(layer_cmd, inputs, outputs=1):
    """NNC's ``ccv_cnnp_model_evaluate`` of a model holding one command."""
    xs = [Input() for _ in inputs]
    ys = CommandLayer(layer_cmd, outputs=outputs, name="cmd")(*xs)
    model = Model(xs, list(ys) if outputs > 1 else [ys])
    model.compile(list(inputs))
    got = model.evaluate(list(inputs))
    return [np.asarray(g) for g in got] if outputs > 1 else np.asarray(got)


# -- scatter_add.tests.c ---------------------------------------------------------------

ROWS = np.array([[1, 2], [2, 3]], f32)
TWICE_1 = np.array([1, 1], i32)
ROWS_3 = np.array([[1, 2], [2, 3], [3, 4]], f32)


def test_scatter_add_a_1d_tensor() -> None:
    """NNC's "scatter add a 1d tensor": [4, 3, 5] into bins [3, 2, 4] of 5."""
    got = ops.scatter_add(bincount=5)(np.array([4, 3, 5], f32), np.array([3, 2, 4], i32))
    np.testing.assert_array_equal(got, [0, 0, 3, 4, 5])


def test_scatter_add_a_tensor_view() -> None:
    """NNC's "scatter add a tensor view": columns 1:3 of [[0, 3, 4, 0], [0, 1, 5, 0]] both
    land in row 1 of the view at columns 1:3 of an iota [3, 4]; the view is overwritten,
    what lies outside it keeps the iota."""
    b = GraphBuilder()
    src = b.input((2, 4), name="src")
    idx = b.input((2,), i32, name="idx")
    out = b.tensor((3, 4), name="out")
    view = b.alias(out, (3, 2), offset=(0, 1))
    b.exec(ops.scatter_add(bincount=3), b.alias(src, (2, 2), offset=(0, 1)), idx, outputs=[view])
    graph = b.build([out])
    rows = np.array([[0, 3, 4, 0], [0, 1, 5, 0]], f32)
    got = np.asarray(interpret(graph, rows, TWICE_1))
    assert_close(compile(graph)(rows, TWICE_1), got, rtol=0, atol=0)
    inside = np.zeros((3, 4), bool)
    inside[:, 1:3] = True
    nnc = np.where(inside, got, np.arange(12, dtype=f32).reshape(3, 4))
    np.testing.assert_array_equal(nnc, [[0, 0, 0, 3], [4, 4, 9, 7], [8, 0, 0, 11]])


def test_backward_scatter_add_a_tensor() -> None:
    """NNC's "backward scatter add a tensor": each source row gets the gradient of the bin
    it went to (row 1 of [[1, 2], [2, 3], [3, 4]], twice)."""
    cmd = ops.scatter_add(bincount=3)
    gx, gidx = _bwd(cmd, (ROWS_3,), (np.zeros((2, 2), f32), TWICE_1))
    np.testing.assert_array_equal(gx, [[2, 3], [2, 3]])
    assert gidx is None


def test_backward_scatter_add_a_1d_tensor() -> None:
    """NNC's "backward scatter add a 1d tensor": [1, 2, 3, 4, 5] read at [3, 2, 4]."""
    cmd = ops.scatter_add(bincount=5)
    g = np.array([1, 2, 3, 4, 5], f32)
    gx, _ = _bwd(cmd, (g,), (np.zeros(3, f32), np.array([3, 2, 4], i32)))
    np.testing.assert_array_equal(gx, [4, 3, 5])


def test_backward_scatter_add_a_tensor_view() -> None:
    """NNC's "backward scatter add a tensor view": the gradient is columns 1:3 of a [3, 4];
    the source gradient lands in columns 1:3 of a zeroed [2, 4]."""
    b = GraphBuilder()
    src = b.input((2, 4), name="src")
    idx = b.input((2,), i32, name="idx")
    g = b.input((3, 4), name="g")
    y = b.exec(ops.scatter_add(bincount=3), b.alias(src, (2, 2), offset=(0, 1)), idx)
    dy = b.alias(g, (3, 2), offset=(0, 1))
    graph, _ = backward(b.build([y]), y, [src], df=dy)
    gv = np.array([[1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]], f32)
    _, got = interpret(graph, np.zeros((2, 4), f32), TWICE_1, gv)
    np.testing.assert_array_equal(got, [[0, 3, 4, 0], [0, 3, 4, 0]])


def test_scatter_add_a_tensor_with_model() -> None:
    """NNC's "scatter add a tensor with model"."""
    got = _evaluate(ops.scatter_add(bincount=3), [ROWS, TWICE_1])
    np.testing.assert_array_equal(got, [[0, 0], [3, 5], [0, 0]])


# -- sort.tests.c, partition.tests.c, unique_consecutive.tests.c: "with model" --------------

A_LAST = np.array([[1, 3], [2, 1], [3, 4]], i32)


def test_sort_a_tensor_by_last_axis_in_int_descending_with_model() -> None:
    """NNC's "sort a tensor by last axis in int, descending with model"."""
    values, indices = _evaluate(ops.sort(axis=1, descending=True), [A_LAST], outputs=2)
    np.testing.assert_array_equal(values, [[3, 1], [2, 1], [4, 3]])
    np.testing.assert_array_equal(indices, [[1, 0], [0, 1], [1, 0]])
    assert values.dtype == indices.dtype == np.int32


def test_partition_a_tensor_by_last_axis_in_int_descending_with_model() -> None:
    """NNC's "partition a tensor by last axis in int, descending with model": the top 1."""
    cmd = ops.partition(kth=1, axis=1, descending=True)
    values, indices = _evaluate(cmd, [A_LAST], outputs=2)
    np.testing.assert_array_equal(values, [[3], [2], [4]])
    np.testing.assert_array_equal(indices, [[1], [0], [1]])


def test_unique_consecutive_a_1d_tensor_with_model() -> None:
    """NNC's "unique consecutive a 1d tensor with model": runs of 2, 0, 2, 1, 2, 3 and an
    unused slot (-1, count 0)."""
    a = np.array([2, 2, 2, 0, 0, 2, 2, 1, 1, 2, 3], f32)
    values, counts = _evaluate(ops.unique_consecutive(bincount=7), [a], outputs=2)
    np.testing.assert_array_equal(values, [2, 0, 2, 1, 2, 3, -1])
    np.testing.assert_array_equal(counts, [3, 2, 2, 2, 1, 1, 0])


# -- reduce.tests.c -------------------------------------------------------------------------

A = np.array([[1, 2, 3], [4, 5, 6]], f32)
B = np.array([[1, 2, 7], [5, 6, 4]], f32)
ROOT = {1: np.sqrt([[1 + 4 + 9], [16 + 25 + 36]]), 0: np.sqrt([[1 + 16, 4 + 25, 9 + 36]])}
REDUCE = [
    # (command, axis, NNC's result)
    ("reduce_sum", 1, [[6], [15]]),
    ("reduce_sum", 0, [[5, 7, 9]]),
    ("reduce_mean", 1, [[2], [5]]),
    ("reduce_mean", 0, [[2.5, 3.5, 4.5]]),
    ("reduce_max", 1, [[3], [6]]),
    ("reduce_max", 0, [[4, 5, 6]]),
    ("reduce_min", 1, [[1], [4]]),
    ("reduce_min", 0, [[1, 2, 3]]),
    ("reduce_norm2", 1, ROOT[1]),
    ("reduce_norm2", 0, ROOT[0]),
]


@pytest.mark.parametrize("name, axis, want", REDUCE, ids=[f"{n}-{a}" for n, a, _ in REDUCE])
def test_reduce_on_an_axis(name, axis, want) -> None:
    """NNC's "reduce sum / mean / max / min / norm2 for [[1, 2, 3], [4, 5, 6]] on axis 1" and
    "... on axis 0".

    NNC TEST_CASEs covered here:
    "reduce sum for [[1, 2, 3], [4, 5, 6]] on axis 1",
    "reduce sum for [[1, 2, 3], [4, 5, 6]] on axis 0",
    "reduce mean for [[1, 2, 3], [4, 5, 6]] on axis 1",
    "reduce mean for [[1, 2, 3], [4, 5, 6]] on axis 0",
    "reduce max for [[1, 2, 3], [4, 5, 6]] on axis 1",
    "reduce max for [[1, 2, 3], [4, 5, 6]] on axis 0",
    "reduce min for [[1, 2, 3], [4, 5, 6]] on axis 1",
    "reduce min for [[1, 2, 3], [4, 5, 6]] on axis 0".
    """
    got = getattr(ops, name)(axes=(axis,))(A)
    assert_close(got, np.asarray(want, f32), rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "name, axis, want",
    [("argmax", 0, [[1, 1, 0]]), ("argmin", 0, [[0, 0, 1]]), ("argmax", 1, [[2], [1]])],
)
def test_argmax_argmin(name, axis, want) -> None:
    """NNC's "argmax for [[1, 2, 7], [5, 6, 4]] on axis 0", "argmin ... on axis 0" and
    "argmax ... on axis 1".

    NNC TEST_CASE covered here:
    "argmin for [[1, 2, 7], [5, 6, 4]] on axis 0".
    """
    got = getattr(ops, name)(axis=axis)(B)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("axis, g", [(1, np.full((2, 1), 0.5, f32)), (0, np.ones((1, 3), f32))])
def test_reduce_norm2_backward(axis, g) -> None:
    """NNC's "reduce norm2 for [[1, 2, 3], [4, 5, 6]] on axis 1 backward" (g = 0.5) and "... on
    axis 0 backward" (g = 1): g * a / norm."""
    cmd = ops.reduce_norm2(axes=(axis,))
    (h,) = _bwd(cmd, (g,), (A,), (cmd(A),))
    assert_close(h, g * A / ROOT[axis], rtol=1e-6, atol=0)


WITH_MODEL = [
    # (command, NNC's result); NNC's second row is [4, 5, 2] for argmax / argmin
    (ops.reduce_sum(axes=(1,)), A, [[6], [15]]),
    (ops.reduce_max(axes=(0,)), A, [[4, 5, 6]]),
    (ops.reduce_min(axes=(0,)), A, [[1, 2, 3]]),
    (ops.reduce_mean(axes=(1,)), A, [[2], [5]]),
    (ops.reduce_norm2(axes=(0,)), A, ROOT[0]),
    (ops.argmax(axis=0), np.array([[1, 2, 3], [4, 5, 2]], f32), [[1, 1, 0]]),
    (ops.argmin(axis=0), np.array([[1, 2, 3], [4, 5, 2]], f32), [[0, 0, 1]]),
]


@pytest.mark.parametrize("cmd, a, want", WITH_MODEL, ids=[str(c[0]) for c in WITH_MODEL])
def test_reduce_with_model(cmd, a, want) -> None:
    """NNC's "reduce sum ... on axis 1 with model", "reduce max / min ... on axis 0 with
    model", "reduce mean ... on axis 1 with model", "reduce norm2 ... on axis 0 with
    model" and "argmax / argmin for [[1, 2, 3], [4, 5, 2]] on axis 0 with model".

    NNC TEST_CASEs covered here:
    "reduce sum for [[1, 2, 3], [4, 5, 6]] on axis 1 with model",
    "reduce max for [[1, 2, 3], [4, 5, 6]] on axis 0 with model",
    "reduce min for [[1, 2, 3], [4, 5, 6]] on axis 0 with model",
    "argmax for [[1, 2, 3], [4, 5, 2]] on axis 0 with model",
    "reduce mean for [[1, 2, 3], [4, 5, 6]] on axis 1 with model".
    """
    got = _evaluate(cmd, [a])
    assert_close(got, np.asarray(want, got.dtype), rtol=1e-6, atol=0)


def test_use_reduce_for_softmax() -> None:
    """NNC's "use reduce for softmax": exp(x - max) / sum over 100 values from reduce_max,
    add, ewexp, reduce_sum, ewdiv and mul equals the softmax command, and the backward
    pass through them (seed 1 at entry 88) equals the softmax backward."""
    b = GraphBuilder()
    x = b.input((100,), name="x")
    top = b.exec(ops.reduce_max(axes=(0,)), x, name="max")
    z = b.exec(ops.ewexp(), b.exec(ops.add(p=1.0, q=-1.0), x, top), name="exp")
    total = b.exec(ops.reduce_sum(axes=(0,)), z, name="sum")
    inv = b.exec(ops.ewdiv(), b.constant(np.float32(1.0)), total, name="1 / sum")
    a = b.exec(ops.mul(), z, inv, name="softmax")
    da = b.input((100,), name="da")
    graph, _ = backward(b.build([a]), a, [x], df=da)
    xv = (1 - np.random.default_rng(1).random(100)).astype(f32)
    seed = np.zeros(100, f32)
    seed[88] = 1
    got_a, got_dx = compile(graph)(xv, seed)
    want_a = ops.softmax()(xv)
    assert_close(got_a, want_a, rtol=1e-6, atol=1e-7)
    (want_dx,) = _bwd(ops.softmax(), (seed,), (xv,), (want_a,))
    assert_close(got_dx, want_dx, rtol=1e-5, atol=1e-7)


# -- compare.tests.c -------------------------------------------------------------------------

I12 = np.arange(12, dtype=f32).reshape(2, 2, 3)
I48 = np.arange(48, dtype=f32).reshape(4, 4, 3)


@pytest.mark.parametrize("name, shift", [("min", -1), ("max", 1)])
def test_min_max_of_two_tensors(name, shift) -> None:
    """NNC's "min of two tensors" (b = i - 1) and "max of two tensors" (b = i + 1): b."""
    np.testing.assert_array_equal(getattr(ops, name)()(I12, I12 + shift), I12 + shift)


@pytest.mark.parametrize("name, shift", [("min", -1), ("max", 1)])
def test_min_max_of_two_tensor_views(name, shift) -> None:
    """NNC's "min of two tensor views" and "max of two tensor views": the [2, 2, 3] corners of
    two [4, 4, 3] iotas (strides 12, 3, 1); c is b's view."""
    b = GraphBuilder()
    xa, xb = b.input((4, 4, 3), name="a"), b.input((4, 4, 3), name="b")
    c = b.exec(getattr(ops, name)(), b.alias(xa, (2, 2, 3)), b.alias(xb, (2, 2, 3)))
    got = interpret(b.build([c]), I48, I48 + shift)
    np.testing.assert_array_equal(got, (I48 + shift)[:2, :2])


def _tied(name: str, a: np.ndarray) -> np.ndarray:
    """The C tests' b: equal to a for flat index < 3, one past it on the losing side after."""
    flat = np.arange(a.size).reshape(a.shape)
    return np.where(flat < 3, a, a - 1 if name == "min" else a + 1).astype(f32)


@pytest.mark.parametrize("name", ["min", "max"])
def test_min_max_of_two_tensors_backward_with_null(name) -> None:
    """NNC's "min / max of two tensors backward with null" (the g = -1 cases are in
    test_nnc_fidelity.py): a null gradient is ones; ties feed both inputs.

    NNC TEST_CASE covered here:
    "min of two tensors backward with null".
    """
    cmd = getattr(ops, name)()
    b = _tied(name, I12)
    ha, hb = _bwd(cmd, (None,), (I12, b), (cmd(I12, b),))
    flat = np.arange(12).reshape(I12.shape)
    np.testing.assert_array_equal(ha, np.where(flat < 3, 1, 0))
    np.testing.assert_array_equal(hb, np.ones(I12.shape))


@pytest.mark.parametrize("g", [-1.0, 1.0], ids=["g=-1", "null"])
@pytest.mark.parametrize("name", ["min", "max"])
def test_min_max_of_two_tensor_views_backward(name, g) -> None:
    """NNC's "min / max of two tensor views backward" and "... with null": the views of the
    forward test, b tied to a at the three first entries of the root; the gradients of
    the views come back as [2, 2, 3] tensors through the backward pass.

    NNC TEST_CASEs covered here:
    "min of two tensor views backward",
    "min of two tensor views backward with null",
    "max of two tensor views backward with null".
    """
    bld = GraphBuilder()
    xa, xb = bld.input((4, 4, 3), name="a"), bld.input((4, 4, 3), name="b")
    va, vb = bld.alias(xa, (2, 2, 3)), bld.alias(xb, (2, 2, 3))
    c = bld.exec(getattr(ops, name)(), va, vb)
    dc = bld.input((2, 2, 3), name="dc")
    graph, _ = backward(bld.build([c]), c, [xa, xb], df=dc)
    _, ha, hb = interpret(graph, I48, _tied(name, I48), np.full((2, 2, 3), g, f32))
    flat = np.arange(12).reshape(2, 2, 3)
    np.testing.assert_array_equal(np.asarray(ha)[:2, :2], np.where(flat < 3, g, 0))
    np.testing.assert_array_equal(np.asarray(hb)[:2, :2], np.full((2, 2, 3), g))
    np.testing.assert_array_equal(np.asarray(hb)[2:], 0)  # outside the view: no gradient


@pytest.mark.parametrize("name, shift", [("min", -1), ("max", 1)])
def test_min_max_of_two_tensors_with_model(name, shift) -> None:
    """NNC's "min of two tensors with model" and "max of two tensors with model"."""
    got = _evaluate(getattr(ops, name)(), [I12, I12 + shift])
    np.testing.assert_array_equal(got, I12 + shift)


# -- histogram.tests.c: on tensor views --------------------------------------------------------

FLT_MAX = float(np.finfo(f32).max)
SPECIALS = [np.nan, -FLT_MAX, FLT_MAX, 0, 1e-20, -1e-20, 1e20 - 1e18, -1e20 + 1e18]


def _log_bounds() -> np.ndarray:
    """NNC's h: +-1e-12 * 1.1^i up to 1e20, 774 each side."""
    v, right = 1e-12, []
    while v < 1e20:
        right.append(v)
        v *= 1.1
    return np.concatenate([-np.array(right[::-1]), right]).astype(f32)


HISTOGRAMS = {
    # NNC's command, the boundaries of its bins twin, the slots the specials would fill
    "logarithmic": (
        ops.histogram(type="logarithmic", min=1e-12, max=1e20, rate=1.1),
        _log_bounds(),
        (0, 1, 774, 774 * 2 - 1, 774 * 2, 775 * 2 - 1),
    ),
    "even": (
        ops.histogram(bins=200, min=-1000.0, max=1000.0),
        (np.arange(201, dtype=f32) - 100) * 10,
        (0, 201, 202),
    ),
}


@pytest.mark.parametrize("kind", sorted(HISTOGRAMS))
def test_histogram_vs_bins_histogram_on_a_tensor_view(kind) -> None:
    """NNC's "logarithmic histogram v.s. bins histogram on tensor view" and "even histogram
    v.s. bins histogram on tensor view", smaller: values uniform in (-1000, 1000] in a
    [3, 20, 2, 40], the specials at its first 8 entries (outside the view), the view
    [3, 10, 2, 20] at (0, 5, 0, 10). Both histograms agree within NNC's tolerances, no
    special is counted, and both give the view's min, max, sum and sum of squares."""
    cmd, bounds, special_slots = HISTOGRAMS[kind]
    a = ((1 - np.random.default_rng(1).random((3, 20, 2, 40))) * 2000 - 1000).astype(f32)
    a.reshape(-1)[:8] = SPECIALS
    b = GraphBuilder()
    x = b.input(a.shape, name="a")
    h = b.input(bounds.shape, name="h")
    view = b.alias(x, (3, 10, 2, 20), offset=(0, 5, 0, 10))
    counts, stats = b.exec(cmd, view)
    bins, bin_stats = b.exec(ops.histogram(type="bins"), view, h)
    got = [np.asarray(t) for t in compile(b.build([counts, stats, bins, bin_stats]))(a, bounds)]
    bl, sl, bb, sb = got
    if kind == "even":
        assert np.all(np.abs(bl - bb) < 5)
    else:
        total = bl + bb
        tol = np.where(total > 10, np.abs(bl - bb) / np.maximum(total, 1), np.abs(bl - bb))
        assert np.all(tol < 0.1)
    for slot in special_slots:
        assert bl[slot] == 0 and bb[slot] == 0, slot
    inside = a[:, 5:15, :, 10:30].astype(np.float64)
    assert bl.sum() == bb.sum() == inside.size
    want = [inside.min(), inside.max(), inside.sum(), (inside * inside).sum()]
    assert_close(sl, np.asarray(want, f32), rtol=1e-5, atol=1e-2)
    np.testing.assert_array_equal(sl, sb)
