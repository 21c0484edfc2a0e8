"""Audit 8 of mixed precision: nodes without a floating-point result and sorts read
their inputs unrounded under cast_precision (oracle: NumPy on the unconverted values)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, cast_precision, interpret

LOWS = ("bfloat16", "float16")
NUMPY_COMPARE = {
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
}


def _graph(shapes, fn):
    b = GraphBuilder()
    ins = [b.input(shape, dtype) for shape, dtype in shapes]
    out = fn(b, *ins)
    return b.build(list(out) if isinstance(out, tuple) else [out])


@pytest.mark.parametrize("low", LOWS)
@pytest.mark.parametrize("op", sorted(NUMPY_COMPARE))
def test_a_comparison_of_float32_inputs_is_not_rounded(low, op):
    """``x < 0.1`` with x = 0.09999: both round to 0.1 in bfloat16 and float16, so the
    cast graph had said False (and ``eq`` True); NumPy on the float32 values is the oracle."""
    x = np.array([0.09999, 0.1, 0.10001, -3.0], np.float32)
    t = np.float32(0.1)
    graph = _graph(
        [((4,), np.float32), ((), np.float32)],
        lambda b, x, t: b.exec(ops.compare(op=op), x, t),
    )
    cast = cast_precision(graph, low)
    node = next(n for n in cast.nodes if n.cmd.name == "compare")
    assert all(cast.spec(s).dtype == np.float32 for s in node.inputs)
    got = np.asarray(interpret(cast, x, t))
    np.testing.assert_array_equal(got, NUMPY_COMPARE[op](x, t))


def test_a_comparison_of_a_low_product_reads_it_converted_up_and_the_threshold_as_is():
    """A gemm computes in bfloat16 (by design); a comparison of its result with a float32
    threshold compares the bfloat16 product, converted up exactly, with the threshold
    unrounded: bfloat16(0.1) = 0.10009765625 > float32(0.1), where the threshold
    rounded to bfloat16 too had made them equal."""
    bf = ml_dtypes.bfloat16
    x = np.array([[0.1, 0.0]], np.float32)
    w = np.array([[1.0, 0.0]], np.float32)
    t = np.float32(0.1)
    graph = _graph(
        [((1, 2), np.float32), ((1, 2), np.float32), ((), np.float32)],
        lambda b, x, w, t: b.exec(
            ops.compare(op="gt"), b.exec(ops.gemm(transpose_b=True), x, w), t
        ),
    )
    cast = cast_precision(graph, "bfloat16")
    product = x.astype(bf).astype(np.float32) @ w.astype(bf).astype(np.float32).T
    product = product.astype(bf).astype(np.float32)
    got = np.asarray(interpret(cast, x, w, t))
    np.testing.assert_array_equal(got, product > t)
    assert bool(got[0, 0])


@pytest.mark.parametrize("low", LOWS)
@pytest.mark.parametrize("command", ["argmax", "argmin"])
def test_argmax_and_argmin_of_near_ties_pick_the_float32_extreme(low, command):
    x = np.array([[1.0, 1.0001, 1.0002], [1.0002, 1.0001, 1.0]], np.float32)
    cmd = getattr(ops, command)(axis=1)
    graph = _graph([((2, 3), np.float32)], lambda b, x: b.exec(cmd, x))
    got = np.asarray(interpret(cast_precision(graph, low), x))
    want = getattr(np, command)(x, axis=1)[:, None]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("low", LOWS)
def test_argsort_and_conversions_to_int_and_bool_read_their_input_unrounded(low):
    x = np.array([1.0002, 1.0, 1.0001, 2.999], np.float32)
    graph = _graph(
        [((4,), np.float32)],
        lambda b, x: (
            b.exec(ops.argsort(axis=0), x),
            b.exec(ops.datatype_conversion(dtype="int32"), x),
            b.exec(ops.datatype_conversion(dtype="bool"), b.exec(ops.reshape(shape=(2, 2)), x)),
        ),
    )
    idx, ints, bools = (np.asarray(a) for a in interpret(cast_precision(graph, low), x))
    np.testing.assert_array_equal(idx, np.argsort(x, kind="stable"))
    np.testing.assert_array_equal(ints, x.astype(np.int32))
    np.testing.assert_array_equal(bools, x.reshape(2, 2).astype(bool))


@pytest.mark.parametrize("low", LOWS)
@pytest.mark.parametrize("descending", [False, True])
def test_sort_and_partition_keep_float32_values_and_their_order(low, descending):
    """Sorts move data: their values are a permutation of the float32 input, unrounded,
    and the indices order those values (a bfloat16 sort made 1.0, 1.0001, 1.0002 ties
    and returned them in input order, all as 1.0)."""
    x = np.array([[1.0, 1.0002, 1.0001, 0.5]], np.float32)
    graph = _graph(
        [((1, 4), np.float32)],
        lambda b, x: (
            *b.exec(ops.sort(axis=1, descending=descending), x),
            *b.exec(ops.partition(kth=2, axis=1, descending=descending), x),
        ),
    )
    values, idx, top, top_idx = (np.asarray(a) for a in interpret(cast_precision(graph, low), x))
    order = np.argsort(-x if descending else x, axis=1, kind="stable")
    assert values.dtype == np.float32 and top.dtype == np.float32
    np.testing.assert_array_equal(idx, order)
    np.testing.assert_array_equal(values, np.take_along_axis(x, order, axis=1))
    np.testing.assert_array_equal(top_idx, order[:, :2])
    np.testing.assert_array_equal(top, np.take_along_axis(x, order[:, :2], axis=1))


@pytest.mark.parametrize("low", LOWS)
def test_unique_consecutive_does_not_merge_runs_that_round_alike(low):
    x = np.array([1.0, 1.0, 1.0001, 1.0001, 2.0], np.float32)
    graph = _graph([((5,), np.float32)], lambda b, x: b.exec(ops.unique_consecutive(bincount=4), x))
    values, counts = (np.asarray(a) for a in interpret(cast_precision(graph, low), x))
    np.testing.assert_array_equal(values, np.array([1.0, 1.0001, 2.0, -1.0], np.float32))
    np.testing.assert_array_equal(counts, [2, 2, 1, 0])


@pytest.mark.parametrize("low", LOWS)
def test_inputs_a_command_only_compares_are_not_rounded(low):
    """fill_if_less_than's ``selector < threshold`` and masked_fill's ``mask == eq`` read
    their float32 inputs unrounded (0.09999 < 0.1; 1.001 != 1), the filled values still
    compute low; oracle: NumPy's ``where`` on the float32 values."""
    from fnnc.core.command import lookup
    from fnnc.graph.passes.precision import COMPARED

    for name in COMPARED:
        lookup(name)  # a misspelt name would protect nothing
    a = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    sel = np.array([0.09999, 0.1, 0.10001, 0.2], np.float32)
    mask = np.array([1.0, 1.001, 0.999, 0.0], np.float32)
    t = np.float32(0.1)
    graph = _graph(
        [((4,), np.float32)] * 3 + [((), np.float32)],
        lambda b, a, sel, mask, t: (
            b.exec(ops.fill_if_less_than(value=-1.0), a, sel, t),
            b.exec(ops.masked_fill(eq=1.0, fill=-5.0), a, mask),
        ),
    )
    cast = cast_precision(graph, low)
    filled, masked = (np.asarray(v) for v in interpret(cast, a, sel, mask, t))
    np.testing.assert_array_equal(filled, np.where(sel < t, -1.0, a))
    np.testing.assert_array_equal(masked, np.where(mask == 1.0, -5.0, a))
    fill = next(n for n in cast.nodes if n.cmd.name == "fill_if_less_than")
    assert cast.spec(fill.inputs[0]).dtype.name == low  # the filled tensor computes low


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"initial": 1e39}, r"initial=1e\+39 \(at most float32's largest"),
        ({"initial": 1e38, "minimum": 1e39}, r"minimum=1e\+39 \(at most initial=1e\+38\)"),
        ({"initial": 4.0, "minimum": 8.0}, r"minimum=8.0 \(at most initial=4.0\)"),
        ({"factor": float("inf")}, r"factor=inf \(a finite number > 1"),
    ],
)
def test_a_loss_scale_float32_cannot_hold_is_refused(kwargs, message):
    """LossScale(initial=1e39) was accepted; its float32 state was inf, so every scaled
    loss was inf, every step skipped and the scale stayed inf (inf / 2), silently."""
    from fnnc.errors import GraphError
    from fnnc.graph.passes.loss_scale import LossScale

    with pytest.raises(GraphError, match=message):
        LossScale(**kwargs)
    top = float(np.finfo(np.float32).max)
    state = LossScale(initial=top, minimum=top).init()  # the largest accepted: finite
    assert float(state.scale) == top and np.isfinite(np.asarray(state.scale))


@pytest.mark.parametrize(
    "keep,message",
    [
        ({"rmsnorm"}, r"unknown command 'rmsnorm'\. Did you mean rms_norm"),
        ("softmax", r"keep_float32='softmax'; expected a collection of command names"),
    ],
)
def test_keep_float32_names_must_be_commands(keep, message):
    """NNC's ``"rmsnorm"`` (or a bare string, a set of its letters) kept nothing in
    float32 and said nothing; a registered name still keeps its command in float32."""
    from fnnc.errors import GraphError

    graph = _graph(
        [((2, 3), np.float32), ((4, 3), np.float32)],
        lambda b, x, w: b.exec(ops.softmax(), b.exec(ops.gemm(transpose_b=True), x, w)),
    )
    with pytest.raises(GraphError, match=message):
        cast_precision(graph, "bfloat16", keep_float32=keep)
    kept = cast_precision(graph, "bfloat16", keep_float32={"softmax"})
    softmax = next(n for n in kept.nodes if n.cmd.name == "softmax")
    assert kept.spec(softmax.outputs[0]).dtype == np.float32


@pytest.mark.parametrize("low", LOWS)
def test_histogram_bins_and_sums_its_float32_input_in_float32(low):
    """A statistic, as the policy keeps reductions: 0.4999 rounded to 0.5 had moved to
    the upper bin, and the sum of 1000 entries had 3 digits; oracle: NumPy in float64."""
    x = np.full(1000, 0.4999, np.float32)
    x[:3] = 1.001
    graph = _graph(
        [((1000,), np.float32)],
        lambda b, x: b.exec(ops.histogram(bins=2, min=0.0, max=1.0), x),
    )
    counts, stats = (np.asarray(v) for v in interpret(cast_precision(graph, low), x))
    np.testing.assert_array_equal(counts, [0, 997, 0, 3, 0])
    wide = x.astype(np.float64)
    want = [wide.min(), wide.max(), wide.sum(), (wide * wide).sum()]
    np.testing.assert_allclose(stats, want, rtol=1e-6)


@pytest.mark.parametrize("low", LOWS)
def test_identities_keep_each_input_in_its_type(low):
    """``sum(stop_gradient(x))`` of a float32 x had rounded x to the low type and back
    (10.0004 summed as 10.0); a barrier over a float32 input and a low product keeps
    each in its own type. Oracle: NumPy's float64 sum of the float32 values."""
    x = np.array([1.0001, 2.0001, 3.0001, 4.0001], np.float32)
    w = np.eye(4, dtype=np.float32)

    def build(b, x, w):
        held = b.exec(ops.stop_gradient(), x)
        product = b.exec(ops.gemm(), b.exec(ops.reshape(shape=(1, 4)), x), w)
        kept, low_product = b.exec(ops.optimization_barrier(), x, product)
        total = b.exec(ops.reduce_sum(axes=(0,)), held)
        return total, b.exec(ops.reduce_sum(axes=(0,)), kept), low_product

    cast = cast_precision(_graph([((4,), np.float32), ((4, 4), np.float32)], build), low)
    total, kept, _ = (np.asarray(v) for v in interpret(cast, x, w))
    want = x.astype(np.float64).sum()
    np.testing.assert_allclose(total, [want], rtol=1e-7)
    np.testing.assert_allclose(kept, [want], rtol=1e-7)
    barrier = next(n for n in cast.nodes if n.cmd.name == "optimization_barrier")
    assert [cast.spec(s).dtype.name for s in barrier.outputs] == ["float32", low]


def test_float32_nodes_compute_in_float32_whatever_their_command():
    """``float32_nodes`` keeps nodes by position (a model's loss): x * x of 300 is inf in
    float16, 90000 in float32 (NumPy); a bad position is a GraphError."""
    from fnnc.errors import GraphError

    b = GraphBuilder()
    x = b.input((3,), name="x")
    sq = b.exec(ops.ewprod(), x, x, name="square")
    g = b.build([b.exec(ops.reduce_sum(axes=(0,)), sq)])
    xs = np.float32([300, 1, 2])
    low = interpret(cast_precision(g, "float16"), xs)
    kept = interpret(cast_precision(g, "float16", float32_nodes=[0]), xs)
    assert np.isinf(np.asarray(low)).all()
    np.testing.assert_allclose(np.asarray(kept), [np.sum(xs.astype(np.float64) ** 2)], rtol=1e-6)
    for bad in ([5], [True], ["square"]):
        with pytest.raises(GraphError, match="float32_nodes"):
            cast_precision(g, "float16", float32_nodes=bad)
