"""pipeline: GPipe stages over stacked blocks equal the sequential blocks (scan, plain JAX)
in values and gradients, on one device here and sharded over a 4-device mesh in a
subprocess."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError, GraphError, ShapeError
from fnnc.graph import GraphBuilder, backward, compile, interpret, pipeline, scan, verify
from fnnc.graph.passes.remat_cost import node_flops
from tests.helpers import assert_close, subprocess_env

B, W = 8, 4  # batch rows, width; blocks are h + relu(h W1ᵀ + b1) W2ᵀ + b2 + c
PARAM_SHAPES = ((2 * W, W), (2 * W,), (W, 2 * W), (W,))


@functools.cache
def _body(rows: int):
    """One residual MLP block for ``rows`` rows, with a loop-invariant bias ``c``."""
    b = GraphBuilder()
    h = b.input((rows, W), name="h")
    w1, b1, w2, b2 = (b.input(s, name=f"p{k}") for k, s in enumerate(PARAM_SHAPES))
    c = b.input((W,), name="c")
    up = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), h, w1, b1))
    down = b.exec(ops.gemm(transpose_b=True), up, w2, b2)
    return b.build([b.exec(ops.ewsum(), h, b.exec(ops.add(), down, c))])


def _train_graph(n: int, run):
    """``sum(blocks(x)²)`` and its gradients wrt x, every stacked parameter and c."""
    b = GraphBuilder()
    x = b.input((B, W), name="x")
    stacked = [b.input((n, *s), name=f"p.{k}") for k, s in enumerate(PARAM_SHAPES)]
    c = b.input((W,), name="c")
    (h,) = run(b, x, stacked, c)
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.ewprod(), h, h))
    return verify(backward(b.build([loss]), loss, [x, *stacked, c])[0])


def _piped(n: int, stages: int, microbatches: int, checkpoint: bool = False):
    def run(b, x, stacked, c):
        body = _body(B // microbatches)
        return pipeline(
            b, body, [x], stacked, [c], stages=stages, microbatches=microbatches,
            checkpoint=checkpoint, name="blocks",
        )  # fmt: skip

    return _train_graph(n, run)


def _jax_loss(x, w1, b1, w2, b2, c):
    for i in range(w1.shape[0]):
        up = jax.nn.relu(x @ w1[i].T + b1[i][None])
        x = x + up @ w2[i].T + b2[i][None] + c[None]
    return jnp.sum(x * x)


_jax_value_and_grad = jax.jit(jax.value_and_grad(_jax_loss, argnums=tuple(range(6))))


def _arrays(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B, W)).astype(np.float32)
    stacked = [rng.normal(scale=0.3, size=(n, *s)).astype(np.float32) for s in PARAM_SHAPES]
    return [x, *stacked, rng.normal(scale=0.1, size=(W,)).astype(np.float32)]


@pytest.mark.parametrize(
    "stages,microbatches,n,checkpoint",
    [(1, 4, 2, False), (2, 4, 4, True), (4, 2, 4, False), (3, 2, 6, False)],
)  # fmt: skip
def test_values_and_gradients_equal_the_sequential_blocks(stages, microbatches, n, checkpoint):
    args = _arrays(n)
    loss, *grads = compile(_piped(n, stages, microbatches, checkpoint))(*args)
    want_loss, want_grads = _jax_value_and_grad(*args)
    assert np.asarray(loss).item() == pytest.approx(float(want_loss), rel=1e-5)
    assert_close(grads, want_grads, rtol=1e-5, atol=1e-5)


def test_checkpoint_drops_the_blocks_activations_from_xla_temporaries():
    """Without checkpointing the backward keeps every block's relu output of every
    iteration; with it, only each block's input (then recomputes the block)."""
    n, stages, microbatches = 8, 2, 2
    plain, ckpt = (compile(_piped(n, stages, microbatches, c)).memory() for c in (False, True))
    rows = B // microbatches  # the tape holds every block's real calls, no bubble's
    relu_bytes = microbatches * n * rows * 2 * W * 4  # [rows, 2W] float32 per block call
    assert plain.temp_bytes - ckpt.temp_bytes >= relu_bytes, (plain, ckpt)


def test_the_tape_keeps_no_bubble_calls():
    """The tape holds ``microbatches`` calls of each block: the ``stages - 1`` bubble
    iterations of each stage record nothing (they were ``(stages - 1) / T`` of it)."""
    n, stages, microbatches = 4, 4, 2
    graph = _piped(n, stages, microbatches, False)
    (node,) = [nd for nd in graph.nodes if nd.cmd.name == "pipeline"]
    for sid in node.outputs[1:]:
        assert graph.spec(sid).shape[:3] == (stages, microbatches, n // stages)


def test_pipeline_equals_scan_and_interpret_agrees():
    """Also the one-microbatch case: the stages alone, the batch whole."""
    n, args = 4, _arrays(4, seed=1)

    def scanned(b, x, stacked, c):
        return scan(b, _body(B), [x], stacked, [c], name="blocks")

    want = compile(_train_graph(n, scanned))(*args)
    graph = _piped(n, stages=2, microbatches=1)
    assert_close(compile(graph)(*args), want, rtol=1e-5, atol=1e-5)
    assert_close(interpret(graph, *args), want, rtol=1e-5, atol=1e-5)


def test_two_carries_and_the_node_listing():
    """``(h, s) <- (tanh(h W), s + h)``: every carry is split, shifted and merged back."""
    mb = GraphBuilder()
    h, s, w = mb.input((2, 3), name="h"), mb.input((2, 3), name="s"), mb.input((3, 3), name="w")
    body = mb.build([mb.exec(ops.tanh(), mb.exec(ops.gemm(), h, w)), mb.exec(ops.add(), s, h)])
    b = GraphBuilder()
    x, acc, ws = b.input((6, 3), name="x"), b.input((6, 3), name="acc"), b.input((4, 3, 3))
    outs = pipeline(b, body, [x, acc], [ws], stages=2, microbatches=3)
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.ewprod(), *outs))
    graph = backward(b.build([loss]), loss, [x, acc, ws])[0]
    assert (
        str(graph.nodes[0].cmd)
        == "pipeline[stages=2; microbatches=3; axis=stage; 3 nodes; saves 2]"
    )
    # remat's cost model: 4 iterations x 4 block calls x (gemm 2*3*6 + tanh 6 + add 6)
    assert node_flops(graph, 0) == 4 * 4 * (36 + 6 + 6)

    def f(x, acc, ws):
        for i in range(4):
            x, acc = jnp.tanh(x @ ws[i]), acc + x
        return jnp.sum(x * acc)

    rng = np.random.default_rng(2)
    args = [rng.normal(size=sp.shape).astype(np.float32) for sp in graph.input_specs]
    loss, *grads = compile(graph)(*args)
    want_loss, want_grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(*args)
    assert np.asarray(loss).item() == pytest.approx(float(want_loss), rel=1e-5)
    assert_close(grads, want_grads, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_per_call_results_come_out_per_block_and_microbatch(checkpoint):
    """``n_ys``: the body's batch mean of ``h w`` is returned for every block on every
    microbatch (rows ``mb, mb + 3``), ``[n, microbatches, ...]``; no gradient flows
    through it, and the carry's gradient is the sequential blocks'."""
    mb = GraphBuilder()
    h, w = mb.input((2, 3), name="h"), mb.input((3, 3), name="w")
    z = mb.exec(ops.gemm(), h, w)
    body = mb.build([mb.exec(ops.tanh(), z), mb.exec(ops.reduce_mean(axes=(0,)), z)])
    b = GraphBuilder()
    x, ws = b.input((6, 3), name="x"), b.input((4, 3, 3), name="ws")
    h, means = pipeline(
        b, body, [x], [ws], stages=2, microbatches=3, checkpoint=checkpoint, n_ys=1
    )  # fmt: skip
    assert means.shape == (4, 3, 1, 3)
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), h)
    graph = verify(backward(b.build([loss, means]), loss, [ws])[0])
    assert "ys 1; " in str(graph.nodes[0].cmd)

    def f(x, ws):
        out = []
        for mbatch in range(3):
            rows, per_block = x[mbatch::3], []
            for i in range(4):
                z = rows @ ws[i]
                per_block.append(z.mean(0, keepdims=True))
                rows = jnp.tanh(z)
            out.append(jnp.stack(per_block))
        h = x
        for i in range(4):
            h = jnp.tanh(h @ ws[i])
        return jnp.sum(h, keepdims=True), jnp.stack(out, axis=1)

    rng = np.random.default_rng(4)
    args = [rng.normal(size=(6, 3)).astype(np.float32)]
    args.append(rng.normal(scale=0.5, size=(4, 3, 3)).astype(np.float32))
    want_loss, want_means = f(*args)
    want_grad = jax.grad(lambda w: f(args[0], w)[0].sum())(args[1])
    assert_close(compile(graph)(*args), (want_loss, want_means, want_grad), rtol=1e-5, atol=1e-6)
    assert_close(interpret(graph, *args), (want_loss, want_means, want_grad), rtol=1e-5, atol=1e-6)
    bad = b.exec(ops.reduce_sum(axes=(0, 1, 2, 3)), means)
    wrong = backward(b.build([bad]), bad, [ws])[0]
    with pytest.raises(Exception, match=r"per-call result \(ys\) has a gradient"):
        interpret(wrong, *args)


def test_bad_splits_name_the_node_sizes_and_the_fix():
    b = GraphBuilder()
    x, c = b.input((B, W), name="x"), b.input((W,), name="c")
    stacked = [b.input((4, *s)) for s in PARAM_SHAPES]
    body = _body(B // 2)
    with pytest.raises(ShapeError, match=r"pipeline 'blocks': .*\[4, 4, 4, 4\] blocks.*stages=3"):
        pipeline(b, body, [x], stacked, [c], stages=3, microbatches=2, name="blocks")
    with pytest.raises(
        ShapeError, match=r"pipeline 'blocks': carry 0 is float32\[8, 4\].*microbatches=3"
    ):
        pipeline(b, _body(2), [x], stacked, [c], stages=2, microbatches=3, name="blocks")
    with pytest.raises(ShapeError, match=r"'blocks': .* has 8 rows; build the body for one micro"):
        pipeline(b, _body(B), [x], stacked, [c], stages=2, microbatches=2, name="blocks")
    with pytest.raises(GraphError, match=r"body takes 6 inputs, the call gives 5"):
        pipeline(b, body, [x], stacked, stages=2, microbatches=2)
    with pytest.raises(
        GraphError, match=r"pipeline 'blocks': remat: unknown policy 'no_such_policy'"
    ):
        pipeline(
            b,
            body,
            [x],
            stacked,
            [c],
            stages=2,
            microbatches=2,
            checkpoint="no_such_policy",
            name="blocks",
        )
    with pytest.raises(CommandError, match=r"stacked input 0 is listed in keys but is float32"):
        pipeline(b, body, [x], stacked, [c], stages=2, microbatches=2, keys=(0,))
    with pytest.raises(CommandError, match=r"keys=\(7,\) must be a tuple of positions among"):
        pipeline(b, body, [x], stacked, [c], stages=2, microbatches=2, keys=(7,))


MESH_SCRIPT = textwrap.dedent(
    """
    import jax, numpy as np, optax
    from jax.sharding import PartitionSpec as P
    from fnnc import ops
    from fnnc.errors import ShapeError
    from fnnc.graph import GraphBuilder, Shardings, compile, minimize, pipeline

    assert jax.device_count() == 4, jax.devices()
    B, W, N = 8, 8, 8
    SHAPES = ((2 * W, W), (2 * W,), (W, 2 * W), (W,))

    def step_graph(stages, microbatches):
        body = GraphBuilder()
        h = body.input((B // microbatches, W), name="h")
        w1, b1, w2, b2 = (body.input(s) for s in SHAPES)
        c = body.input((W,), name="c")
        up = body.exec(ops.tanh(), body.exec(ops.gemm(transpose_b=True), h, w1, b1))
        down = body.exec(ops.add(), body.exec(ops.gemm(transpose_b=True), up, w2, b2), c)
        block = body.build([body.exec(ops.ewsum(), h, down)])
        b = GraphBuilder()
        x, y = b.input((B, W), name="x"), b.input((B, W), name="y")
        stacked = [b.input((N, *s), name=f"p{k}") for k, s in enumerate(SHAPES)]
        c = b.input((W,), name="c")
        (h,) = pipeline(b, block, [x], stacked, [c], stages=stages, microbatches=microbatches)
        diff = b.exec(ops.add(q=-1.0), h, y)
        loss = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.ewprod(), diff, diff))
        return minimize(b.build([loss]), loss, [*stacked, c], optax.sgd(5e-4))

    rng = np.random.default_rng(0)
    params = [rng.normal(scale=0.2, size=(N, *s)).astype(np.float32) for s in SHAPES]
    params.append(rng.normal(scale=0.1, size=(W,)).astype(np.float32))
    data = [rng.normal(size=(B, W)).astype(np.float32) for _ in range(2)]

    def train(program, layout, steps=5):
        p, s = list(params), layout.init(params)
        losses = []
        for _ in range(steps):
            p, s, loss = layout.split(program(*p, *s, *data))
            losses.append(np.asarray(loss).item())
        return p, losses

    # one graph, 4 stages of 2 blocks: 2 stages per device on the first mesh, 1 on the other
    step, layout = step_graph(stages=4, microbatches=4)
    want_p, want_losses = train(compile(step), layout)
    for shape, names in (((2, 2), ("stage", "data")), ((4,), ("stage",))):
        mesh = jax.make_mesh(shape, names)
        batch = P("data") if "data" in names else P()
        ins = (P("stage"),) * 4 + (P(),) + (P(),) * layout.n_state + (batch, batch)
        outs = ins[: 5 + layout.n_state] + (P(),)
        program = compile(step, shardings=Shardings(mesh, ins, outs))
        got_p, got_losses = train(program, layout)
        np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)
        assert want_losses[-1] < want_losses[0], want_losses
        for got, want in zip(got_p, want_p):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
        per_device = N // mesh.shape["stage"]  # each device: its stages' blocks only
        for got, full in zip(got_p[:4], params):
            shards = {tuple(s.data.shape) for s in got.addressable_shards}
            assert shards == {(per_device, *full.shape[1:])}, (shards, full.shape)
        hlo = program.compiled_text()
        assert "collective-permute" in hlo, "the stage shift was not lowered to a permute"
        print("OK", names, want_losses[0], want_losses[-1])

    # parameters that arrive replicated are still split by stage: the node's constraints
    # place the stage axis (without them XLA keeps everything replicated, no permute)
    replicated = Shardings(mesh, (P(),) * len(step.inputs))
    assert "collective-permute" in compile(step, shardings=replicated).compiled_text()

    step, layout = step_graph(2, 2)  # 2 stages cannot spread over 4 stage devices
    ins = (P("stage"),) * 4 + (P(),) * (1 + layout.n_state + 2)
    try:
        compile(step, shardings=Shardings(mesh, ins))
        raise AssertionError("no error")
    except ShapeError as e:
        assert "stages=2" in str(e) and "multiple of 4" in str(e), e
    """
)


def test_pipelined_training_on_a_4_device_mesh_equals_one_device():
    """SGD steps of 4 stages on ("stage": 2, "data": 2) and ("stage": 4) meshes match one
    device; each device holds its stages' share of the stacked parameters (1/2, 1/4); the
    HLO has collective permutes (the stage shift), also when parameters come replicated;
    stages that do not spread over the axis are a ShapeError."""
    env = subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=4")
    done = subprocess.run(
        [sys.executable, "-c", MESH_SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.count("OK") == 2, done.stdout
