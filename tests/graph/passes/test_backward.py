"""backward: gradients from the commands' own rules, checked against jax.grad."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from fnnc import ops
from fnnc.errors import DTypeError, GraphError, ShapeError
from fnnc.graph import GraphBuilder, compile, interpret, trace
from fnnc.graph.passes.backward import backward
from tests.graph.strategies import graphs
from tests.helpers import assert_close, rand


def _scalar_of_outputs(graph, weights):
    """The graph plus f = sum_i sum(w_i * output_i), as a scalar symbol."""
    b = GraphBuilder.from_graph(graph)
    terms = []
    for sid, w in zip(graph.outputs, weights):
        sym = graph.symbols[sid]
        weighted = b.exec(ops.mul(), sym, b.constant(w))
        axes = tuple(range(len(sym.shape)))
        total = b.exec(ops.reduce_sum(axes=axes), weighted) if axes else weighted
        terms.append(b.exec(ops.reshape(shape=()), total))
    f = terms[0] if len(terms) == 1 else b.exec(ops.ewsum(), *terms)
    return b.build([f]), f


@settings(max_examples=40)
@given(graphs(max_nodes=6))
def test_random_graphs_match_jax_grad(case):
    graph, arrays = case
    # Off the kinks: hypothesis favours values such as 0, 0.5 and 1 and equal elements,
    # where clamp, relu, min and max have no derivative and NNC's convention (the
    # gradient to both tied inputs, through a clamp at its bound) differs from jax.grad's
    # (split evenly). A distinct small offset per element moves every input off them.
    arrays = [
        (a + 1e-3 * (np.arange(a.size).reshape(a.shape) + 1 + 97 * i) / 7).astype(a.dtype)
        for i, a in enumerate(arrays)
    ]
    rng = np.random.default_rng(0)
    weights = [rng.uniform(-1, 1, graph.spec(o).shape).astype(np.float32) for o in graph.outputs]
    fgraph, f = _scalar_of_outputs(graph, weights)
    inputs = [fgraph.symbols[i] for i in fgraph.inputs]
    grad_graph, _grads = backward(fgraph, f, inputs)

    def value(*xs):
        return interpret(fgraph, *xs)

    want = jax.jit(jax.grad(value, argnums=tuple(range(len(arrays)))))(*arrays)
    got = interpret(grad_graph, *arrays)
    got = got[1:] if isinstance(got, tuple) else ()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_close(g, w, rtol=2e-5, atol=2e-5)


def test_nnc_autograd_example():
    b = GraphBuilder()
    x = b.input((), name="x")
    w = b.exec(ops.ewprod(), x, x, name="w")
    u = b.exec(ops.ewdiv(), b.constant(np.float32(1)), x, name="u")
    z = b.exec(ops.ewsum(), w, b.exec(ops.ewlog(), u, name="v"), name="z")
    graph, (_dx,) = backward(b.build([z]), z, [x])
    for run in (lambda *a: interpret(graph, *a), compile(graph)):
        value, grad = run(np.float32(0.84))
        assert abs(float(value) - 0.879953387) < 1e-6
        assert abs(float(grad) - 0.489523810) < 1e-6


def test_nnc_two_variable_case():
    b = GraphBuilder()
    x, y = b.input((), name="x"), b.input((), name="y")
    one = b.constant(np.float32(1))
    v = b.exec(ops.mul(), b.exec(ops.add(q=-1.0), x, y), b.exec(ops.add(), y, one), name="v")
    graph, _ = backward(b.build([v]), v, [x, y])
    value, dx, dy = compile(graph)(np.float32(43.24), np.float32(0.38))
    np.testing.assert_allclose([value, dx, dy], [59.1468, 1.38, 41.48], rtol=1e-5)


def test_listing_of_a_small_backward():
    b = GraphBuilder()
    x = b.input((), name="x")
    z = b.exec(ops.ewprod(), x, x)
    graph, _ = backward(b.build([z]), z, [x])
    assert str(graph) == "\n".join(
        [
            "graph(%0:f32[] x) {",
            "  %1:f32[] = ewprod(%0, %0)",
            "  %2:f32[] = set[shape=(), value=1.0]()",
            "  %3:f32[], %4:f32[] = ewprod.backward[wants=(0,1)](%2, %0, %0)",
            "  %5:f32[] = ewsum(%3, %4)",
            "  return %1, %5",
            "}",
        ]
    )


def test_only_needed_inputs_get_gradient_nodes():
    b = GraphBuilder()
    x, y = b.input((3,), name="x"), b.input((3,), name="y")
    hy = b.exec(ops.ewexp(), b.exec(ops.ewexp(), y))  # depends on y only
    f = b.exec(ops.reshape(shape=()), b.exec(ops.reduce_sum(axes=(0,)), b.exec(ops.mul(), x, hy)))
    graph, (_gx,) = backward(b.build([f]), f, [x])
    grads = [n for n in graph.nodes if n.cmd.name == "gradient"]
    assert [str(n.cmd.param("of")) for n in grads] == [
        "reshape[shape=()]",
        "reduce_sum[axes=(0,)]",
        "mul",
    ]
    assert grads[-1].cmd.param("wants") == (0,)  # no gradient for the y side of mul
    xs = rand([3]), rand([3], seed=1)
    assert_close(interpret(graph, *xs)[1], np.exp(np.exp(xs[1])))


def test_wrt_that_f_ignores_gets_zeros_and_several_f_add_up():
    b = GraphBuilder()
    x, y = b.input((2,), name="x"), b.input((2,), name="y")
    s = b.exec(ops.reshape(shape=()), b.exec(ops.reduce_sum(axes=(0,)), x))
    t = b.exec(ops.reshape(shape=()), b.exec(ops.reduce_sum(axes=(0,)), b.exec(ops.mul(), x, x)))
    graph, (gx, gy) = backward(b.build([s, t]), [s, t], [x, y])
    assert graph.outputs[-2:] == (gx.id, gy.id)  # the returned symbols are the new outputs
    xs = np.array([1.0, -2.0], np.float32), np.ones(2, np.float32)
    _, _, dx, dy = interpret(graph, *xs)
    assert_close(dx, 1 + 2 * xs[0])
    assert_close(dy, np.zeros(2))


def test_seed_gradient_df():
    b = GraphBuilder()
    x, seed = b.input((2, 3), name="x"), b.input((2, 3), name="df")
    y = b.exec(ops.tanh(), x)
    graph, (_gx,) = backward(b.build([y]), y, [x], df=seed)
    xs, dfs = rand([2, 3]), rand([2, 3], seed=2)
    _, pull = jax.vjp(jnp.tanh, xs)
    assert_close(interpret(graph, xs, dfs)[1], pull(dfs)[0])


def test_second_order_through_the_same_pass():
    b = GraphBuilder()
    x = b.input((), name="x")
    y = b.exec(ops.ewprod(), x, x, x)
    g1, (dx,) = backward(b.build([y]), y, [x])
    g2, (_ddx,) = backward(g1, dx, [x])
    value, first, second = interpret(g2, np.float32(1.5))
    np.testing.assert_allclose([value, first, second], [1.5**3, 3 * 1.5**2, 6 * 1.5], rtol=1e-6)


class _MLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(6, 8, rngs=rngs)
        self.l2 = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.gelu(self.l1(x)))


class _CNN(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(2, 4, (3, 3), rngs=rngs)
        self.bn = nnx.BatchNorm(4, use_running_average=True, rngs=rngs)
        self.fc = nnx.Linear(4 * 3 * 3, 3, rngs=rngs)

    def __call__(self, x):
        x = nnx.max_pool(jax.nn.relu(self.bn(self.conv(x))), (2, 2), (2, 2))
        return self.fc(x.reshape(x.shape[0], -1))


def _check_model_grads(model, x, labels):
    graphdef, state = nnx.split(model)

    def loss(state, x):
        logits = nnx.merge(graphdef, state)(x)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

    graph = trace(loss, state, x)
    leaves = jax.tree.leaves(state)
    params = [graph.symbols[i] for i in graph.inputs[: len(leaves)]]
    grad_graph, _ = backward(graph, graph.outputs[0], params)
    got = compile(grad_graph)(*leaves, x)[1:]
    want = jax.tree.leaves(jax.jit(jax.grad(loss))(state, x))
    for g, w in zip(got, want):
        assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_traced_flax_mlp():
    _check_model_grads(_MLP(nnx.Rngs(0)), rand([4, 6]), jnp.array([0, 1, 2, 1]))


def test_traced_flax_cnn_with_batchnorm():
    _check_model_grads(_CNN(nnx.Rngs(0)), rand([2, 6, 6, 2]), jnp.array([0, 2]))


def test_traced_linen_transformer_block():
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm()(x)
            x = x + nn.MultiHeadDotProductAttention(num_heads=2)(h, h)
            h = nn.LayerNorm()(x)
            return x + nn.Dense(8)(jax.nn.gelu(nn.Dense(16)(h)))

    block = Block()
    x = rand([2, 3, 8])
    params = block.init(jax.random.key(0), x)

    def loss(p, x):
        return jnp.mean(block.apply(p, x) ** 2)

    graph = trace(loss, params, x)
    leaves = jax.tree.leaves(params)
    wrt = [graph.symbols[i] for i in graph.inputs[: len(leaves)]]
    grad_graph, _ = backward(graph, graph.outputs[0], wrt)
    # One compile for each side (the oracle jitted too): node by node, this block's
    # hundreds of small programs made it the slowest test of the suite.
    got = compile(grad_graph)(*leaves, x)[1:]
    for g, w in zip(got, jax.tree.leaves(jax.jit(jax.grad(loss))(params, x))):
        assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_errors_name_the_symbols():
    b = GraphBuilder()
    x = b.input((3,), name="x")
    i = b.input((3,), np.int32, name="i")
    y = b.exec(ops.tanh(), x, name="y")
    graph = b.build([y])
    with pytest.raises(ShapeError, match=r"f %2 \(y\) is float32\[3\], not a scalar; pass df="):
        backward(graph, y, [x])
    with pytest.raises(GraphError, match="not a symbol of this graph"):
        backward(graph, y, [99], df=[x])
    other = GraphBuilder()
    stranger = other.input((5,), name="stranger")
    with pytest.raises(GraphError, match="not a symbol of this graph"):
        backward(graph, y, [stranger], df=[x])
    with pytest.raises(DTypeError, match=r"wrt %1 \(i\) is int32"):
        backward(graph, y, [i], df=[x])
    with pytest.raises(GraphError, match="1 f but 2 df"):
        backward(graph, y, [x], df=[x, x])


@st.composite
def _views(draw):
    """A root of 2 to 12 elements and 1 to 3 views of it, each of rank 1 or 2 with any
    strides (0 included: broadcasts, sliding windows) that stay inside the root."""
    n = draw(st.integers(2, 12))
    views = []
    for _ in range(draw(st.integers(1, 3))):
        shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
        stride = tuple(draw(st.integers(0, 3)) for _ in shape)
        span = sum((k - 1) * s for k, s in zip(shape, stride))
        if span >= n:
            stride, span = (0,) * len(shape), 0
        views.append((shape, stride, draw(st.integers(0, n - 1 - span))))
    return n, views


@settings(max_examples=40)
@given(_views())
def test_gradients_through_views_add_up_per_element(case):
    """f = sum_k sum(view_k(x) * c_k): df/dx[i] is the sum of c_k over every time a view
    reads element i (NumPy's ``np.add.at``), whether the views repeat elements, overlap
    each other or are disjoint."""
    n, specs = case
    rng = np.random.default_rng(len(specs) * 100 + n)
    b = GraphBuilder()
    x = b.input((n,), name="x")
    weights, terms, want = [], [], np.zeros(n)
    for k, (shape, stride, base) in enumerate(specs):
        c = rng.normal(size=shape).astype(np.float32)
        view = b.alias(x, shape, stride=stride, base=base, name=f"v{k}")
        weighted = b.exec(ops.mul(), view, b.input(shape, name=f"c{k}"))
        total = b.exec(ops.reduce_sum(axes=tuple(range(len(shape)))), weighted)
        terms.append(b.exec(ops.reshape(shape=()), total))
        weights.append(c)
        np.add.at(want, view.flat_indices().reshape(-1), c.reshape(-1))
    f = terms[0] if len(terms) == 1 else b.exec(ops.ewsum(), *terms)
    graph, _ = backward(b.build([f]), f, [x])
    args = (rng.normal(size=n).astype(np.float32), *weights)
    assert_close(interpret(graph, *args)[1], want, rtol=1e-5, atol=1e-6)
    assert_close(compile(graph)(*args)[1], want, rtol=1e-5, atol=1e-6)
