"""How the Pallas backends are chosen, reported, autotuned, and used end to end."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.errors import BackendError
from fnnc.graph import GraphBuilder, backward, compile, simplify, trace
from fnnc.ops import autotune
from fnnc.ops.autotune import median_seconds
from fnnc.ops.pallas import scaled_dot_product_attention as attention
from tests.helpers import assert_close, rand, randint
from tests.ops.pallas.checks import small_cases

F32 = np.float32
spec = jax.ShapeDtypeStruct


def test_every_backed_command_registers_pallas():
    for name in (
        "softmax_crossentropy",
        "layer_norm",
        "rms_norm",
        "scaled_dot_product_attention",
        "fused_elementwise",
        "gemm",
        "gradient",
    ):
        backend = ops.backends_of(name)["pallas"]
        assert backend.platforms == ("gpu",) and backend.interpret_platforms == ("cpu",)


def test_chosen_on_gpu_by_measurement_or_construction_never_on_cpu(clean_table):
    cmd, specs = ops.layer_norm(), [spec((8, 64), F32)]
    assert ops.select_backend(cmd, specs, "gpu") == "xla"  # unmeasured: XLA
    clean_table[autotune.key(cmd, specs, "gpu")] = "pallas"  # measured faster
    assert ops.select_backend(cmd, specs, "gpu") == "pallas"
    assert ops.select_backend(cmd, specs, "tpu") == "xla"  # not verified on TPU yet
    assert ops.select_backend(cmd, specs, "cpu") == "xla"
    assert ops.select_backend(cmd, [spec((8, 64), np.float64)], "gpu") == "xla"  # fallback
    sdpa = ops.scaled_dot_product_attention()
    qkv = [spec((2, 16, 2, 16), jnp.bfloat16)] * 3  # flash attention wins by construction
    assert ops.select_backend(sdpa, qkv, "gpu") == "pallas"
    # ... where its products run on tensor cores: not float32 at full float32 precision
    f32 = [spec((2, 16, 2, 16), F32)] * 3
    assert ops.select_backend(sdpa, f32, "gpu") == "xla"
    with config.override(matmul_precision="tensorfloat32"):
        assert ops.select_backend(sdpa, f32, "gpu") == "pallas"
    clean_table[autotune.key(sdpa, f32, "gpu")] = "pallas"  # or measured faster
    assert ops.select_backend(sdpa, f32, "gpu") == "pallas"


def test_compile_on_cpu_never_picks_an_interpret_mode_kernel():
    b = GraphBuilder()
    x, w = b.input((16, 32), name="x"), b.input((64, 32), name="w")
    h = b.exec(ops.gemm(transpose_b=True), x, w, name="fc")
    y = b.exec(ops.rms_norm(), h, name="norm")[0]
    program = compile(b.build([y]), platform="cpu")
    assert program.backends == ((0, "fc", "xla"), (1, "norm", "xla"))
    with config.override(backend="pallas"):
        forced = compile(b.build([y]), platform="cpu")
    assert forced.backends == ((0, "fc", "pallas"), (1, "norm", "pallas"))
    xs = (rand((16, 32)), rand((64, 32), seed=1))
    assert_close(forced(*xs), program(*xs))


def test_an_autotune_entry_never_makes_cpu_interpret(clean_table):
    cmd, specs = ops.rms_norm(), [spec((8, 64), F32)]
    clean_table[autotune.key(cmd, specs, "cpu")] = "pallas"
    assert ops.select_backend(cmd, specs, "cpu") == "xla"
    clean_table[autotune.key(cmd, specs, "gpu")] = "xla"  # a measured loss beats priority
    assert ops.select_backend(cmd, specs, "gpu") == "xla"


def test_autotune_times_only_compiled_backends_here(clean_table, monkeypatch):
    here = jax.default_backend()
    timed = []

    def spy(fns, *args, **kwargs):
        timed.extend(fns)
        return median_seconds(fns, *args, **kwargs)

    monkeypatch.setattr(autotune, "median_seconds", spy)
    winner = autotune.autotune(ops.rms_norm(), jax.numpy.ones((8, 64)), repeats=1)
    # Pallas compiles on GPU only; on CPU it would interpret, so it is never timed there.
    assert timed == (["xla", "pallas"] if here == "gpu" else ["xla"])
    assert winner in timed and list(clean_table.values()) == [winner]


def test_table_with_pallas_entries_round_trips(clean_table, tmp_path):
    cmd, specs = ops.layer_norm(), [spec((8, 64), F32)]
    gpu_key, cpu_key = autotune.key(cmd, specs, "gpu"), autotune.key(cmd, specs, "cpu")
    clean_table.update({gpu_key: "pallas", cpu_key: "xla"})
    path = tmp_path / "table.json"
    autotune.save(path)
    clean_table.clear()
    autotune.load(path)
    assert clean_table == {gpu_key: "pallas", cpu_key: "xla"}
    assert ops.select_backend(cmd, specs, "gpu") == "pallas"
    clean_table[gpu_key] = "xla"
    assert ops.select_backend(cmd, specs, "gpu") == "xla"


def test_global_force_falls_back_where_unsupported_per_command_force_raises():
    cmd, ragged = ops.rms_norm(), [spec((8, 20), np.float64)]  # a dtype no kernel takes
    with config.override(backend="pallas"):
        assert ops.select_backend(cmd, ragged, "cpu") == "xla"
        assert ops.select_backend(ops.ewexp(), ragged, "cpu") == "xla"
    with (
        config.override(backend_per_command={"rms_norm": "pallas"}),
        pytest.raises(BackendError, match=r"rms_norm.*float64"),
    ):
        ops.select_backend(cmd, ragged, "cpu")


def _transformer_block():
    """Pre-norm attention + MLP block, a cross-entropy head, and its backward graph."""
    bsz, s, e, h, f, v = 2, 32, 32, 2, 64, 64
    b = GraphBuilder()
    x, labels = b.input((bsz, s, e), name="x"), b.input((bsz, s), np.int32, name="labels")
    shapes = dict(
        s1=(e,),
        c1=(e,),
        wq=(e, e),
        wk=(e, e),
        wv=(e, e),
        wo=(e, e),
        s2=(e,),
        w1=(f, e),
        b1=(f,),
        w2=(e, f),
        b2=(e,),
        wh=(v, e),
    )
    p = {k: b.input(shape, name=k) for k, shape in shapes.items()}
    dense = lambda t, w, *bias: b.exec(ops.gemm(transpose_b=True), t, p[w], *bias)
    heads = lambda t: b.exec(ops.reshape(shape=(bsz, s, h, e // h)), t)
    t = b.exec(ops.layer_norm(), x, p["s1"], p["c1"])[0]
    q, k, vv = (heads(dense(t, w)) for w in ("wq", "wk", "wv"))
    a = b.exec(ops.scaled_dot_product_attention(is_causal=True), q, k, vv)
    x2 = b.exec(ops.add(), x, dense(b.exec(ops.reshape(shape=(bsz, s, e)), a), "wo"))
    t = b.exec(ops.rms_norm(), x2, p["s2"])[0]
    t = b.exec(ops.gelu(approximate=True), b.exec(ops.add(), dense(t, "w1"), p["b1"]))
    x3 = b.exec(ops.ewsum(), x2, dense(t, "w2", p["b2"]))
    loss, _ = b.exec(ops.softmax_crossentropy(), dense(x3, "wh"), labels)
    total = b.exec(ops.reduce_mean(axes=(0, 1, 2)), loss)
    graph, _ = backward(b.build([total]), total, [x, *p.values()])
    args = [rand((bsz, s, e)), randint((bsz, s), v, seed=1)]
    args += [rand(shape, seed=i + 2, lo=-0.5, hi=0.5) for i, shape in enumerate(shapes.values())]
    return simplify(graph), args


def _reference(graph):
    """``graph`` compiled on the reference backends (a GPU would pick kernels by default)."""
    with config.override(backend="xla"):
        return compile(graph)


def test_forced_pallas_training_graph_matches_reference(monkeypatch):
    monkeypatch.setattr(attention, "BLOCK_Q", 16)
    monkeypatch.setattr(attention, "BLOCK_K", 16)
    graph, args = _transformer_block()
    reference = _reference(graph)
    with config.override(backend="pallas"):
        program = compile(graph)
    kernels = {label for _, label, b in program.backends if b == "pallas"}
    for name in (
        "layer_norm",
        "rms_norm",
        "scaled_dot_product_attention[is_causal=True]",
        "gemm[transpose_b=True]",
        "softmax_crossentropy",
        "layer_norm.backward[wants=(0,1,2)]",
        "softmax_crossentropy.backward[wants=(0,)]",
        "scaled_dot_product_attention[is_causal=True].backward[wants=(0,1,2)]",
    ):
        assert name in kernels, name
    assert all(b == "xla" for _, _, b in reference.backends)
    assert_close(program(*args), reference(*args), rtol=1e-5, atol=1e-5)


def _mlp(x, w1, b1, w2, b2):
    hidden = jax.nn.gelu(x @ w1.T + b1[None, None], approximate=True)
    return x + jax.nn.sigmoid(hidden @ w2.T + b2[None, None]) * 0.5


def test_forced_pallas_traced_graph_matches_reference():
    shapes = [(2, 16, 32), (64, 32), (64,), (32, 64), (32,)]
    args = [rand(s, seed=i, lo=-0.5, hi=0.5) for i, s in enumerate(shapes)]
    graph = simplify(trace(_mlp, *args))
    reference = _reference(graph)
    with config.override(backend="pallas"):
        program = compile(graph)
    chosen = [(label.split("[")[0], b) for _, label, b in program.backends if b == "pallas"]
    assert chosen.count(("gemm", "pallas")) == 2
    assert chosen.count(("fused_elementwise", "pallas")) == 2
    assert_close(program(*args), reference(*args), rtol=1e-5, atol=1e-5)


def test_gradient_nodes_of_a_fused_chain_run_the_generated_backward():
    b = GraphBuilder()
    x, bias = b.input((8, 32), name="x"), b.input((32,), name="bias")
    y = b.exec(ops.tanh(), b.exec(ops.swish(), b.exec(ops.add(), x, bias)))
    total = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.ewprod(), y, y))
    graph = simplify(b.build([total]))
    assert any(n.cmd.name == "fused_elementwise" for n in graph.nodes)
    graph, _ = backward(graph, graph.outputs[0], list(graph.inputs))
    with config.override(backend="pallas"):
        program = compile(graph)
    labels = [label for _, label, b in program.backends if b == "pallas"]
    assert "fused_elementwise[add, swish, tanh, ewprod].backward[wants=(0,1)]" in labels
    args = (rand((8, 32)), rand((32,), seed=1))
    assert_close(program(*args), _reference(graph)(*args))


@pytest.mark.parametrize("dtype", [jax.numpy.bfloat16, np.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("name", list(small_cases(F32)))
def test_16_bit_inputs_match_the_reference_to_their_precision(name, dtype):
    cmd, shapes = small_cases(dtype)[name]
    rng = np.random.default_rng(0)
    args = []
    for shape, d in shapes:
        if np.dtype(d) == np.bool_:
            args.append(rng.uniform(size=shape) > 0.3)
        elif np.dtype(d) == np.int32:
            args.append(rng.integers(0, 1001, shape).astype(np.int32))
        else:
            args.append(jax.numpy.asarray(rng.uniform(-1, 1, shape), d))
    with config.override(backend_per_command={cmd.name: "pallas"}):
        got = cmd(*args)
    want = ops.backends_of(cmd.name)["xla"].forward(*args, **cmd.kwargs)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.dtype == w.dtype
        scale = float(jax.numpy.max(jax.numpy.abs(w.astype(F32)))) + 1e-3
        assert_close(g.astype(F32), w.astype(F32), rtol=2e-2, atol=2e-2 * scale)


def test_gradient_backend_supports_only_kernel_backwards(clean_table):
    from fnnc.ops.autodiff import gradient_command

    x = spec((8, 64), F32)
    stat = spec((8, 1), F32)
    ln = gradient_command(ops.layer_norm(), (x,), (x, stat, stat), (True, False, False), (0,))
    relu = gradient_command(ops.relu(), (x,), (x,), (True,), (0,))
    assert ops.select_backend(ln, [x, x, stat, stat], "gpu") == "xla"  # layer_norm: unmeasured
    clean_table[autotune.key(ln, [x, x, stat, stat], "gpu")] = "pallas"
    assert ops.select_backend(ln, [x, x, stat, stat], "gpu") == "pallas"
    q = spec((2, 16, 2, 16), jnp.bfloat16)
    sdpa = gradient_command(
        ops.scaled_dot_product_attention(), (q, q, q), (q,), (True, True, True), (0, 1, 2)
    )
    assert ops.select_backend(sdpa, [q, q, q, q, q], "gpu") == "pallas"  # the forward's priority
    q = spec((2, 16, 2, 16), F32)  # ... and the forward's inputs decide where it holds
    sdpa = gradient_command(
        ops.scaled_dot_product_attention(), (q, q, q), (q,), (True, True, True), (0, 1, 2)
    )
    assert ops.select_backend(sdpa, [q, q, q, q, q], "gpu") == "xla"
    assert ops.select_backend(relu, [x, x], "gpu") == "xla"
    with (
        config.override(backend_per_command={"gradient": "pallas"}),
        pytest.raises(BackendError, match=r"relu has no 'pallas' backward"),
    ):
        ops.select_backend(relu, [x, x], "cpu")
