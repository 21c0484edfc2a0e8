"""NNC's tensor binding, parallel, dropout and random unit tests, ported (liuliu/ccv
test/unit/nnc: tensor.bind.tests.c, parallel.tests.c, dropout.tests.c, rand.tests.c).

Binding a tensor to a symbol (at compile time or later) is, in fnnc, passing the array
as the graph input's argument (or, when fixed at compile time, a constant); the arena's
own bookkeeping (which symbols it allocates) is XLA's and is not checked. Random
values come from JAX's generator, so the tests check NNC's statistical bounds, not
NNC's numbers.
"""

import textwrap

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, compile, interpret, while_loop
from tests.helpers import run_on_cpu_devices

F32 = np.float32


def key(seed):
    return np.asarray(jax.random.key_data(jax.random.key(seed)))


def both(graph, *args):
    """The graph's outputs from ``interpret`` and from ``compile``; they must agree."""
    slow, fast = interpret(graph, *args), compile(graph)(*args)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), slow, fast)
    return fast


# --- tensor.bind.tests.c -----------------------------------------------------------


@pytest.mark.parametrize("bound", ["inputs", "constants"])
def test_loop_with_bound_factors_runs_five_times(bound):
    """NNC's "while z = a * x + b (x <- z) compiled a and b binded to a tensor": the
    condition count < 4 is read after the body, so the body runs five times."""
    bb = GraphBuilder()
    x, a, b_ = bb.input((1,), name="x"), bb.input((1,), name="a"), bb.input((1,), name="b")
    z = bb.exec(ops.ewsum(), bb.exec(ops.ewprod(), a, x, name="prod"), b_, name="sum")
    body = bb.build([z])
    c = GraphBuilder()
    count = c.input((), np.int32, name="count")
    cond = c.build([c.exec(ops.compare(op="lt"), count, c.constant(np.int32(4)))])
    g = GraphBuilder()
    xs = g.input((1,), name="x")
    if bound == "inputs":
        ab, args = [g.input((1,), name="a"), g.input((1,), name="b")], (F32([0.3]), F32([1.1]))
    else:
        ab, args = [g.constant(F32([0.3]), name="a"), g.constant(F32([1.1]), name="b")], ()
    (out,) = while_loop(g, body, cond, [xs, *ab], carry_overs={z: x}, breakpoint="after")
    want = 0.88
    for _ in range(5):
        want = 0.3 * want + 1.1
    got = both(g.build([out]), F32([0.88]), *args)
    np.testing.assert_allclose(got, [want], rtol=0, atol=1e-6)


def test_views_of_a_bound_tensor():
    """NNC's "compile graph (a[1] + a[0]) * a where a is a binded tensor"."""
    b = GraphBuilder()
    a = b.input((2,), name="a")
    a0, a1 = b.alias(a, (1,), name="a[0]"), b.alias(a, (1,), offset=(1,), name="a[1]")
    s = b.exec(ops.ewsum(), a0, a1, name="sum")
    graph = b.build([b.exec(ops.mul(p=1.0), s, a, name="mul")])
    got = both(graph, F32([1.1, 0.4]))
    np.testing.assert_allclose(got, [(1.1 + 0.4) * 1.1, (1.1 + 0.4) * 0.4], rtol=1e-6)


def test_two_products_with_some_tensors_bound():
    """NNC's "compile a graph with tensor bindings, verify tensor arena doesn't allocate
    these tensors": e = (a b) d. The arena-size check is about NNC's allocator."""
    b = GraphBuilder()
    a, bm, d = b.input((1, 2), name="a"), b.input((2, 1), name="b"), b.input((1, 1), name="d")
    c = b.exec(ops.gemm(), a, bm, name="gemm")
    graph = b.build([b.exec(ops.gemm(), c, d, name="mul")])
    got = both(graph, F32([[1.1, 11003]]), F32([[-1], [-0.12]]), F32([[0.5]]))
    np.testing.assert_allclose(got, [[-(11003 * 0.12 + 1.1) * 0.5]], rtol=0, atol=1e-2)


def test_result_read_through_a_view():
    """NNC's "compile a graph with tensor binded to alias" and "compile a graph with
    tensor alias and bind to the alias later" (one case in fnnc: arguments are given at
    call time): the result of log(2.34) read through an alias of it."""
    b = GraphBuilder()
    out = b.exec(ops.ewlog(), b.input((1,), name="a"), name="log")
    graph = b.build([b.alias(out, (1,), name="alias")])
    np.testing.assert_allclose(both(graph, F32([2.34])), [np.log(2.34)], rtol=0, atol=1e-5)


# --- parallel.tests.c --------------------------------------------------------------


def test_independent_branches_then_joined():
    """NNC's "schedule a simple graph for parallel execution": z = x y and c = a + b
    are independent; d = z / c, then log d + exp d."""
    b = GraphBuilder()
    x, y, a, bb = (b.input((1,), name=n) for n in "xyab")
    d = b.exec(ops.ewdiv(), b.exec(ops.ewprod(), x, y), b.exec(ops.ewsum(), a, bb), name="div")
    d2 = b.exec(ops.ewsum(), b.exec(ops.ewlog(), d), b.exec(ops.ewexp(), d), name="sum1")
    got = both(b.build([d2]), F32([2]), F32([0.21]), F32([2.2]), F32([3.2]))
    dv = F32(2 * 0.21 / (2.2 + 3.2))
    np.testing.assert_allclose(got, [np.log(dv) + np.exp(dv)], rtol=0, atol=1e-5)


DATA_PARALLEL = textwrap.dedent(
    """
    import jax, numpy as np
    from jax.sharding import PartitionSpec as P
    from fnnc import ops
    from fnnc.graph import GraphBuilder, compile, data_parallel, minimize
    from fnnc.models import minimizers

    assert jax.device_count() == 2, jax.devices()
    n = 8
    b = GraphBuilder()
    x, label = b.input((n, 16, 16, 3), name="x"), b.input((n,), np.int32, name="label")
    w1, b1 = b.input((8, 5, 5, 3), name="w1"), b.input((8,), name="bias1")
    w3, b3 = b.input((8, 5, 5, 8), name="w3"), b.input((8,), name="bias3")
    y1 = b.exec(ops.convolution(padding=2), x, w1, b1, name="conv1")
    y2 = b.exec(ops.avg_pool(window=2, strides=2), y1, name="avg2")
    y3 = b.exec(ops.convolution(strides=2, padding=2), y2, w3, b3, name="conv3")
    y4 = b.exec(ops.avg_pool(window=4, strides=4), y3, name="avg4")
    logits = b.exec(ops.reshape(shape=(n, 8)), y4)
    loss, _ = b.exec(ops.softmax_crossentropy(), logits, label, name="softmax crossentropy")
    total = b.exec(ops.reduce_sum(axes=(0, 1)), loss)
    sgd = minimizers.sgd(0.001, momentum=0.9, dampening=0.9, decay=0.99, scale=1.0)
    step, layout = minimize(b.build([total]), total, [w1, b1, w3, b3], sgd)
    rng = np.random.default_rng(0)
    params = [rng.normal(scale=0.1, size=s).astype(np.float32)
              for s in ((8, 5, 5, 3), (8,), (8, 5, 5, 8), (8,))]
    data = [rng.normal(size=(n, 16, 16, 3)).astype(np.float32),
            rng.integers(0, 8, n).astype(np.int32)]

    def run(program):
        p, s = list(params), list(layout.init(params))
        losses = []
        for _ in range(3):
            p, s, value = layout.split(program(*p, *s, *data))
            losses.append(np.asarray(value).item())
        return p, losses

    mesh = jax.make_mesh((2,), ("data",))
    plan = data_parallel(step, mesh, layout=layout)
    assert plan.inputs[-2:] == (P("data"), P("data")), plan.inputs  # x and label split
    want_p, want_loss = run(compile(step))
    got_p, got_loss = run(compile(step, shardings=plan))
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    for g, w in zip(got_p, want_p):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
    assert len(got_p[0].sharding.device_set) == 2
    print("OK")
    """
)


def test_training_step_split_over_two_devices():
    """NNC's "schedule symbolic graph to data parallel": a conv / average-pool net with
    softmax cross-entropy, minimized with NNC's SGD, its batch split over 2 devices.
    NNC only builds the graph; here 3 steps equal the single-device steps."""
    run_on_cpu_devices(DATA_PARALLEL, devices=2, timeout=300)


# --- dropout.tests.c ---------------------------------------------------------------


def dropout_graph(p, entirety=False):
    """y = dropout(x) and the backward pass's dx for a seed gradient g."""
    b = GraphBuilder()
    x, k, g = b.input((20, 50), name="x"), b.input((2,), np.uint32, name="key"), b.input((20, 50))
    y, _ = b.exec(ops.dropout(p=p, entirety=entirety), x, k, name="dropout")
    graph, _ = backward(b.build([y]), y, [x], df=[g])
    return compile(graph)


A = ((np.arange(1000) + 1) * 0.01).reshape(20, 50).astype(F32)
G = (np.arange(1000) + 1).reshape(20, 50).astype(F32)


def test_dropout_forty_percent_and_its_gradient():
    """NNC's "dropout 40% of a 20x50 matrix" and "dropout gradient for 40% of a 20x30
    matrix": about 40% zeros, the rest scaled by 1 / 0.6; the gradient is zero where
    dropped and g / 0.6 elsewhere."""
    step = dropout_graph(0.4)
    for seed in range(3):
        y, dx = (np.asarray(v) for v in step(A, key(seed), G))
        kept = y != 0
        assert abs((~kept).mean() - 0.4) <= 5e-2
        np.testing.assert_allclose(y[kept], A[kept] / 0.6, rtol=1e-6)
        np.testing.assert_allclose(dx, np.where(kept, G / 0.6, 0), rtol=1e-6)


def test_dropout_of_the_entire_matrix_and_its_gradient():
    """NNC's "dropout entire matrix with 20% chance" and "dropout gradient entire matrix
    with 20% chance": all zeros, or all scaled by 1 / 0.8 (the gradient too)."""
    step = dropout_graph(0.2, entirety=True)
    dropped = []
    for seed in range(16):
        y, dx = (np.asarray(v) for v in step(A, key(seed), G))
        dropped.append(bool(y.flat[0] == 0))
        scale = 0.0 if dropped[-1] else 1 / 0.8
        np.testing.assert_allclose(y, A * scale, rtol=1e-6)
        np.testing.assert_allclose(dx, G * scale, rtol=1e-6)
    assert 0 < sum(dropped) < 16


# --- rand.tests.c --------------------------------------------------------------------


def sampler(cmd):
    b = GraphBuilder()
    return compile(b.build([b.exec(cmd, b.input((2,), np.uint32, name="key"), name="random")]))


def test_random_uniform_fills_twelve_unit_bins_evenly():
    """NNC's "random uniform distribution": 100000 draws in [-8, 4); each unit bin holds
    100000 / 12 of them within 1000."""
    x = np.asarray(sampler(ops.random_uniform(shape=(100000,), low=-8.0, high=4.0))(key(0)))
    assert x.min() > -8 - 1e-5 and x.max() < 4 + 1e-5
    bins = np.clip(np.floor(x).astype(int) + 8, 0, 11)
    counts = np.bincount(bins, minlength=12)
    assert np.all(np.abs(counts - round(100000 / 12)) <= 1000), counts


def test_random_normal_mean_and_deviation():
    """NNC's "random normal distribution": 100001 draws with std 2 and mean 1, each
    within 2e-2."""
    x = np.asarray(sampler(ops.random_normal(shape=(100001,), mean=1.0, std=2.0))(key(0)))
    x = x.astype(np.float64)
    assert abs(x.std() - 2) <= 2e-2 and abs(x.mean() - 1) <= 2e-2
