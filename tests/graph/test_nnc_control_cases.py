"""NNC's while and case..of unit tests, ported (liuliu/ccv test/unit/nnc: while.tests.c,
while.backward.tests.c, case_of.tests.c, case_of.backward.tests.c).

Each test names the C ``TEST_CASE`` it ports and checks NNC's expected numbers, or an
independent oracle (a NumPy loop, ``jax.grad`` of the loop written out in Python).
NNC's convolution inputs are ``5x5x4``; fnnc's convolution takes ``[batch, h, w, c]``,
so here they carry a batch axis of 1. NNC's checks on C memory (multiview pointers,
shared arena buffers) have no fnnc meaning; those cases check their values only.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, case_of, compile, interpret, while_loop

F32 = np.float32
SHAPE = (1, 5, 5, 4)
CONV = ops.convolution(strides=1, padding=1)  # NNC: 4 filters 3x3x4, HINT((1, 1), (1, 1))


def count_below(n):
    """The condition ``count < n`` (NNC's ``while_5`` and ``while_4``)."""
    c = GraphBuilder()
    count = c.input((), np.int32, name="count")
    return c.build([c.exec(ops.compare(op="lt"), count, c.constant(np.int32(n)))])


def both(graph, *args):
    """The graph's outputs from ``interpret`` and from ``compile``; they must agree."""
    slow, fast = interpret(graph, *args), compile(graph)(*args)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), slow, fast)
    return fast


# --- NumPy oracles of the convolution loops ----------------------------------------


def np_conv(x, w, b):
    """3x3 convolution, stride 1, zero padding 1; x [1, h, w, c], w [out, 3, 3, c]."""
    windows = sliding_window_view(np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0))), (3, 3), (1, 2))
    return np.einsum("nhwcij,oijc->nhwo", windows, w) + b


def np_avg3(x):
    """3x3 average pool, stride 1, padding 1, counting only cells inside the input."""
    pad = ((0, 0), (1, 1), (1, 1), (0, 0))
    sums = sliding_window_view(np.pad(x, pad), (3, 3), (1, 2)).sum(axis=(-2, -1))
    counts = sliding_window_view(np.pad(np.ones_like(x), pad), (3, 3), (1, 2)).sum(axis=(-2, -1))
    return sums / counts


def conv_data(bias=0.1, seed=0):
    """x in (0, 1], w in (0, 1] / 36 (NNC's scaling), bias constant."""
    rng = np.random.default_rng(seed)
    x = (1 - rng.uniform(size=SHAPE)).astype(F32)
    w = ((1 - rng.uniform(size=(4, 3, 3, 4))) / 36).astype(F32)
    return x, w, np.full(4, bias, F32)


def np_repeat(f, x, n=5):
    """``f`` applied ``n`` times to ``x``, in float64."""
    x = x.astype(np.float64)
    for _ in range(n):
        x = f(x)
    return x


def conv_loop(builder, x, w, b, n=5):
    """x <- conv(x, w, b), n times (body: NNC's "conv" node); returns the final x."""
    bb = GraphBuilder()
    bx = bb.input(SHAPE, name="x")
    by = bb.exec(CONV, bx, bb.input((4, 3, 3, 4), name="w"), bb.input((4,), name="b"))
    body = bb.build([by])
    (y,) = while_loop(builder, body, count_below(n), [x, w, b], carry_overs={by: bx})
    return y


def conv_inputs(builder):
    return builder.input(SHAPE, name="x"), builder.input((4, 3, 3, 4)), builder.input((4,))


# --- while.tests.c -----------------------------------------------------------------


@pytest.mark.parametrize(
    "start, y, scale, tol",
    [(1.0, 1.11, 0.34, 1e-6), (0.32, 2.8, 1.0, 1e-5), (0.47, 5.5, 1.0, 1e-2)],
)
def test_concrete_loops_multiply_five_times(start, y, scale, tol):
    """NNC's "graph for a while loop to compute 0.34 * 1.11 ^ 5", "graph for a while loop
    by reuse tensor allocations for 0.32 * 2.8 ^ 5" and "while graph add and re-add reuse
    tensor allocations for 0.47 * 5.5 ^ 5": z <- z * y five times (then times 0.34). The
    multiview pointer checks have no fnnc meaning (XLA owns the buffers)."""
    bb = GraphBuilder()
    z0, yb = bb.input((1,), name="z0"), bb.input((1,), name="y")
    z1 = bb.exec(ops.ewprod(), yb, z0, name="prod0")
    body = bb.build([z1])
    b = GraphBuilder()
    z, yy, s = b.input((1,), name="z"), b.input((1,), name="y"), b.input((1,), name="x")
    (zf,) = while_loop(b, body, count_below(5), [z, yy], carry_overs={z1: z0})
    graph = b.build([b.exec(ops.ewprod(), s, zf, name="prod1")])
    got = both(graph, F32([start]), F32([y]), F32([scale]))
    np.testing.assert_allclose(got, [scale * start * y**5], rtol=0, atol=tol)


def test_each_while_node_holds_its_own_body():
    """NNC's "symbolic graph get while graph from symbol": the body graph is read back
    from the node that holds it."""
    bodies = []
    for a in (2.0, 3.0):
        bb = GraphBuilder()
        z0 = bb.input((), name="z0")
        z1 = bb.exec(ops.scalar_mul(a=a), z0, name="z1")
        bodies.append((bb.build([z1]), z0, z1))
    b = GraphBuilder()
    x = b.input((), name="x")
    outs = []
    for (body, z0, z1), name in zip(bodies, ("while 0", "while 1")):
        outs += while_loop(b, body, count_below(2), [x], carry_overs={z1: z0}, name=name)
    graph = b.build(outs)
    loops = [n for n in graph.nodes if n.cmd.name == "while_loop"]
    assert [n.name for n in loops] == ["while 0", "while 1"]
    assert [n.cmd.param("body") for n in loops] == [body for body, *_ in bodies]
    assert [float(v) for v in both(graph, F32(1.5))] == [6.0, 13.5]


def test_condition_reads_a_carried_tensor_and_the_outer_graph_its_start():
    """NNC's "symbolic graph for a while loop to compute z * x ^ 5 * y + z": the
    condition also reads z0; the outer sum reads z0's value before the loop."""
    bb = GraphBuilder()
    z0, xb = bb.input((1,), name="z0"), bb.input((1,), name="x")
    z1 = bb.exec(ops.ewprod(), z0, xb, name="prod0")
    body = bb.build([z1])
    c = GraphBuilder()
    count = c.input((), np.int32, name="count")
    c.input((1,), name="z0")
    cond = c.build([c.exec(ops.compare(op="lt"), count, c.constant(np.int32(5)))])
    b = GraphBuilder()
    x, y, z = b.input((1,), name="x"), b.input((1,), name="y"), b.input((1,), name="z0")
    (zf,) = while_loop(b, body, cond, [z, x], carry_overs={z1: z0}, cond_inputs=[z0])
    z2 = b.exec(ops.ewprod(), zf, y, name="prod1")
    graph = b.build([b.exec(ops.ewsum(), z2, z, name="sum")])
    got = both(graph, F32([0.92]), F32([3.2]), F32([1.2]))
    np.testing.assert_allclose(got, [1.2 * 0.92**5 * 3.2 + 1.2], rtol=0, atol=1e-6)


def test_average_pool_of_convolution_five_times():
    """NNC's "symbolic graph for a while loop to compute x = max(conv(x, w, b), 3x3) 5
    times" (an average pool in fact); the condition also reads w."""
    bb = GraphBuilder()
    x, w, bias = bb.input(SHAPE, name="x"), bb.input((4, 3, 3, 4), name="w"), bb.input((4,))
    z = bb.exec(ops.avg_pool(window=3, strides=1, padding=1), bb.exec(CONV, x, w, bias), name="avg")
    body = bb.build([z])
    c = GraphBuilder()
    count = c.input((), np.int32, name="count")
    c.input((4, 3, 3, 4), name="w")
    cond = c.build([c.exec(ops.compare(op="lt"), count, c.constant(np.int32(5)))])
    b = GraphBuilder()
    ins = conv_inputs(b)
    (out,) = while_loop(b, body, cond, list(ins), carry_overs={z: x}, cond_inputs=[w])
    xv, wv, bv = conv_data(bias=3.2)
    want = np_repeat(lambda v: np_avg3(np_conv(v, wv, bv)), xv)
    np.testing.assert_allclose(both(b.build([out]), xv, wv, bv), want, rtol=1e-5)


def test_views_of_the_loop_result_at_an_offset():
    """NNC's "symbolic graph for a while loop to compute x = conv(x, w, b) 5 times": y
    and two views of it, channels 1..3 and the flat elements 4..9."""
    b = GraphBuilder()
    x, w, bias = conv_inputs(b)
    y = conv_loop(b, x, w, bias)
    z0 = b.alias(y, (1, 5, 5, 3), offset=(0, 0, 0, 1), name="z0")
    z1 = b.alias(y, (6,), offset=(4,), name="z1")
    xv, wv, bv = conv_data()
    want = np_repeat(lambda v: np_conv(v, wv, bv), xv)
    got_y, got_z0, got_z1 = both(b.build([y, z0, z1]), xv, wv, bv)
    np.testing.assert_allclose(got_y, want, rtol=1e-5)
    np.testing.assert_array_equal(got_z0, np.asarray(got_y)[..., 1:])
    np.testing.assert_array_equal(got_z1, np.asarray(got_y).reshape(-1)[4:10])


def test_flat_views_of_the_input_and_the_result_summed():
    """NNC's "symbolic graph for a while loop to compute x = conv(x, w, b) 5 times then
    z = x0 + x"."""
    b = GraphBuilder()
    x, w, bias = conv_inputs(b)
    y = conv_loop(b, x, w, bias)
    z = b.exec(ops.ewsum(), b.alias(x, (100,), name="x0"), b.alias(y, (100,), name="y0"))
    xv, wv, bv = conv_data()
    want = np_repeat(lambda v: np_conv(v, wv, bv), xv)
    got = both(b.build([z]), xv, wv, bv)
    np.testing.assert_allclose(got, (xv + want).reshape(-1), rtol=1e-5)


def test_a_loop_inside_a_loop_writing_through_views():
    """NNC's "symbolic graph for a while loop to compute (x = conv(x, w, b) 5 times,
    z = x0 + x (x <- z)) 5 times": the outer body runs the inner loop, then writes the
    sum into z through a flat view of it."""
    ob = GraphBuilder()
    x, w, bias = conv_inputs(ob)
    y = conv_loop(ob, x, w, bias)
    z = ob.tensor(SHAPE, name="z")
    flat = (ob.alias(x, (100,), name="x0"), ob.alias(y, (100,), name="y0"))
    ob.exec(ops.ewsum(), *flat, outputs=[ob.alias(z, (100,), name="z0")], name="sum")
    outer = ob.build([z])
    b = GraphBuilder()
    ins = conv_inputs(b)
    (out,) = while_loop(b, outer, count_below(5), list(ins), carry_overs={z: x})
    xv, wv, bv = conv_data()
    want = np_repeat(lambda v: v + np_repeat(lambda u: np_conv(u, wv, bv), v), xv)
    np.testing.assert_allclose(both(b.build([out]), xv, wv, bv), want, rtol=1e-5)


def shift_body(scaled=False):
    """y = conv(x1, w, b) (times a flat input y0 when ``scaled``); x_new = x0 + y,
    written through flat views. Returns the body, its inputs and (x_new, y)."""
    bb = GraphBuilder()
    x0, x1 = bb.input(SHAPE, name="x0"), bb.input(SHAPE, name="x1")
    w, bias = bb.input((4, 3, 3, 4), name="w"), bb.input((4,), name="b")
    y = bb.exec(CONV, x1, w, bias, name="conv")
    inputs = [x0, x1, w, bias]
    yz = bb.alias(y, (100,), name="y")
    if scaled:
        s = bb.input((100,), name="y0")
        inputs.append(s)
        yz = bb.exec(ops.ewprod(), yz, s, name="prod")
    x_new = bb.tensor(SHAPE, name="x_new")
    flat = bb.alias(x_new, (100,))
    bb.exec(ops.ewsum(), bb.alias(x0, (100,), name="x0"), yz, outputs=[flat], name="sum")
    return bb, inputs, (x_new, y)


def test_two_carries_shift_through_each_other():
    """NNC's "symbolic graph for a while loop to compute y = conv(x1, w, b), x2 = x0 + y
    5 times, (x0 <- x1, x1 <- x2)": the body returns its own input x1 to carry it."""
    bb, (x0, x1, *_), (x2, _) = shift_body()
    body = bb.build([x2, x1])
    b = GraphBuilder()
    ins = [b.input(SHAPE, name="x0"), *conv_inputs(b)]
    outs = while_loop(b, body, count_below(5), ins, carry_overs=[(x2, x1), (x1, x0)])
    xv, wv, bv = conv_data()
    a, c = np.zeros(SHAPE), xv.astype(np.float64)
    for _ in range(5):
        a, c = c, np_conv(c, wv, bv) + a
    got = both(b.build([outs[0]]), np.zeros(SHAPE, F32), xv, wv, bv)
    np.testing.assert_allclose(got, c, rtol=1e-5)


def test_three_carries_and_the_last_intermediate_read_outside():
    """NNC's "a while loop to compute y = conv(x1, w, b), y1 = 1.2 * y, x3 = x0 + y1 5
    times, then z = y + x3 + x2 + x1 + x0, (x0 <- x1, x1 <- x2, x2 <- x3)". The outer
    sum reads the last y: it is carried into an extra body input (y_last) to leave."""
    bb, (x0, x1, *_), (x3, y) = shift_body(scaled=True)
    x2, y_last = bb.input(SHAPE, name="x2"), bb.input(SHAPE, name="y_last")
    body = bb.build([x3, x2, x1, y])
    b = GraphBuilder()
    ins = [b.input(SHAPE, name="x0"), *conv_inputs(b), b.input((100,), name="y0")]
    ins += [b.input(SHAPE, name="x2"), b.input(SHAPE, name="y_last")]
    carry = [(x3, x2), (x2, x1), (x1, x0), (y, y_last)]
    x2f, x1f, x0f, yf = while_loop(b, body, count_below(5), ins, carry_overs=carry)
    flat = [b.alias(t, (100,)) for t in (yf, x2f, x2f, x1f, x0f)]  # x3 ends equal to x2
    graph = b.build([b.exec(ops.ewsum(), *flat, name="sum1")])
    xv, wv, bv = conv_data()
    zeros = np.zeros(SHAPE, F32)
    got = both(graph, zeros, xv, wv, bv, np.full(100, 1.2, F32), zeros, zeros)
    xs = [np.zeros(SHAPE), xv.astype(np.float64), np.zeros(SHAPE)]  # x0, x1, x2
    for _ in range(5):
        yt = np_conv(xs[1], wv, bv)
        x3 = 1.2 * yt + xs[0]
        xs = [xs[1], xs[2], x3]
    want = yt + x3 + xs[2] + xs[1] + xs[0]
    np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-5)


# --- while.backward.tests.c ----------------------------------------------------------


@pytest.mark.parametrize("reverse", [{"tape": 8}, {"max_iterations": 5}])
def test_gradient_of_the_loop_by_its_start_value(reverse):
    """NNC's "graph with a while loop to compute back propagation 0.34 * 1.11 ^ 5": the
    gradient of z = y^5 * x0 with respect to x0 is y^5 (NNC keeps the trips on a tape)."""
    bb = GraphBuilder()
    y, x = bb.input((1,), name="y"), bb.input((1,), name="x")
    z = bb.exec(ops.ewprod(), y, x, name="prod0")
    body = bb.build([z])
    b = GraphBuilder()
    yy, x0 = b.input((1,), name="y"), b.input((1,), name="x0")
    (zf,) = while_loop(b, body, count_below(5), [yy, x0], carry_overs={z: x}, **reverse)
    graph, _ = backward(b.build([zf]), zf, [x0])
    value, g = both(graph, F32([1.11]), F32([0.34]))
    np.testing.assert_allclose(value, [0.34 * 1.11**5], rtol=1e-6)
    np.testing.assert_allclose(g, [1.11**5], rtol=0, atol=1e-6)


@pytest.mark.parametrize("reverse", [{"tape": 8}, {"max_iterations": 7}])
def test_gradient_through_log_of_product_five_times(reverse):
    """NNC's "symbolic graph with a while loop z = log(x * y) (x <- z) 5 times, then
    u = v * z, compute y'": u against the C loop, du/dy and du/dx against jax.grad."""
    bb = GraphBuilder()
    x, y = bb.input((1,), name="x"), bb.input((1,), name="y")
    z = bb.exec(ops.ewlog(), bb.exec(ops.ewprod(), x, y, name="prod0"), name="log0")
    body = bb.build([z])
    b = GraphBuilder()
    xo, yo, v = b.input((1,), name="x"), b.input((1,), name="y"), b.input((1,), name="v")
    (zf,) = while_loop(b, body, count_below(5), [xo, yo], carry_overs={z: x}, **reverse)
    u = b.exec(ops.ewprod(), zf, v, name="prod1")
    graph, _ = backward(b.build([u]), u, [yo, xo])

    def python(x, y, v):
        for _ in range(5):
            x = jnp.log(x * y)
        return (v * x)[0]

    args = (F32([1.0]), F32([3.2]), F32([0.22]))
    value, dy, dx = both(graph, *args)
    z0 = 1.0
    for _ in range(5):
        z0 = float(np.log(np.float32(z0 * 3.2)))
    np.testing.assert_allclose(value, [0.22 * z0], rtol=0, atol=1e-6)
    want_dx, want_dy = jax.grad(python, argnums=(0, 1))(*args)
    np.testing.assert_allclose(dy, want_dy, rtol=1e-5)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-5)


# --- case_of.tests.c and case_of.backward.tests.c ------------------------------------


def selector_of(shape, cuts, scalar=None):
    """A selector over the first element of its input ``x``: ``cuts`` is a list of
    ``(op, bound, branch)`` tried in order, the last entry's branch otherwise. Further
    inputs of ``shape`` spec ``scalar`` (names) are declared and unused."""
    s = GraphBuilder()
    x = s.input(shape, name="x")
    for extra in scalar or ():
        s.input(*extra)
    first = s.exec(ops.reshape(shape=()), s.alias(x, (1,), name="x[0]"))
    *tests, (_, _, last) = cuts
    k = s.constant(np.int32(last))
    for op, bound, branch in reversed(tests):
        test = s.exec(ops.compare(op=op), first, s.constant(F32(bound)))
        k = s.exec(ops.select(), test, s.constant(np.int32(branch)), k)
    return s.build([k])


PIECEWISE = [("lt", 0, 0), ("lt", 1, -1), ("lt", 2, 1), (None, None, 2)]


def branch(specs, fn):
    """A branch graph over inputs ``specs`` (shape, name) returning ``fn(g, *inputs)``."""
    g = GraphBuilder()
    ins = [g.input(shape, name=name) for shape, name in specs]
    return g.build([fn(g, *ins)])


def test_case_of_with_four_branches():
    """NNC's "symbolic graph case..of with 4 branches": exp below 0, bypass on [0, 1),
    log on [1, 2), 1 / x from 2, 1.1 x above 1000."""
    cuts = [("lt", 0, 0), ("lt", 1, -1), ("lt", 2, 1), ("gt", 1000, 3), (None, None, 2)]
    spec = [((1,), "x")]
    branches = [
        branch(spec, lambda g, x: g.exec(ops.ewexp(), x, name="exp")),
        branch(spec, lambda g, x: g.exec(ops.ewlog(), x, name="log")),
        branch(spec, lambda g, x: g.exec(ops.ewdiv(), g.constant(F32([1])), x, name="1/b")),
        branch(spec, lambda g, x: g.exec(ops.scalar_mul(a=1.1), x, name="1.1b")),
    ]
    b = GraphBuilder()
    x = b.input((1,), name="x")
    (y,) = case_of(b, selector_of((1,), cuts), branches, [x], bypass=[x], name="4 branches")
    graph = b.build([y])
    for v, want, tol in [
        (-2.2, np.exp(-2.2), 1e-5),
        (1.1, np.log(1.1), 1e-5),
        (0.9, 0.9, 1e-5),
        (2.2, 1 / 2.2, 1e-5),
        (1001, 1.1 * 1001, 1e-2),
    ]:
        np.testing.assert_allclose(both(graph, F32([v])), [want], rtol=0, atol=tol)


WEIGHTS = [((2, 2), "u"), ((2, 2), "w"), ((2,), "b"), ((2,), "c")]


def test_case_of_branches_with_intermediate_tensors():
    """NNC's "symbolic graph case..of when reuse intermediate tensors": each branch is
    two dense layers, y = (x u^T + b) w^T + c, with its own weights. NNC checks that
    both branches' hidden z share one buffer (XLA's business in fnnc); this checks the
    values of the branches and of the bypass."""
    specs = [((1, 2), "x")] + [(s, f"{n}{k}") for k in (0, 1) for s, n in WEIGHTS]

    def two_dense(k):
        def fn(g, x, *weights):
            u, w, bias, c = weights[4 * k : 4 * k + 4]
            dense = ops.gemm(transpose_b=True)
            return g.exec(dense, g.exec(dense, x, u, bias, name="mmu"), w, c, name="mmw")

        return branch(specs, fn)

    b = GraphBuilder()
    ins = [b.input(shape, name=name) for shape, name in specs]
    cuts = [*PIECEWISE[:3], (None, None, 1)]
    selector = selector_of((1, 2), cuts, [(s, F32, n) for s, n in specs[1:]])
    (y,) = case_of(b, selector, [two_dense(0), two_dense(1)], ins, bypass=[0])
    graph = b.build([y])
    rng = np.random.default_rng(1)
    weights = [[rng.normal(size=s).astype(F32) for s, _ in WEIGHTS] for _ in range(2)]
    for v, k in ((-0.5, 0), (0.5, -1), (1.5, 1), (3.0, 1)):
        x = F32([[v, 2.0]])
        want = x
        if k >= 0:
            u, w, bias, c = weights[k]
            want = (x @ u.T + bias) @ w.T + c
        got = both(graph, x, *weights[0], *weights[1])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


SPECS = [((1,), "x"), ((1,), "s"), ((1,), "p")]


def piecewise_branches(specs):
    """NNC's three branches over inputs (x, s, p): 0; x * s + p; 1.5."""
    return [
        branch(specs, lambda g, x, s, p: g.exec(ops.set(shape=(1,)), name="set")),
        branch(specs, lambda g, x, s, p: g.exec(ops.ewsum(), g.exec(ops.ewprod(), x, s), p)),
        branch(specs, lambda g, x, s, p: g.exec(ops.set(shape=(1,), value=1.5), name="set")),
    ]


def test_case_of_in_a_loop_on_a_scaled_input():
    """NNC's "symbolic while graph contains a case..of graph takes input by multiplying to
    0.8 and multiply its output with 0.3": b <- f(0.8 b) four times from 2.5, then
    times 0.3; f takes branch 2, branch 1, then bypasses twice."""
    selector = selector_of((1,), PIECEWISE, [((1,), F32, "s"), ((1,), F32, "p")])
    bb = GraphBuilder()
    bin_, s0, s, p = (bb.input((1,), name=n) for n in ("b", "s0", "s", "p"))
    x = bb.exec(ops.ewprod(), bin_, s0, name="prod")
    (y,) = case_of(bb, selector, piecewise_branches(SPECS), [x, s, p], bypass=[x])
    body = bb.build([y])
    b = GraphBuilder()
    ins = [b.input((1,), name=n) for n in ("b", "s0", "s", "p")]
    (out,) = while_loop(b, body, count_below(4), ins, carry_overs={y: bin_}, name="while 4")
    a = b.input((1,), name="a")
    graph = b.build([b.exec(ops.ewprod(), a, out, name="prod1")])
    got = both(graph, F32([2.5]), F32([0.8]), F32([0.5]), F32([0.5]), F32([0.3]))
    np.testing.assert_allclose(got, [1.1 * 0.8 * 0.8 * 0.3], rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "x, y, dy", [(-1.0, 0.0, 0.0), (0.76, 0.76, 1.0), (1.226, 1.113, 0.5), (2.1, 1.5, 0.0)]
)
def test_backward_pass_through_case_of(x, y, dy):
    """NNC's "symbolic graph for piece-wise function y = f(x), compute y'": the backward
    pass through case..of gives 0, 1 (bypass), 0.5, 0."""
    selector = selector_of((1,), PIECEWISE, [((1,), F32, "s"), ((1,), F32, "p")])
    b = GraphBuilder()
    xs, s, p = (b.input((1,), name=n) for n in ("x", "s", "p"))
    (out,) = case_of(b, selector, piecewise_branches(SPECS), [xs, s, p], bypass=[xs])
    graph, _ = backward(b.build([out]), out, [xs])
    value, dx = both(graph, F32([x]), F32([0.5]), F32([0.5]))
    np.testing.assert_allclose(value, [y], rtol=0, atol=1e-5)
    np.testing.assert_allclose(dx, [dy], rtol=0, atol=1e-5)
