"""The CPU convolution backends (``fnnc.ops.conv_cpu``): choice, autotuning, ``wants``.

Their values (forward and backward against the reference over strides, dilations,
groups, padding modes and odd sizes, float32 and float64) are checked by the registry
sweep over the convolution cases, ``tests/ops/test_backend_sweep.py``. Here: every
backward honours ``wants``; the default choice on CPU and the autotune table pick them
where intended; whole-graph autotuning (``fnnc.graph.autotune``) changes no output.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import config, ops
from fnnc.errors import BackendError
from fnnc.graph import GraphBuilder, backward, compile, cpu_libraries, interpret, minimize
from fnnc.graph.autotune import autotune_graph
from fnnc.ops import autotune, conv_cpu
from tests.helpers import assert_close, exact_on_cpu, rand
from tests.ops import cases_conv

spec = jax.ShapeDtypeStruct
HERE = jax.default_backend()  # the backends below compile on CPU only
BACKENDS = {
    name: (conv_cpu.BY_NAME[name].forward, conv_cpu.backward_of(name))
    for name in ("mixed", "dilated", "chunked", "im2col")
}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_backward_gives_only_what_is_wanted(backend):
    xs = (rand((3, 5, 5, 3)), rand((4, 3, 3, 3), seed=1), rand((4,), seed=2))
    params = dict(strides=1, padding="SAME", dilation=1, groups=1)
    g = jnp.ones((3, 5, 5, 4), jnp.float32)
    rule = BACKENDS[backend][1]
    got = rule((g,), xs, (None,), (1,), **params)
    assert got[0] is None and got[2] is None and got[1].shape == xs[1].shape


COMMON = (spec((64, 14, 14, 32), jnp.float32), spec((64, 3, 3, 32), jnp.float32))


def test_mixed_plan_covers_every_rule():
    plan = conv_cpu.mixed_plan
    x, w = spec((3, 5, 5, 32), jnp.float32), spec((32, 3, 3, 32), jnp.float32)
    assert plan(x, w, (1, 1), (5, 5)) == conv_cpu.Plan("dilated", "dilated", "dilated")
    assert plan(x, w, (2, 2), (3, 3)).data_grad == "gemm"
    thin = spec((9, 32, 32, 8), jnp.float32), spec((8, 3, 3, 8), jnp.float32)
    assert plan(*thin, (1, 1), (32, 32)) == conv_cpu.Plan("reference", "reference", "chunked")
    one = spec((32, 1, 1, 32), jnp.float32)
    assert plan(x, one, (2, 2), (3, 3)) == conv_cpu.Plan("gemm", "gemm", "gemm")
    assert set(conv_cpu.FORWARD) >= {p.forward for p in [plan(x, w, (1, 1), (5, 5))]}


def test_the_sweep_reaches_every_mixed_rule():
    """The convolution cases the ``mixed`` backend takes (tests/ops/cases_conv.py) run
    each formulation its rules pick, so the backend sweep checks every one."""
    used: dict[str, set[str]] = {"forward": set(), "data_grad": set(), "weight_grad": set()}
    for case in cases_conv.CASES:
        specs = [spec(np.shape(x), np.float32) for x in case.inputs]
        if case.cmd.name != "convolution" or conv_cpu.supports_mixed(case.cmd, specs):
            continue
        s, _, _, out = conv_cpu._geometry(specs[0], specs[1], case.cmd.kwargs)
        plan = conv_cpu.mixed_plan(specs[0], specs[1], s, out)
        for product in used:
            used[product].add(getattr(plan, product))
    assert used == {
        "forward": {"reference", "dilated", "gemm"},
        "data_grad": {"reference", "dilated", "gemm"},
        "weight_grad": {"dilated", "chunked", "gemm"},
    }


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


def test_chunked_on_one_sample_says_it_has_no_batch_axis():
    """Axis 0 of an unbatched [H, W, C] sample is spatial: "batch 5 <= 8" misread it."""
    x, w = spec((5, 5, 2), jnp.float32), spec((3, 3, 3, 2), jnp.float32)
    want = "one sample without a batch axis: the reference adds it"
    assert conv_cpu.supports_chunked(ops.convolution(), (x, w)) == want
    big = spec((40, 5, 2), jnp.float32)  # axis 0 past one chunk: still no batch
    assert conv_cpu.supports_chunked(ops.convolution(), (big, w)) == want


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
    assert clean_table[autotune.key(cmd, (spec(x.shape, x.dtype), spec(w.shape, w.dtype)), HERE)]
    assert ops.select_backend(cmd, (spec(x.shape, x.dtype), spec(w.shape, w.dtype))) == winner


def test_training_graph_runs_the_backward_of_the_chosen_backend():
    graph = _conv_graph(with_backward=True)
    program = compile(graph)
    chosen = {label: b for _, label, b in program.backends}
    grads = [b for _, label, b in program.backends if "backward" in label and "conv" in label]
    if HERE != "cpu":  # elsewhere the reference runs, and forcing a CPU backend says why
        assert chosen["conv"] == "xla" and grads == ["xla"], program.backends
        with (
            config.override(backend_per_command={"convolution": "im2col"}),
            pytest.raises(BackendError, match=f"'im2col' does not run on {HERE}"),
        ):
            compile(graph)
        return
    assert chosen["conv"] == "mixed"
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
    nodes = [k for k in clean_table if not k.startswith("program|")]
    assert len(nodes) == len(winners)
    if HERE == "cpu":
        assert {step.nodes[i].cmd.name for i in winners} == {"convolution", "gradient"}, winners
        assert set(winners.values()) <= {"xla", *BACKENDS}
        assert clean_table[cpu_libraries.program_key(step, "cpu")] in cpu_libraries.LIBRARY_SETS
    else:  # no node of this graph has a second backend there, and library sets are CPU's
        assert winners == {} and not clean_table, (winners, dict(clean_table))
    assert_close(interpret(step, *feed), before_interpret, *exact_on_cpu(1e-5, 1e-5))
    assert_close(compile(step)(*feed), before_compiled, 1e-4, 1e-4)
