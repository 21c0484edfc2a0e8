"""Audit 10 of the Pallas kernels (interpret mode on CPU), each against an independent oracle."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.errors import ConfigError
from fnnc.graph import GraphBuilder, compile
from fnnc.ops.pallas import layer_norm as layer_norm_kernel
from fnnc.ops.pallas import softmax_crossentropy as sce_kernel


def _layer_norm_grads64(x, scale, gy, epsilon=1e-5):
    """dx and d scale of layer_norm in float64 NumPy, on the (rounded) inputs given."""
    x, scale, gy = (np.asarray(a, np.float64) for a in (x, scale, gy))
    mu = x.mean(1, keepdims=True)
    inv = 1 / np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + epsilon)
    xhat, g = (x - mu) * inv, gy * scale
    dx = inv * (g - g.mean(1, keepdims=True) - xhat * (g * xhat).mean(1, keepdims=True))
    return dx, (gy * xhat).sum(0)


def test_16_bit_layer_norm_kernel_backward_does_not_read_rounded_statistics():
    """A mean of 100 rounded to bfloat16 (the saved statistic) is off by up to 0.25: the
    kernel's backward read it, and its scale gradient was 11% off in bfloat16 (1.6% in
    float16). Both its vjp and its NNC backward now recompute the statistics from x."""
    rng = np.random.default_rng(0)
    x, scale, bias, gy = (
        jnp.asarray(a, jnp.bfloat16)
        for a in (
            100 + rng.normal(size=(4, 48)),
            rng.uniform(0.5, 1.5, 48),
            rng.normal(size=48),
            rng.normal(size=(4, 48)),
        )
    )
    want_dx, want_ds = _layer_norm_grads64(x, scale, gy)

    @jax.jit
    def both(x, scale, bias, gy):
        outs, pull = jax.vjp(layer_norm_kernel.layer_norm, x, scale, bias)
        vjp = pull((gy, jnp.zeros_like(outs[1]), jnp.zeros_like(outs[2])))
        nnc = layer_norm_kernel.backward(
            (gy, None, None), (x, scale, bias), outs, (0, 1, 2), axes=(-1,), epsilon=1e-5
        )
        return vjp, nnc

    rel = lambda a, w: np.max(np.abs(np.asarray(a, np.float64) - w)) / np.max(np.abs(w))
    for dx, ds, _ in both(x, scale, bias, gy):
        # a few roundings of the 16-bit results (the reference's own error is 1.8e-3, 1.3e-3)
        assert rel(dx, want_dx) < 4e-3
        assert rel(ds, want_ds) < 4e-3


def test_float32_targets_of_16_bit_scores_are_not_rounded():
    """The reference reads float targets in its float32 arithmetic; the kernel rounded
    them to the scores' 16-bit type (1/3 became 0.33398 in bfloat16), so the loss of
    [256, 0, 0] against thirds was 170 (170.5 rounded) where float64 gives 170.67 (171)."""
    t = jnp.full((1, 3), 1 / 3, jnp.float32)
    x = jnp.array([[256.0, 0.0, 0.0]], jnp.bfloat16)
    x64, t64 = np.asarray(x, np.float64), np.asarray(t, np.float64)
    lse = x64.max() + np.log(np.sum(np.exp(x64 - x64.max())))
    want = lse * t64.sum() - np.sum(t64 * x64)  # logsumexp - sum t x, sum t = 1
    loss = lambda a: sce_kernel.softmax_crossentropy(a, t)[0].astype(jnp.float32).sum()
    got, g = jax.jit(jax.value_and_grad(loss))(x)
    assert float(got) == float(jnp.asarray(want, jnp.bfloat16)) == 171.0
    ref_loss = ops.softmax_crossentropy().definition.forward(x, t)[0]
    assert float(got) == float(ref_loss[0, 0])
    # the kernel's vjp, d loss / dx = softmax - t, with t unrounded (float64, rounded once)
    softmax = np.exp(x64 - lse)
    want_g = np.asarray(jnp.asarray(softmax - t64, jnp.bfloat16), np.float32)
    np.testing.assert_array_equal(np.asarray(g, np.float32), want_g)


def test_flash_attention_wins_by_the_precision_the_program_is_compiled_at(clean_table):
    """Flash attention wins on float32 only below full float32 precision (``wins``). It
    read the configuration's precision, so ``compile(matmul_precision="tensorfloat32")``
    left float32 attention on XLA and ``compile(matmul_precision="float32")`` under a
    tensorfloat32 configuration chose the kernel, which then multiplies without tensor
    cores (18x slower than XLA on an H200)."""
    sdpa = ops.scaled_dot_product_attention(is_causal=True)
    f32 = [jax.ShapeDtypeStruct((1, 16, 2, 16), np.float32)] * 3
    b = GraphBuilder()
    q = b.input((1, 16, 2, 16), name="q")
    graph = b.build([b.exec(sdpa, q, q, q, name="attn")])
    compiled = lambda precision: compile(graph, platform="gpu", matmul_precision=precision)
    assert ops.select_backend(sdpa, f32, "gpu") == "xla"
    assert ops.select_backend(sdpa, f32, "gpu", "tensorfloat32") == "pallas"
    assert ops.select_backend(sdpa, f32, "gpu", "high") == "pallas"  # JAX's alias
    assert compiled("tensorfloat32").backends == ((0, "attn", "pallas"),)
    assert compiled("float32").backends == ((0, "attn", "xla"),)
    with config.override(matmul_precision="tensorfloat32"):
        assert ops.select_backend(sdpa, f32, "gpu") == "pallas"
        assert ops.select_backend(sdpa, f32, "gpu", "float32") == "xla"
        assert compiled("float32").backends == ((0, "attn", "xla"),)
    with pytest.raises(ConfigError, match="unknown matmul precision 'fp8'"):
        ops.select_backend(sdpa, f32, "gpu", "fp8")


def test_a_loop_bodys_attention_is_chosen_at_the_programs_precision(monkeypatch):
    """Nodes of a scan body are chosen while the program is traced; they saw the config's
    precision, not ``compile(matmul_precision=...)``'s (review of session 22). The
    precision a ``wins`` rule reads is now the program's at top level and in the body."""
    from fnnc.core import selection
    from fnnc.graph import GraphBuilder, compile, scan
    from fnnc.ops.pallas import scaled_dot_product_attention as kernel

    seen = []
    read = lambda: seen.append(selection.selection_precision()) or seen[-1]
    monkeypatch.setattr(kernel, "selection_precision", read)  # what wins reads
    shape = (1, 4, 1, 16)
    inner = GraphBuilder()
    q = inner.input(shape, name="q")
    body = inner.build([inner.exec(ops.scaled_dot_product_attention(), q, q, q)])
    b = GraphBuilder()
    out = scan(b, body, [b.input(shape, name="q0")], length=2)
    compile(b.build([out[0]]), matmul_precision="tensorfloat32")(np.ones(shape, np.float32))
    assert seen and set(seen) == {"tensorfloat32"}, seen
