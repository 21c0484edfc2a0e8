"""scan: blocks as one loop; checkpointing it shrinks XLA's own temporaries, and its
gradients equal the unrolled backward's and jax.grad's."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import GraphError, ShapeError
from fnnc.graph import (
    DynamicGraph,
    GraphBuilder,
    backward,
    compile,
    interpret,
    memory_plan,
    scan,
    verify,
    while_loop,
)
from fnnc.graph.passes.remat_cost import node_flops
from fnnc.models import BatchNorm, Dense, Input, Model, ReLU, Repeat, Sequential, model_function
from fnnc.models.memory import saved_activation_bytes
from tests.helpers import assert_close, exact_on_cpu

B, W, N = 32, 16, 16  # batch, width, blocks: a 16-block residual MLP, inner width 4W


def _block(b, h, w1, b1, w2, b2, tag=""):
    """``h + relu(h W1ᵀ + b1) W2ᵀ + b2``, NNC's dense layout."""
    up = b.exec(ops.gemm(transpose_b=True), h, w1, b1, name=f"up{tag}")
    down = b.exec(ops.gemm(transpose_b=True), b.exec(ops.relu(), up), w2, b2, name=f"down{tag}")
    return b.exec(ops.ewsum(), h, down, name=f"res{tag}")


PARAM_SHAPES = ((4 * W, W), (4 * W,), (W, 4 * W), (W,))


def _loss(b, h):
    return b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.ewprod(), h, h), name="loss")


def _unrolled():
    """The plain net: N blocks, each with its own parameter inputs, and its backward."""
    b = GraphBuilder()
    h = b.input((B, W), name="x")
    params = []
    for i in range(N):
        block = [b.input(s, name=f"p{i}.{k}") for k, s in enumerate(PARAM_SHAPES)]
        params += block
        h = _block(b, h, *block, tag=str(i))
    loss = _loss(b, h)
    return backward(b.build([loss]), loss, params)[0]


@functools.cache
def _body():
    b = GraphBuilder()
    h = b.input((B, W), name="h")
    return b.build([_block(b, h, *(b.input(s) for s in PARAM_SHAPES))])


def _scanned(checkpoint):
    """The same net as one scan over parameters stacked ``[N, ...]``."""
    b = GraphBuilder()
    x = b.input((B, W), name="x")
    stacked = [b.input((N, *s), name=f"p.{k}") for k, s in enumerate(PARAM_SHAPES)]
    (h,) = scan(b, _body(), [x], stacked, checkpoint=checkpoint, name="blocks")
    loss = _loss(b, h)
    return backward(b.build([loss]), loss, stacked)[0]


def _jax_loss(x, *stacked):
    """The oracle: the same net in plain JAX (its own scan, for a quick compile)."""

    def block(h, p):
        w1, b1, w2, b2 = p
        return h + jax.nn.relu(h @ w1.T + b1[None]) @ w2.T + b2[None], None

    h, _ = jax.lax.scan(block, x, stacked)
    return jnp.sum(h * h)


def _arrays():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(B, W)).astype(np.float32)
    stacked = [rng.normal(scale=0.15, size=(N, *s)).astype(np.float32) for s in PARAM_SHAPES]
    return x, stacked


def test_checkpointed_scan_cuts_xla_temporaries_and_keeps_the_gradients():
    x, stacked = _arrays()
    unrolled = compile(_unrolled())
    plain, ckpt = compile(_scanned(False)), compile(_scanned(True))
    per_block = [a[i] for i in range(N) for a in stacked]
    want = unrolled(x, *per_block)
    want_grads = [np.stack([want[1 + 4 * i + k] for i in range(N)]) for k in range(4)]
    jax_grads = jax.jit(jax.grad(_jax_loss, argnums=(1, 2, 3, 4)))(x, *stacked)
    for program in (plain, ckpt):
        loss, *grads = program(x, *stacked)
        assert float(loss[0, 0]) == pytest.approx(float(want[0][0, 0]), rel=1e-6)
        for got, ref, oracle in zip(grads, want_grads, jax_grads):
            scale = np.abs(ref).max()
            np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6 * scale)
            np.testing.assert_allclose(got, oracle, rtol=1e-5, atol=1e-5 * scale)
    # XLA's own figure: the checkpointed loop keeps one activation per block
    temp = {k: p.memory().temp_bytes for k, p in [("u", unrolled), ("s", plain), ("c", ckpt)]}
    # (XLA:GPU's unrolled program reuses more of its buffers than XLA:CPU's: 0.49 there)
    against_unrolled = 0.3 if jax.default_backend() == "cpu" else 0.6
    assert temp["c"] < 0.4 * temp["s"] and temp["c"] < against_unrolled * temp["u"], temp
    # fnnc's view agrees: the checkpointed loop's tape is the carry alone ([N, B, W]),
    # the plain one's also every block's relu output ([N, B, 4W])
    kept = {k: saved_activation_bytes(p.graph) for k, p in [("s", plain), ("c", ckpt)]}
    assert kept["s"] - kept["c"] == N * B * 4 * W * 4
    assert memory_plan(ckpt.graph).peak_bytes < memory_plan(plain.graph).peak_bytes


def test_scan_node_lists_what_it_saves():
    b = GraphBuilder()
    x = b.input((B, W), name="x")
    stacked = [b.input((N, *s)) for s in PARAM_SHAPES]
    scan(b, _body(), [x], stacked, checkpoint=True, name="blocks")
    scan(b, _body(), [x], stacked, checkpoint="dots_saveable")
    ckpt, dots = (n.cmd for n in b.build([x]).nodes)
    assert str(ckpt) == "scan[length=16; 4 nodes; carry 1; stacked 4; saves 1]"
    tape = ckpt.shape(*(s.spec for s in (x, *stacked)))[1:]
    assert [t.shape for t in tape] == [(N, B, W)]
    # remat's cost model counts every iteration: N x (two gemms, relu, residual add)
    per_block = 2 * (2 * W * 4 * W * B) + 4 * W * B + W * B
    assert node_flops(b.build([x]), 0) == N * per_block
    # dots_saveable keeps the gemm output the backward needs (`up`) and recomputes relu
    tape = dots.shape(*(s.spec for s in (x, *stacked)))[1:]
    assert sorted(t.shape for t in tape) == [(N, B, W), (N, B, 4 * W)]


def _tanh_body():
    """``h' = tanh(h * w + c)``: a stacked ``w`` and a loop-invariant ``c``."""
    b = GraphBuilder()
    h, w, c = b.input((3, 4), name="h"), b.input((3, 4), name="w"), b.input((4,), name="c")
    return b.build([b.exec(ops.tanh(), b.exec(ops.add(), b.exec(ops.ewprod(), h, w), c))])


@pytest.mark.parametrize("checkpoint", [False, True])
def test_constants_get_summed_gradients_and_interpret_agrees(checkpoint):
    b = GraphBuilder()
    x, ws, c = b.input((3, 4), name="x"), b.input((5, 3, 4), name="ws"), b.input((4,), name="c")
    (h,) = scan(b, _tanh_body(), [x], [ws], [c], checkpoint=checkpoint)
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), h)
    graph = verify(backward(b.build([loss]), loss, [x, ws, c])[0])
    rng = np.random.default_rng(1)
    args = [rng.normal(size=s.shape).astype(np.float32) for s in graph.input_specs]

    def f(x, ws, c):
        for i in range(5):
            x = jnp.tanh(x * ws[i] + c[None])
        return jnp.sum(x)

    want = jax.grad(f, argnums=(0, 1, 2))(*args)
    got = interpret(graph, *args)
    assert_close(got[1:], want, rtol=1e-5, atol=1e-6)
    assert_close(compile(graph)(*args), got, rtol=1e-6, atol=1e-6)


def test_bad_bodies_say_what_to_pass():
    b = GraphBuilder()
    x, ws = b.input((3, 4)), b.input((5, 3, 4))
    body = _tanh_body()
    with pytest.raises(GraphError, match=r"body takes 3 inputs, the call gives 2"):
        scan(b, body, [x], [ws])
    with pytest.raises(ShapeError, match="leading axis must be the loop length 4"):
        scan(b, body, [x], [ws], [b.input((4,))], length=4)
    with pytest.raises(GraphError, match="give length="):
        scan(b, body, [x], [], [ws, b.input((4,))])
    ib = GraphBuilder()
    k = ib.input((), np.int32, name="k")
    counter = ib.build([ib.exec(ops.add(), k, k)])
    with pytest.raises(GraphError, match="must be floating-point"):
        scan(b, counter, [b.input((), np.int32)], length=3)


def _body_with_means():
    """``h' = tanh(h w)`` and, per iteration, the batch mean of ``h w`` (a ``ys``)."""
    b = GraphBuilder()
    h, w = b.input((4, 8), name="h"), b.input((8, 8), name="w")
    z = b.exec(ops.gemm(), h, w)
    return b.build([b.exec(ops.tanh(), z), b.exec(ops.reduce_mean(axes=(0,)), z)])


@pytest.mark.parametrize("checkpoint", [False, True])
def test_per_iteration_results_are_stacked_and_carry_no_gradient(checkpoint):
    b = GraphBuilder()
    x, ws = b.input((4, 8), name="x"), b.input((5, 8, 8), name="ws")
    h, means = scan(b, _body_with_means(), [x], [ws], checkpoint=checkpoint, n_ys=1)
    assert means.shape == (5, 1, 8)
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), h)
    graph = verify(backward(b.build([loss, means]), loss, [ws])[0])
    rng = np.random.default_rng(2)
    args = rng.normal(size=(4, 8)).astype(np.float32), rng.normal(scale=0.3, size=(5, 8, 8))
    args = args[0], args[1].astype(np.float32)

    def f(x, ws):
        out = []
        for i in range(5):
            z = x @ ws[i]
            out.append(z.mean(0, keepdims=True))
            x = jnp.tanh(z)
        return jnp.sum(x, keepdims=True), jnp.stack(out)

    want_loss, want_means = f(*args)
    want_grad = jax.grad(lambda w: f(args[0], w)[0].sum())(args[1])
    got = interpret(graph, *args)
    assert_close(got, (want_loss, want_means, want_grad), rtol=1e-5, atol=1e-6)
    # one loop program against node-by-node programs: on a GPU their gemms and fusions
    # round differently, so there they agree as the oracle does
    assert_close(compile(graph)(*args), got, *exact_on_cpu(1e-5, 1e-6))


def test_per_iteration_results_must_be_left_out_of_the_loss():
    b = GraphBuilder()
    x, ws = b.input((4, 8), name="x"), b.input((5, 8, 8), name="ws")
    _, means = scan(b, _body_with_means(), [x], [ws], n_ys=1)
    loss = b.exec(ops.reduce_sum(axes=(0, 1, 2)), means)
    graph = backward(b.build([loss]), loss, [ws])[0]
    args = np.ones((4, 8), np.float32), np.ones((5, 8, 8), np.float32)
    with pytest.raises(Exception, match=r"per-iteration result \(ys\) has a gradient"):
        interpret(graph, *args)
    with pytest.raises(GraphError, match=r"returns 2 tensors for 1 carried ones and 0 per-it"):
        scan(b, _body_with_means(), [x], [ws])


# --- differentiated through jax.vjp (run_graph_nnc): the tape's cotangent ------------
# JAX hands a custom_vjp zeros for outputs nothing reads; a scan node must see those as
# "no gradient" (its tape and ys), as the backward pass gives it, not as a gradient.


def _scan_in_while(**bound):
    """Three trips of a while loop whose body scans ``_tanh_body`` over ``ws``."""
    wb = GraphBuilder()
    h0, ws, c = wb.input((3, 4), name="h0"), wb.input((2, 3, 4), name="ws"), wb.input((4,))
    (h1,) = scan(wb, _tanh_body(), [h0], [ws], [c])
    cb = GraphBuilder()
    n = cb.input((), np.int32, name="count")
    cond = cb.build([cb.exec(ops.compare(op="lt"), n, cb.constant(np.int32(3)))])
    b = GraphBuilder()
    x, ws, c = b.input((3, 4), name="x"), b.input((2, 3, 4), name="ws"), b.input((4,))
    (o,) = while_loop(b, wb.build([h1]), cond, [x, ws, c], carry_overs={h1: h0}, **bound)
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), o)
    g = b.build([loss])
    return backward(g, loss, list(g.inputs))[0]


def _tanh_loops(x, ws, c, trips=1):
    for _ in range(trips):
        for w in ws:
            x = jnp.tanh(x * w + c[None])
    return jnp.sum(x)


def _tanh_args(n=2):
    rng = np.random.default_rng(3)
    shapes = [(3, 4), (n, 3, 4), (4,)]
    return [rng.normal(scale=0.5, size=s).astype(np.float32) for s in shapes]


@pytest.mark.parametrize("bound", [{"tape": 4}, {"max_iterations": 5}])
def test_scan_in_a_taped_while_body_differentiates_as_jax_grad(bound):
    args = _tanh_args()
    want = jax.grad(functools.partial(_tanh_loops, trips=3), argnums=(0, 1, 2))(*args)
    got = interpret(_scan_in_while(**bound), *args)
    assert_close(got[1:], want, rtol=1e-5, atol=1e-5)


def test_dynamic_graph_differentiates_an_evaluated_scan_graph():
    b = GraphBuilder()
    x, ws, c = b.input((3, 4), name="x"), b.input((5, 3, 4), name="ws"), b.input((4,))
    (h,) = scan(b, _tanh_body(), [x], [ws], [c])
    graph = b.build([b.exec(ops.reshape(shape=()), b.exec(ops.reduce_sum(axes=(0, 1)), h))])
    args = _tanh_args(5)
    dg = DynamicGraph()
    vs = [dg.variable(a) for a in args]
    y = dg.evaluate(graph, vs)
    got = dg.backward(y, vs)
    want = jax.grad(_tanh_loops, argnums=(0, 1, 2))(*args)
    assert_close([g.numpy() for g in got], want, rtol=1e-5, atol=1e-5)


def test_jax_grad_of_a_model_function_with_a_repeat_and_its_running_statistics():
    x = Input()
    block = lambda: Sequential([Dense(4, name="fc"), BatchNorm(), ReLU()], name="block")
    model = Model(x, Repeat(block, 3, name="blocks")(x))
    X = np.random.default_rng(4).normal(size=(5, 4)).astype(np.float32)
    model.compile(X, loss="mse", minimizer=optax.sgd(0.1))
    # training mode: the loop's ys (the new running statistics) are outputs no loss reads
    fn = model_function(model, [jax.ShapeDtypeStruct(X.shape, X.dtype)], training=True)
    params = fn.initial_parameters(model)
    got = jax.grad(lambda p: fn([X], p)[0][0].sum())(params)
    at = "t-blocks-0-block-[0:3]-"
    ids = [at + "fc-0-0", at + "fc-0-1", at + "0-0", at + "0-1"]  # weight, bias, scale, shift

    def plain(w, bias, scale, shift):
        h = X
        for i in range(3):
            z = h @ w[i].T + bias[i][None]
            norm = (z - z.mean(0, keepdims=True)) / jnp.sqrt(z.var(0, keepdims=True) + 1e-5)
            h = jax.nn.relu(norm * scale[i][None] + shift[i][None])
        return h.sum()

    want = jax.grad(plain, argnums=(0, 1, 2, 3))(*(params[k] for k in ids))
    assert_close([got[k] for k in ids], want, rtol=1e-4, atol=1e-4)
