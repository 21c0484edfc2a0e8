"""The CPU convolution backends (``fnnc.ops.conv_cpu``): values, choice, autotuning.

Every backend's forward and backward equal the reference convolution's (float32) over
strides, dilations, groups, padding modes and odd sizes, pass a float64 finite-difference
check, and honour ``wants``; the default choice on CPU and the autotune table pick them
where intended; whole-graph autotuning (``fnnc.graph.autotune``) changes no output.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import config, ops
from fnnc.graph import GraphBuilder, backward, compile, interpret, minimize
from fnnc.graph.autotune import autotune_graph
from fnnc.ops import autotune, conv_cpu
from tests.helpers import assert_close, rand

spec = jax.ShapeDtypeStruct
BACKENDS = {
    name: (conv_cpu.BY_NAME[name].forward, conv_cpu.backward_of(name))
    for name in ("mixed", "dilated", "chunked", "im2col")
}

# (x shape, weight shape, bias?, hyper-parameters): tiny, odd sizes, every option.
CASES = {
    "same": ((3, 5, 5, 3), (4, 3, 3, 3), True, dict(padding="SAME")),
    "same-s2-odd": ((1, 7, 6, 2), (3, 3, 3, 2), False, dict(strides=2, padding="SAME")),
    "valid-s2x1": ((3, 6, 7, 3), (2, 3, 2, 3), True, dict(strides=(2, 1), padding="VALID")),
    "explicit-dilated": (
        (1, 6, 5, 2),
        (2, 2, 2, 2),
        False,
        dict(dilation=(2, 1), padding=((1, 2), (0, 1))),
    ),
    "groups": ((1, 5, 5, 4), (6, 3, 3, 2), True, dict(strides=(1, 2), padding=1, groups=2)),
    "depthwise": ((2, 5, 4, 3), (3, 3, 3, 1), False, dict(padding="SAME", groups=3)),
    "kernel-5-s3": ((1, 9, 8, 2), (3, 5, 5, 2), False, dict(strides=3, padding=(2, 1))),
    "1x1-s2": ((2, 5, 5, 3), (4, 1, 1, 3), True, dict(strides=2)),
    "conv1d": ((2, 7, 3), (4, 3, 3), True, dict(strides=(2,), padding=((1, 1),))),
    "conv3d": ((1, 3, 4, 3, 2), (2, 2, 2, 2, 2), False, dict(padding="VALID")),
    # Wide enough for every branch of the "mixed" rules (with one-image chunks).
    "wide": ((2, 4, 5, 32), (32, 3, 3, 32), True, dict(padding="SAME")),
    "wide-s2": ((2, 5, 5, 32), (40, 3, 3, 32), False, dict(strides=2, padding="SAME")),
    "big-map": ((2, 32, 32, 8), (4, 3, 3, 8), False, dict(padding="SAME")),
}
# "mixed" is offered for 2-D ungrouped convolutions only.
MIXED_CASES = [c for c, (xs, _, _, p) in CASES.items() if len(xs) == 4 and p.get("groups", 1) == 1]
PAIRS = [(b, c) for b in BACKENDS for c in CASES if b != "mixed" or c in MIXED_CASES]


def _params(p):
    return {**dict(strides=1, padding=0, dilation=1, groups=1), **p}


def _inputs(case, dtype=np.float32):
    xs, ws, bias, _ = CASES[case]
    arrays = [rand(xs, dtype), rand(ws, dtype, seed=1)]
    if bias:
        arrays.append(rand(ws[:1], dtype, seed=2))
    return tuple(jnp.asarray(a) for a in arrays)


@functools.cache
def _jitted(backend, case):
    """``(g, *inputs) -> (forward, gradients of every input)`` of one backend, jitted once
    (the reference for ``"xla"``); ``g`` is the output gradient."""
    params = _params(CASES[case][3])
    if backend == "xla":
        opdef = ops.convolution.definition
        forward = functools.partial(opdef.forward, **params)

        def rule(g, xs):
            return opdef.backward((g,), xs, (None,), **params)

    else:
        fwd, bwd = BACKENDS[backend]
        forward = functools.partial(fwd, **params)

        def rule(g, xs):
            return bwd((g,), xs, (None,), tuple(range(len(xs))), **params)

    return jax.jit(lambda g, *xs: (forward(*xs), rule(g, xs)))


@pytest.fixture(autouse=True)
def _one_image_chunks(monkeypatch):
    """Chunks of one image, so the tiny batches here still split into several chunks."""
    monkeypatch.setattr(conv_cpu.forms, "CHUNK", 1)


@pytest.mark.parametrize("backend, case", PAIRS)
def test_forward_and_backward_match_the_reference(backend, case):
    xs = _inputs(case)
    p = CASES[case][3]
    out = ops.convolution(**p).shape(*(spec(x.shape, x.dtype) for x in xs))[0].shape
    g = jnp.asarray(rand(out, seed=3))
    assert_close(_jitted(backend, case)(g, *xs), _jitted("xla", case)(g, *xs), 1e-5, 1e-5)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_backward_gives_only_what_is_wanted(backend):
    xs = _inputs("same")
    params = _params(CASES["same"][3])
    g = jnp.ones((3, 5, 5, 4), jnp.float32)
    rule = BACKENDS[backend][1]
    got = rule((g,), xs, (None,), (1,), **params)
    assert got[0] is None and got[2] is None and got[1].shape == xs[1].shape


@pytest.mark.parametrize(
    "backend, case", [("im2col", "groups"), ("dilated", "same-s2-odd"), ("mixed", "wide-s2")]
)
def test_backward_finite_differences_float64(backend, case):
    forward, rule = BACKENDS[backend]
    params = _params(CASES[case][3])
    with jax.enable_x64(True):
        xs = _inputs(case, np.float64)
        f = jax.jit(lambda *xs: jnp.sum(g * forward(*xs, **params)))
        out = jax.eval_shape(functools.partial(forward, **params), *xs).shape
        g = jnp.asarray(rand(out, np.float64, seed=4))
        wants = tuple(range(len(xs)))
        grads = jax.jit(lambda g, *xs: rule((g,), xs, (None,), wants, **params))(g, *xs)
        dirs = [jnp.asarray(rand(x.shape, np.float64, seed=5 + i)) for i, x in enumerate(xs)]
        eps = 1e-6

        def objective(sign):
            return float(f(*(x + sign * eps * d for x, d in zip(xs, dirs))))

        numeric = (objective(1.0) - objective(-1.0)) / (2 * eps)
        analytic = sum(float(jnp.sum(gr * d)) for gr, d in zip(grads, dirs))
        assert np.isclose(analytic, numeric, rtol=1e-6, atol=1e-8), (analytic, numeric)


COMMON = (spec((64, 14, 14, 32), jnp.float32), spec((64, 3, 3, 32), jnp.float32))


def test_mixed_plan_covers_every_rule():
    plan = conv_cpu.mixed_plan
    x, w = spec((3, 5, 5, 32), jnp.float32), spec((32, 3, 3, 32), jnp.float32)
    assert plan(x, w, (1, 1), (5, 5)) == conv_cpu.Plan("dilated", "dilated", "dilated")
    assert plan(x, w, (2, 2), (3, 3)).data_grad == "gemm"
    thin = spec((3, 32, 32, 8), jnp.float32), spec((8, 3, 3, 8), jnp.float32)
    assert plan(*thin, (1, 1), (32, 32)) == conv_cpu.Plan("reference", "reference", "chunked")
    assert set(conv_cpu.FORWARD) >= {p.forward for p in [plan(x, w, (1, 1), (5, 5))]}


def test_default_choice_on_cpu(monkeypatch):
    monkeypatch.setattr(conv_cpu.forms, "CHUNK", 8)
    same = ops.convolution(padding="SAME")
    assert ops.select_backend(same, COMMON, "cpu") == "mixed"
    stride2 = ops.convolution(strides=2, padding="SAME")
    x, w = spec((32, 32, 32, 16), jnp.float32), spec((32, 3, 3, 16), jnp.float32)
    assert ops.select_backend(stride2, (x, w), "cpu") == "mixed"
    one = (spec((128, 28, 28, 1), jnp.float32), spec((32, 3, 3, 1), jnp.float32))
    assert ops.select_backend(same, one, "cpu") == "mixed"
    # The single-formulation backends run only when tuned or forced; grouped and 1-D/3-D
    # convolutions, half precision and other platforms stay with XLA.
    assert all(conv_cpu.BY_NAME[n].supports(same, COMMON) is None for n in BACKENDS)
    grouped = ops.convolution(padding="SAME", groups=32)
    depthwise = (COMMON[0], spec((32, 3, 3, 1), jnp.float32))
    assert ops.select_backend(grouped, depthwise, "cpu") == "xla"
    conv1d = (spec((64, 30, 16), jnp.float32), spec((16, 3, 16), jnp.float32))
    assert ops.select_backend(ops.convolution(), conv1d, "cpu") == "xla"
    half = tuple(spec(s.shape, jnp.bfloat16) for s in COMMON)
    assert "bfloat16" in conv_cpu.supports_mixed(same, half)
    assert ops.select_backend(same, half, "cpu") == "xla"
    assert ops.select_backend(same, COMMON, "gpu") == "xla"
    small = (spec((8, 14, 14, 32), jnp.float32), COMMON[1])
    assert "one chunk" in conv_cpu.supports_chunked(same, small)


def test_registered_for_convolution_only_on_cpu():
    backends = ops.backends_of("convolution")
    for name in BACKENDS:
        assert backends[name].platforms == ("cpu",)
        assert backends[name].interpret_platforms == ()


def _conv_graph(with_backward):
    """x [32, 12, 12, 4] -> conv3x3(8, SAME) -> relu -> sum."""
    b = GraphBuilder()
    x = b.input((32, 12, 12, 4), name="x")
    w = b.input((8, 3, 3, 4), name="w")
    y = b.exec(ops.convolution(padding="SAME"), x, w, name="conv")
    loss = b.exec(ops.reduce_sum(axes=(0, 1, 2, 3)), b.exec(ops.relu(), y))
    graph = b.build([loss])
    if not with_backward:
        return graph
    wrt = [graph.symbol(i) for i in graph.inputs]
    grad_graph, _ = backward(graph, graph.outputs[0], wrt)
    return grad_graph


def test_autotune_records_a_winner(clean_table):
    x, w = jnp.asarray(rand((32, 12, 12, 4))), jnp.asarray(rand((8, 3, 3, 4), seed=1))
    cmd = ops.convolution(padding="SAME")
    winner = autotune.autotune(cmd, x, w, repeats=1)
    assert winner in ("xla", *BACKENDS)
    assert clean_table[autotune.key(cmd, (spec(x.shape, x.dtype), spec(w.shape, w.dtype)), "cpu")]
    assert ops.select_backend(cmd, (spec(x.shape, x.dtype), spec(w.shape, w.dtype))) == winner


def test_training_graph_runs_the_backward_of_the_chosen_backend():
    graph = _conv_graph(with_backward=True)
    program = compile(graph)
    chosen = {label: b for _, label, b in program.backends}
    assert chosen["conv"] == "mixed"
    grads = [b for _, label, b in program.backends if "backward" in label and "conv" in label]
    assert grads == ["mixed"], program.backends
    args = (rand((32, 12, 12, 4)), rand((8, 3, 3, 4), seed=1))
    assert_close(program(*args), interpret(graph, *args), 1e-4, 1e-4)
    with config.override(backend_per_command={"convolution": "im2col"}):
        forced = compile(graph)
        assert {b for _, label, b in forced.backends if "conv" in label} == {"im2col"}
        assert_close(forced(*args), interpret(graph, *args), 1e-4, 1e-4)


def test_autotune_graph_changes_no_output(clean_table):
    graph = _conv_graph(with_backward=False)
    step, layout = minimize(
        graph, graph.outputs[0], [graph.symbol(graph.inputs[1])], optax.sgd(0.1)
    )
    x, w = rand((32, 12, 12, 4)), rand((8, 3, 3, 4), seed=1)
    names = [step.symbol(i).name for i in step.inputs]
    feed = [{"x": x, "w": w}.get(n) for n in names]
    state = iter(layout.init([w]))
    feed = [next(state) if f is None else f for f in feed]
    before_interpret, before_compiled = interpret(step, *feed), compile(step)(*feed)
    winners = autotune_graph(step, *feed, repeats=1)
    assert {step.nodes[i].cmd.name for i in winners} == {"convolution", "gradient"}, winners
    assert set(winners.values()) <= {"xla", *BACKENDS}
    assert len(clean_table) == len(winners)
    assert_close(interpret(step, *feed), before_interpret, 0, 0)
    assert_close(compile(step)(*feed), before_compiled, 1e-4, 1e-4)
