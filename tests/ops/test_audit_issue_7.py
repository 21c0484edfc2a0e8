"""Audit of issue 7: Pallas kernels for hot commands, backend selection and autotune.

Checks, as the issue states them (float32, interpret mode on CPU, tiny ragged shapes):

- each named kernel (softmax cross-entropy, layer norm, rms norm, attention causal and
  masked, fused elementwise chains from ``fuse``, gemm with a bias + activation epilogue)
  is a ``"pallas"`` backend of an existing command, with a support predicate, a
  reference and a kernel backward;
- forcing the kernel gives the reference's forward and gradient to 1e-5, against
  independent NumPy / ``jax.grad`` oracles, eagerly and in a compiled graph;
- unsupported inputs (dtype, shape) fall back to the reference with no error, while
  forcing the kernel on them raises a clear ``BackendError`` naming the command and why;
- ``fnnc.ops.autotune`` times eligible backends (warm-up, median), records the winner in
  a table keyed by (command, shapes, dtypes, platform) that ``compile`` uses, and the
  table saves and loads;
- ``FNNC_BACKEND`` (global, read from the environment) and per-command forcing;
  ``compile`` reports the backend of each node;
- on CPU, ``compile`` never picks an interpret-mode kernel unless it is forced.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.errors import BackendError, FnncError
from fnnc.graph import GraphBuilder, backward, compile, simplify, trace
from fnnc.ops import pallas
from fnnc.ops.pallas import _rownorm
from fnnc.ops.pallas import gemm as gemm_kernel
from fnnc.ops.pallas import scaled_dot_product_attention as attention_kernel
from fnnc.ops.pallas import softmax_crossentropy as sce_kernel
from tests.helpers import assert_close, rand, subprocess_env

F32 = np.float32
TOL = 1e-5
HERE = jax.default_backend()
KERNEL_COMMANDS = (
    "softmax_crossentropy",
    "layer_norm",
    "rms_norm",
    "scaled_dot_product_attention",
    "fused_elementwise",
    "gemm",
)
spec = jax.ShapeDtypeStruct


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks shrunk so tiny ragged shapes still walk several (masked) blocks."""
    monkeypatch.setattr(sce_kernel, "CLASS_BLOCK", 16)
    monkeypatch.setattr(_rownorm, "LANE_BLOCK", 16)
    monkeypatch.setattr(attention_kernel, "BLOCK_Q", 16)
    monkeypatch.setattr(attention_kernel, "BLOCK_K", 16)
    monkeypatch.setattr(gemm_kernel, "BLOCK_M", 16)
    monkeypatch.setattr(gemm_kernel, "BLOCK_N", 16)
    monkeypatch.setattr(gemm_kernel, "BLOCK_K", 16)


def _forced_value_and_grad(name, fn, args, argnums):
    """``jit(value_and_grad(fn))`` traced with ``name`` forced to the kernel and to the
    reference; asserts only the forced kernel's trace holds a Pallas call (the default
    eager choice on CPU holds none; a GPU's may hold one)."""
    f = jax.value_and_grad(fn, argnums=argnums)
    if jax.default_backend() == "cpu":  # the default on CPU is the reference (a GPU
        assert "pallas_call" not in str(jax.make_jaxpr(f)(*args))  # may choose the kernel)
    out = {}
    for backend in ("pallas", "xla"):
        with config.override(backend_per_command={name: backend}):
            f = jax.value_and_grad(fn, argnums=argnums)
            text = str(jax.make_jaxpr(f)(*args))
            assert ("pallas_call" in text) == (backend == "pallas"), backend
            out[backend] = jax.jit(f)(*args)
    return out["pallas"], out["xla"]


def _check(name, fn, oracle, args, argnums):
    """Forced kernel == forced reference == independent oracle, forward and gradient."""
    got, ref = _forced_value_and_grad(name, fn, args, argnums)
    want = jax.jit(jax.value_and_grad(oracle, argnums=argnums))(*args)
    assert_close(got, ref, TOL, TOL, what=f"{name} pallas vs xla")
    assert_close(got, want, TOL, TOL, what=f"{name} pallas vs oracle")


def _weights(shape, seed=11):
    return jnp.asarray(rand(shape, seed=seed))


# --- each named kernel is a backend of an existing command ----------------------------


@pytest.mark.parametrize("name", KERNEL_COMMANDS)
def test_each_named_kernel_is_a_pallas_backend_of_an_existing_command(name):
    """The command exists, keeps its reference, and has a kernel with predicate + backward."""
    assert ops.lookup(name).name == name
    backends = ops.backends_of(name)
    assert next(iter(backends)) == "xla" and "pallas" in backends
    kernel = backends["pallas"]
    module = getattr(pallas, name)
    assert kernel.supports is module.supports
    assert kernel.backward is not None
    assert callable(getattr(module, f"{name}_reference"))
    assert "cpu" in kernel.interpret_platforms and "cpu" not in kernel.platforms


# --- forced kernels: forward and gradient against independent oracles ------------------


def test_softmax_crossentropy_forced_matches_logsumexp_oracle(small_blocks):
    """A 37-class vocabulary in 16-class blocks: loss and dlogits equal the closed form."""
    x = jnp.asarray(rand((3, 37), seed=1, lo=-4, hi=4))
    labels = jnp.asarray([0, 17, 36], jnp.int32)
    w = _weights((3, 1))

    def fn(x):
        loss, p = ops.softmax_crossentropy()(x, labels)
        return jnp.sum(loss * w) + 0.3 * jnp.sum(p * p)

    def oracle(x):
        loss = jax.nn.logsumexp(x, axis=-1, keepdims=True) - x[jnp.arange(3), labels][:, None]
        p = jax.nn.softmax(x, axis=-1)
        return jnp.sum(loss * w) + 0.3 * jnp.sum(p * p)

    _check("softmax_crossentropy", fn, oracle, (x,), 0)


def _attention_oracle(q, k, v, keep, scale):
    logits = jnp.einsum("bshd,bthd->bhst", q, k) * scale
    logits = jnp.where(keep, logits, -jnp.inf)
    return jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(logits, axis=-1), v)


def test_causal_masked_attention_forced_matches_oracle(small_blocks):
    """Causal flash attention with a boolean [B, 1, S, T] mask over 19 tokens (ragged
    16-blocks) and an explicit scale: output and dq, dk, dv equal the closed form."""
    b, s, h, d = 2, 19, 2, 16
    q, k, v = (jnp.asarray(rand((b, s, h, d), seed=i)) for i in (7, 8, 9))
    mask = np.random.default_rng(13).uniform(size=(b, 1, s, s)) > 0.4
    mask[..., 0] = True  # every query keeps a key
    mask = jnp.asarray(mask)
    keep = mask & np.tril(np.ones((s, s), bool))[None, None]
    w = _weights((b, s, h, d))

    def fn(q, k, v):
        cmd = ops.scaled_dot_product_attention(scale=0.3, is_causal=True)
        return jnp.sum(cmd(q, k, v, mask) * w)

    def oracle(q, k, v):
        return jnp.sum(_attention_oracle(q, k, v, keep, 0.3) * w)

    _check("scaled_dot_product_attention", fn, oracle, (q, k, v), (0, 1, 2))


def _dense_gelu_body():
    b = GraphBuilder()
    x, wt, bias = b.input((5, 19)), b.input((7, 19)), b.input((7,))
    y = b.exec(ops.gemm(transpose_b=True), x, wt, bias)
    return b.build([b.exec(ops.gelu(approximate=True), y)])


def test_gemm_bias_activation_epilogue_is_one_kernel_matching_oracle(small_blocks):
    """``gelu(x @ wᵀ + b)`` as a fused body led by a gemm: one forward Pallas call, and
    forward and gradients equal the closed form."""
    body = _dense_gelu_body()
    cmd = ops.fused_elementwise(body=body)
    args = tuple(jnp.asarray(rand(s.shape, seed=20 + i)) for i, s in enumerate(body.input_specs))
    w = _weights((5, 7))
    with config.override(backend_per_command={"fused_elementwise": "pallas"}):
        forward = str(jax.make_jaxpr(lambda *a: cmd(*a))(*args))
    assert forward.count("pallas_call") == 1

    def fn(x, wt, bias):
        return jnp.sum(cmd(x, wt, bias) * w)

    def oracle(x, wt, bias):
        return jnp.sum(jax.nn.gelu(x @ wt.T + bias[None], approximate=True) * w)

    _check("fused_elementwise", fn, oracle, args, (0, 1, 2))


def test_fused_mish_epilogue_from_fuse_pass_forced_in_compiled_graph():
    """bias + mish becomes one ``fused_elementwise`` node (generated kernel, no mish
    pattern); forcing it in a compiled training graph reports it on the forward and the
    backward node and equals ``jax.value_and_grad``."""

    def f(x, bias):
        z = x + bias[None]
        return jnp.sum(z * jnp.tanh(jax.nn.softplus(z)) * jnp.arange(21.0, dtype=F32)[None])

    args = (rand((3, 21), seed=30, lo=-3, hi=3), rand((21,), seed=31))
    graph = simplify(trace(f, *args))
    fused = [n for n in graph.nodes if n.cmd.name == "fused_elementwise"]
    assert len(fused) == 1
    graph, _ = backward(graph, graph.outputs[0], list(graph.inputs))
    with config.override(backend_per_command={"fused_elementwise": "pallas"}):
        program = compile(graph, platform="cpu")
    chosen = {label: b for _, label, b in program.backends}
    fused_labels = [label for label in chosen if label.startswith("fused_elementwise")]
    assert fused_labels and all(chosen[label] == "pallas" for label in fused_labels)
    assert any(".backward" in label for label in fused_labels)  # the kernel's backward
    want = jax.value_and_grad(f, argnums=(0, 1))(*args)
    got = program(*args)
    assert_close(got[0], want[0], TOL, TOL)
    assert_close(tuple(got[1:]), want[1], TOL, TOL)


# --- compile: reporting, per-command and global forcing ------------------------------


def _dense_norm_graph():
    """gemm + bias -> layer_norm -> rms_norm -> relu -> sum (a scalar for ``backward``)."""
    b = GraphBuilder()
    x, w, c = b.input((4, 19), name="x"), b.input((24, 19), name="w"), b.input((24,), name="c")
    s = b.input((24,), name="s")
    h = b.exec(ops.gemm(transpose_b=True), x, w, c, name="fc")
    h = b.exec(ops.layer_norm(), h, s, name="ln")[0]
    h = b.exec(ops.rms_norm(), h, name="rms")[0]
    h = b.exec(ops.relu(), h, name="act")
    return b, b.exec(ops.reduce_sum(axes=(0, 1)), h, name="total"), (x, w, c, s)


def _dense_norm_args():
    return tuple(rand(shape, seed=40 + i, lo=-1, hi=1) for i, shape in enumerate(
        [(4, 19), (24, 19), (24,), (24,)]))  # fmt: skip


def _dense_norm_oracle(x, w, c, s):
    h = x @ w.T + c[None]
    mu = jnp.mean(h, axis=-1, keepdims=True)
    y = (h - mu) / jnp.sqrt(jnp.mean((h - mu) ** 2, axis=-1, keepdims=True) + 1e-5) * s[None]
    y = y / jnp.sqrt(jnp.mean(y * y, axis=-1, keepdims=True) + 1e-6)
    return jnp.sum(jax.nn.relu(y))


def test_compile_reports_each_nodes_backend_under_per_command_forcing():
    """Forcing rms_norm puts only the rms_norm node on the kernel (reported per node)."""
    b, total, _ = _dense_norm_graph()
    graph = b.build([total])
    with config.override(backend_per_command={"rms_norm": "pallas"}):
        forced = compile(graph, platform="cpu")
    assert forced.backends == (
        (0, "fc", "xla"),
        (1, "ln", "xla"),
        (2, "rms", "pallas"),
        (3, "act", "xla"),
        (4, "total", "xla"),
    )
    want = _dense_norm_oracle(*_dense_norm_args())
    assert_close(forced(*_dense_norm_args()), np.reshape(want, (1, 1)), TOL, TOL)


def test_per_command_reference_beats_global_kernel_preference():
    """``backend="pallas"`` globally, layer_norm forced to ``"xla"``: only it stays put."""
    b, total, _ = _dense_norm_graph()
    graph = b.build([total])
    specs = {n.name: [graph.spec(i) for i in n.inputs] for n in graph.nodes}
    nodes = {n.name: n.cmd for n in graph.nodes}
    with config.override(backend="pallas", backend_per_command={"layer_norm": "xla"}):
        chosen = {k: ops.select_backend(nodes[k], specs[k], "cpu") for k in nodes}
    assert chosen == {"fc": "pallas", "ln": "xla", "rms": "pallas", "act": "xla", "total": "xla"}


def test_forced_kernels_in_a_compiled_training_graph_match_jax_grad(small_blocks):
    """Forcing gemm, layer_norm and rms_norm also runs their gradient nodes on the kernel
    backwards (ragged 19-deep product, 24 features in 16-lane blocks); loss and all four
    gradients equal ``jax.value_and_grad`` of the closed form to 1e-5."""
    b, total, wrt = _dense_norm_graph()
    graph, _ = backward(b.build([total]), total, list(wrt))
    forced = {"gemm": "pallas", "layer_norm": "pallas", "rms_norm": "pallas"}
    with config.override(backend_per_command=forced):
        program = compile(graph, platform="cpu")
    chosen = {label: bk for _, label, bk in program.backends}
    kernels = {"fc", "ln", "rms", "fc.backward", "ln.backward", "rms.backward"}
    assert kernels <= set(chosen)
    assert {label for label, bk in chosen.items() if bk == "pallas"} == kernels
    want = jax.value_and_grad(_dense_norm_oracle, argnums=(0, 1, 2, 3))(*_dense_norm_args())
    got = program(*_dense_norm_args())
    assert_close(got[0], np.reshape(want[0], (1, 1)), TOL, TOL)
    assert_close(tuple(got[1:]), want[1], TOL, TOL)


def _mixed_graph():
    """A supported rms_norm, an attention the kernel declines (head size 8), a relu."""
    b = GraphBuilder()
    x, q = b.input((4, 24), name="x"), b.input((1, 5, 2, 8), name="q")
    y = b.exec(ops.rms_norm(), x, name="rms")[0]
    o = b.exec(ops.scaled_dot_product_attention(is_causal=True), q, q, q, name="attn")
    return b.build([b.exec(ops.relu(), y, name="act"), o])


def _mixed_args():
    return rand((4, 24), seed=50), rand((1, 5, 2, 8), seed=51)


def _attention_numpy(q, causal=True):
    s, d = q.shape[1], q.shape[3]
    logits = np.einsum("bshd,bthd->bhst", q, q) / np.sqrt(d)
    if causal:
        logits = np.where(np.tril(np.ones((s, s), bool)), logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bhst,bthd->bshd", p / p.sum(-1, keepdims=True), q)


def test_global_kernel_preference_falls_back_cleanly_where_declined():
    """Under ``backend="pallas"`` the declined head size 8 quietly runs the reference."""
    graph = _mixed_graph()
    with config.override(backend="pallas"):
        program = compile(graph, platform="cpu")
    assert program.backends == ((0, "rms", "pallas"), (1, "attn", "xla"), (2, "act", "xla"))
    x, q = _mixed_args()
    act, o = program(x, q)
    inv = 1 / np.sqrt(np.mean(x.astype(np.float64) ** 2, -1, keepdims=True) + 1e-6)
    assert_close(act, np.maximum(x * inv, 0), TOL, TOL)
    assert_close(o, _attention_numpy(q.astype(np.float64)), TOL, TOL)


def test_forcing_the_kernel_on_a_declined_shape_names_command_and_reason():
    """Per-command forcing of attention with head size 8 fails at compile, saying why."""
    with (
        config.override(backend_per_command={"scaled_dot_product_attention": "pallas"}),
        pytest.raises(BackendError) as err,
    ):
        compile(_mixed_graph(), platform="cpu")
    message = str(err.value)
    assert "scaled_dot_product_attention" in message
    assert "pallas" in message and "head size" in message and "8" in message


def test_unsupported_dtype_falls_back_quietly_and_forcing_it_says_why():
    """An int32 gemm: exact under the global preference; forced, an error naming gemm."""
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    b = np.arange(20, dtype=np.int32).reshape(4, 5) - 7
    with config.override(backend="pallas"):
        got = ops.gemm()(a, b)
    np.testing.assert_array_equal(np.asarray(got), a @ b)
    with (
        config.override(backend_per_command={"gemm": "pallas"}),
        pytest.raises(BackendError, match=r"gemm.*int32"),
    ):
        ops.gemm()(a, b)


def test_forcing_a_backend_the_command_lacks_names_command_and_choices():
    """relu has no kernel: forcing ``"pallas"`` on it is an error naming relu."""
    b = GraphBuilder()
    x = b.input((3,))
    graph = b.build([b.exec(ops.relu(), x)])
    with (
        config.override(backend_per_command={"relu": "pallas"}),
        pytest.raises(BackendError, match=r"relu.*'pallas'.*\['xla'\]"),
    ):
        compile(graph, platform="cpu")


def test_backend_error_is_an_fnnc_error():
    """The forcing error is part of fnnc's error hierarchy (catchable as FnncError)."""
    assert issubclass(BackendError, FnncError)


# --- on CPU, compile never picks an interpret-mode kernel -----------------------------


def _all_kernel_commands_graph():
    """A training graph using all six kernel commands (and their gradient nodes)."""
    b = GraphBuilder()
    x, w = b.input((4, 32), name="x"), b.input((16, 32), name="w")
    q = b.input((1, 4, 2, 16), name="q")
    labels = b.input((4,), np.int32, name="labels")
    h = b.exec(ops.gemm(transpose_b=True), x, w, name="fc")
    h = b.exec(ops.layer_norm(), h, name="ln")[0]
    h = b.exec(ops.rms_norm(), h, name="rms")[0]
    h = b.exec(ops.swish(), b.exec(ops.tanh(), h))
    loss = b.exec(ops.softmax_crossentropy(), h, labels, name="ce")[0]
    o = b.exec(ops.scaled_dot_product_attention(is_causal=True), q, q, q, name="attn")
    total = b.exec(ops.ewsum(), b.exec(ops.reduce_sum(axes=(0, 1)), loss), b.exec(
        ops.reduce_sum(axes=(0, 1, 2, 3)), o))  # fmt: skip
    forward = simplify(b.build([total]))  # fuses tanh -> swish into one node
    graph, _ = backward(forward, forward.outputs[0], list(forward.inputs[:3]))
    names = [n.cmd.name for n in graph.nodes]
    assert set(names) >= set(KERNEL_COMMANDS) and names.count("gradient") >= 6
    return graph


def test_cpu_compile_never_picks_an_interpret_mode_kernel_even_with_table_entries(clean_table):
    """Every node gets ``"xla"`` on CPU by default, and still after an autotune table
    names ``"pallas"`` for each node's (command, shapes, dtypes, "cpu") key."""
    graph = _all_kernel_commands_graph()
    specs = [[graph.spec(s) for s in node.inputs] for node in graph.nodes]
    assert all(ops.select_backend(n.cmd, sp, "cpu") == "xla" for n, sp in zip(graph.nodes, specs))
    for node, sp in zip(graph.nodes, specs):
        clean_table[ops.autotune.key(node.cmd, sp, "cpu")] = "pallas"
    program = compile(graph, platform="cpu")
    assert len(program.backends) == len(graph.nodes)
    assert all(bk == "xla" for _, _, bk in program.backends)


@pytest.mark.parametrize(
    ("cmd", "shapes"),
    [
        (ops.scaled_dot_product_attention(is_causal=True), [(1, 16, 2, 16)] * 3),
        (ops.rms_norm(), [(4, 32)]),
    ],
    ids=["attention", "rms_norm"],
)
def test_autotune_on_cpu_never_picks_the_interpret_mode_kernel(clean_table, cmd, shapes):
    """Attention's kernel wins by construction on GPU, but autotune on CPU picks xla."""
    arrays = [jnp.asarray(rand(s, seed=i)) for i, s in enumerate(shapes)]
    specs = [spec(s, F32) for s in shapes]
    assert ops.select_backend(cmd, specs, "cpu") == "xla"
    winner = ops.autotune.autotune(cmd, *arrays, repeats=1, platform="cpu")
    assert winner == "xla"
    assert clean_table[ops.autotune.key(cmd, specs, "cpu")] == "xla"


# --- autotune: timing, table keyed by (command, shapes, dtypes, platform), save/load ----


def _slow_abs(x):
    def host(v):
        time.sleep(0.01)
        return np.abs(v)

    return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


@pytest.fixture
def slow_default(clean_table):
    """A slow ewabs backend that compiles here and is the default by priority."""
    ops.register_backend("ewabs", ops.Backend("slow", _slow_abs, (HERE,), priority=5))
    yield clean_table
    ops.unregister_backend("ewabs", "slow")


def _abs_graph(shape=(3, 4), dtype=F32):
    b = GraphBuilder()
    x = b.input(shape, dtype)
    return b.build([b.exec(ops.ewabs(), x, name="abs")])


def test_autotune_times_backends_and_compile_uses_the_faster(slow_default):
    """The measured winner (the reference, not the slow priority backend) drives compile."""
    x = rand((3, 4), lo=-2, hi=2)
    assert compile(_abs_graph()).backends == ((0, "abs", "slow"),)
    winner = ops.autotune.autotune(ops.ewabs(), jnp.asarray(x), repeats=3)
    assert winner == "xla"
    key = ops.autotune.key(ops.ewabs(), [spec((3, 4), F32)], HERE)
    assert slow_default[key] == "xla"
    program = compile(_abs_graph())
    assert program.backends == ((0, "abs", "xla"),)
    assert_close(program(x), np.abs(x), 0, 0)


def test_table_key_is_command_shapes_dtypes_and_platform(slow_default):
    """A winner for one (command, shape, dtype, platform) does not leak to the others."""
    f32 = [spec((3, 4), F32)]
    slow_default[ops.autotune.key(ops.ewabs(), f32, HERE)] = "xla"
    assert ops.select_backend(ops.ewabs(), f32, HERE) == "xla"
    assert ops.select_backend(ops.ewabs(), [spec((4, 3), F32)], HERE) == "slow"  # shape
    assert ops.select_backend(ops.ewabs(), [spec((3, 4), np.float16)], HERE) == "slow"  # dtype
    keys = {
        ops.autotune.key(ops.ewabs(), f32, HERE),
        ops.autotune.key(ops.ewabs(), [spec((4, 3), F32)], HERE),
        ops.autotune.key(ops.ewabs(), [spec((3, 4), np.float16)], HERE),
        ops.autotune.key(ops.ewabs(), f32, "gpu" if HERE != "gpu" else "tpu"),
        ops.autotune.key(ops.relu(), f32, HERE),
    }
    assert len(keys) == 5


def test_autotune_warms_up_then_takes_the_median_of_several_runs():
    """Each candidate runs once to compile, then ``repeats`` timed runs; medians returned."""
    calls = {"a": 0, "b": 0}
    durations = {"a": [0.0, 0.03, 0.0, 0.0, 0.03, 0.03], "b": [0.03, 0.0, 0.01, 0.01, 0.01, 0.0]}

    def make(name):
        def fn(x):
            time.sleep(durations[name][calls[name]])
            calls[name] += 1
            return x

        return fn

    times = ops.autotune.median_seconds({"a": make("a"), "b": make("b")}, jnp.ones(2), repeats=5)
    assert calls == {"a": 6, "b": 6}
    assert set(times) == {"a", "b"}
    # a's timed runs: 0.03, 0, 0, 0.03, 0.03 -> median 0.03; b's: 0, .01, .01, .01, 0 -> .01
    assert 0.025 <= times["a"] < 0.1
    assert 0.008 <= times["b"] < 0.025


def test_saved_table_loads_into_a_fresh_table_and_drives_compile(slow_default, tmp_path):
    """save -> clear -> load restores the winner, which compile then uses again."""
    ops.autotune.autotune(ops.ewabs(), jnp.ones((3, 4)), repeats=3)
    path = tmp_path / "autotune.json"
    ops.autotune.save(path)
    data = json.loads(path.read_text())["entries"]
    (key,) = data
    assert data[key] == "xla"
    assert "ewabs" in key and "float32" in key and "[3, 4]" in key and HERE in key
    slow_default.clear()
    assert compile(_abs_graph()).backends[0][2] == "slow"
    ops.autotune.load(path)
    assert dict(slow_default) == data
    assert compile(_abs_graph()).backends[0][2] == "xla"


def test_loading_a_file_that_is_not_a_table_is_a_clear_error(clean_table, tmp_path):
    """A JSON list is refused, naming the file; the table is left alone."""
    path = tmp_path / "bad.json"
    path.write_text("[1, 2]")
    with pytest.raises(FnncError, match=r"bad\.json"):
        ops.autotune.load(path)
    assert len(clean_table) == 0


def test_fnnc_ops_autotune_itself_times_and_records(slow_default):
    """``fnnc.ops.autotune(cmd, *arrays)`` as the issue names it."""
    import fnnc

    x = jnp.ones((3, 4))
    winner = fnnc.ops.autotune(ops.ewabs(), x, repeats=1)
    assert winner == "xla"
    specs = ops.autotune.as_specs((x,), "x")
    recorded = ops.autotune.key(ops.ewabs(), specs, jax.default_backend())
    assert ops.autotune.TABLE[recorded] == "xla"


# --- FNNC_BACKEND from the environment -------------------------------------------------

CHILD = """
import json, jax, numpy as np
from fnnc import config, ops
from fnnc.graph import GraphBuilder
b = GraphBuilder()
x = b.input((4, 24), name="x")
y = b.exec(ops.rms_norm(), x, name="rms")[0]
graph = b.build([b.exec(ops.relu(), y, name="act")])
specs = lambda node: [graph.spec(s) for s in node.inputs]
q = [jax.ShapeDtypeStruct((1, 16, 2, 8), np.float32)] * 3  # head size 8: declined
print(json.dumps({
    "backend": config.get().backend,
    "cpu": [ops.select_backend(n.cmd, specs(n), "cpu") for n in graph.nodes],
    "declined": ops.select_backend(ops.scaled_dot_product_attention(), q, "cpu"),
}))
"""


def _child(**env):
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=subprocess_env(**env),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_fnnc_backend_environment_variable_forces_globally():
    """``FNNC_BACKEND=pallas`` (read at import) is the global setting: nodes whose kernel
    supports the input choose it even on CPU, others (relu, a declined head size) quietly
    keep the reference."""
    got = _child(FNNC_BACKEND="pallas")
    assert got == {"backend": "pallas", "cpu": ["pallas", "xla"], "declined": "xla"}


def test_global_xla_setting_keeps_even_flash_attention_off_the_gpu_kernel():
    """``backend="xla"`` (what ``FNNC_BACKEND=xla`` sets) beats flash attention's
    by-construction default on a GPU."""
    qkv = [spec((1, 16, 2, 16), jnp.bfloat16)] * 3
    cmd = ops.scaled_dot_product_attention(is_causal=True)
    assert ops.select_backend(cmd, qkv, "gpu") == "pallas"
    with config.override(backend="xla"):
        assert ops.select_backend(cmd, qkv, "gpu") == "xla"
