"""On a real GPU: the compiled (Triton) kernels against the reference, and their times.

Marked ``gpu``, so CI (``-m 'not gpu'``) skips them; run with ``pytest -m gpu``. The
benchmark ``benchmarks/kernels.py`` times the kernels at full transformer sizes.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.core.dispatch import as_specs, why_not
from fnnc.graph import GraphBuilder
from tests.helpers import assert_close, rand, randint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU"),
]


def _gelu_dense():
    b = GraphBuilder()
    x, w, bias = b.input((512, 256)), b.input((1024, 256)), b.input((1024,))
    y = b.exec(ops.gelu(approximate=True), b.exec(ops.gemm(transpose_b=True), x, w, bias))
    return ops.fused_elementwise(body=b.build([y]))


def _bias_gelu(approximate):
    """The fused chain of a dense layer's activation: tanh GELU (its backward is
    ``1 - tanh²``) or exact GELU (``erf``, run as fnnc's rule inside the kernel)."""
    b = GraphBuilder()
    x, bias = b.input((4, 128, 1024)), b.input((1024,))
    y = b.exec(ops.gelu(approximate=approximate), b.exec(ops.add(), x, bias))
    return ops.fused_elementwise(body=b.build([y]))


CASES = {
    "softmax_crossentropy": (
        ops.softmax_crossentropy(),
        lambda: [rand((512, 4096)), randint((512,), 4096)],
        1e-4,
    ),
    "layer_norm": (
        ops.layer_norm(),
        lambda: [rand((4, 128, 1024)), rand((1024,)), rand((1024,))],
        1e-4,
    ),
    "rms_norm": (ops.rms_norm(), lambda: [rand((4, 128, 1024)), rand((1024,))], 1e-4),
    "attention": (
        ops.scaled_dot_product_attention(is_causal=True),
        lambda: [rand((2, 512, 8, 64), seed=i) for i in range(3)],
        2e-2,  # XLA and Triton may both use TF32 for float32 products
    ),
    "gemm": (
        ops.gemm(transpose_b=True),
        lambda: [rand((512, 256)), rand((1024, 256)), rand((1024,))],
        2e-2,
    ),
    "fused add+gelu": (
        _bias_gelu(True),
        lambda: [rand((4, 128, 1024), lo=-4, hi=4), rand((1024,), seed=1)],
        1e-5,  # no products: elementwise float32 on both sides
    ),
    "fused add+gelu exact": (
        _bias_gelu(False),
        lambda: [rand((4, 128, 1024), lo=-4, hi=4), rand((1024,), seed=1)],
        1e-5,
    ),
    "fused gemm+gelu": (
        _gelu_dense(),
        lambda: [rand((512, 256)), rand((1024, 256)), rand((1024,))],
        2e-2,
    ),
    "attention bq128": (  # the 128-query-block variant (bfloat16 tiles only)
        ops.scaled_dot_product_attention(is_causal=True),
        lambda: [jnp.asarray(rand((2, 512, 8, 64), seed=i), jnp.bfloat16) for i in range(3)],
        3e-2,
        "pallas_bq128",
    ),
    "attention split": (  # WIDE's forward, backward kernels blocked 128 x 32 / 32 x 128
        ops.scaled_dot_product_attention(is_causal=True),
        lambda: [jnp.asarray(rand((2, 512, 8, 64), seed=i), jnp.bfloat16) for i in range(3)],
        3e-2,
        "pallas_split",
    ),
    "attention fused": (  # one backward kernel, dQ added with float32 atomics
        ops.scaled_dot_product_attention(is_causal=True),
        lambda: [jnp.asarray(rand((2, 512, 8, 64), seed=i), jnp.bfloat16) for i in range(3)],
        3e-2,
        "pallas_fused",
    ),
    "attention fused ragged gqa": (  # masked atomic adds on the last query block
        ops.scaled_dot_product_attention(is_causal=True),
        lambda: [
            jnp.asarray(rand(shape, seed=i), jnp.bfloat16)
            for i, shape in enumerate([(2, 500, 8, 64), (2, 500, 2, 64), (2, 500, 2, 64)])
        ],
        3e-2,
        "pallas_fused",
    ),
    "attention lowest-masked rows": (  # rows masked wholly with float32's lowest
        ops.scaled_dot_product_attention(),
        lambda: [rand((2, 200, 4, 64), seed=i) for i in range(3)] + [_lowest_rows_mask()],
        2e-2,
    ),
}


def _lowest_rows_mask():
    """A float mask whose rows 3 and 7 are wholly ``finfo(float32).min`` (a uniform
    softmax) and row 9 half of it; row 11 is ``-inf`` (attends nothing)."""
    mask = np.array(rand((1, 1, 200, 200), seed=8), np.float32)
    mask[..., [3, 7], :] = np.finfo(np.float32).min
    mask[..., 9, :100] = np.finfo(np.float32).min
    mask[..., 11, :] = -np.inf
    return mask


def _time(fn, *args, repeats=20):
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / repeats


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_kernel_matches_reference_and_is_timed(name):
    cmd, make, tol, *backend = CASES[name]
    backend = backend[0] if backend else "pallas"
    args = [jnp.asarray(a) for a in make()]
    # the kernel runs these inputs here; whether it is the default is for measurement
    # (fnnc.core.measured) to say
    assert why_not(ops.backends_of(cmd.name)[backend], cmd, as_specs(args, name), "gpu") is None
    kernel = jax.jit(lambda *a: ops.backends_of(cmd.name)[backend].forward(*a, **cmd.kwargs))
    reference = jax.jit(lambda *a: ops.backends_of(cmd.name)["xla"].forward(*a, **cmd.kwargs))
    assert_close(kernel(*args), reference(*args), rtol=tol, atol=tol)
    diff = [i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating)]

    def grad_of(fn):
        def loss(*xs):
            full = list(args)
            for i, x in zip(diff, xs):
                full[i] = x
            return sum(jnp.sum(jnp.square(o)) for o in jax.tree.leaves(fn(*full)))

        return jax.jit(jax.grad(loss, argnums=tuple(range(len(diff)))))

    floats = [args[i] for i in diff]
    assert_close(
        grad_of(kernel)(*floats), grad_of(reference)(*floats), rtol=10 * tol, atol=10 * tol
    )
    t_kernel, t_ref = _time(kernel, *args), _time(reference, *args)
    ratio = t_ref / t_kernel
    print(f"{name}: {backend} {t_kernel * 1e3:.3f} ms, xla {t_ref * 1e3:.3f} ms ({ratio:.2f}x)")
    assert np.isfinite(t_kernel)


@pytest.mark.parametrize("padding", [False, True])
def test_cudnn_attention_matches_reference_forward_and_backward(padding):
    from fnnc.ops import attention_cudnn

    cmd = ops.scaled_dot_product_attention(is_causal=not padding)
    args = [jnp.asarray(rand((2, 512, 8, 64), seed=i), jnp.bfloat16) for i in range(3)]
    if padding:  # the second sequence's last 112 keys are padding
        args.append(
            jnp.asarray(
                np.arange(512)[None, None, None, :] < np.array([512, 400])[:, None, None, None]
            )
        )
    why = attention_cudnn.supports(cmd, as_specs(args, "cudnn"))
    if why is not None:
        pytest.skip(why)
    params = dict(scale=None, is_causal=not padding)
    reference = jax.jit(lambda *a: ops.backends_of(cmd.name)["xla"].forward(*a, **params))
    cudnn = jax.jit(lambda *a: attention_cudnn.scaled_dot_product_attention(*a, **params))
    o = reference(*args)
    assert_close(cudnn(*args), o, rtol=2e-2, atol=2e-2)
    go = jnp.asarray(rand(o.shape, seed=7), jnp.bfloat16)
    wants = tuple(range(len(args)))
    want = jax.jit(lambda *a: cmd.definition.backward((go,), a, (o,), **params))(*args)
    got = jax.jit(lambda *a: attention_cudnn.backward((go,), a, (o,), wants, **params))(*args)
    for g, w in zip(got[:3], want[:3]):
        assert_close(g, w, rtol=1e-1, atol=1e-1)
    t_cudnn, t_ref = _time(cudnn, *args), _time(reference, *args)
    print(f"cudnn attention: {t_cudnn * 1e3:.3f} ms, xla {t_ref * 1e3:.3f} ms")
