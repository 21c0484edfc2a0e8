"""Every kernel, forward and backward, lowers to Triton for CUDA, checked on this CPU.

``jax.export`` lowers for a platform without its device, so the whole Pallas Triton
lowering runs here (power-of-two sizes, primitives it implements, ``dot`` shapes, the
bf16/f16 paths) and emits Triton IR in custom calls. What it cannot check is Triton's
own compilation of that IR to a GPU binary (register and shared-memory budgets),
which happens inside XLA on a GPU: see ``test_gpu.py``.
"""

import re

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export, lax
from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

from fnnc import ops
from fnnc.ops.pallas import _common
from tests.ops.pallas.checks import small_cases

TRITON = "__gpu$xla.gpu.triton"


@pytest.fixture(autouse=True)
def gpu_target(monkeypatch):
    """Kernels built for a GPU, lowered for an H100 (JAX 0.11 asks for the target's kind
    when no GPU is attached; an abstract device names it)."""
    monkeypatch.setattr(_common, "platform", lambda: "gpu")
    h100 = AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=132, platform="gpu")
    with use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=h100)):
        yield


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(small_cases(np.float32)))
def test_lowers_to_triton_for_cuda(name, dtype):
    cmd, shapes = small_cases(dtype)[name]
    specs = [jax.ShapeDtypeStruct(s, d) for s, d in shapes]
    assert ops.backends_of(cmd.name)["pallas"].supports(cmd, specs) is None
    forward = ops.backends_of(cmd.name)["pallas"].forward
    diff = [i for i, s in enumerate(specs) if jnp.issubdtype(s.dtype, jnp.floating)]

    def loss(*xs):
        full = list(xs)
        outs = jax.tree.leaves(forward(*full, **cmd.kwargs))
        return sum(jnp.sum(jnp.square(o.astype(jnp.float32))) for o in outs)

    train = jax.grad(loss, argnums=tuple(diff))
    check = [export.DisabledSafetyCheck.custom_call(TRITON)]
    exported = export.export(jax.jit(train), platforms=["cuda"], disabled_checks=check)(*specs)
    assert exported.mlir_module().count(TRITON) >= 2  # a forward and a backward kernel


@pytest.mark.parametrize(
    ("name", "stages", "kernels", "s"),
    [
        ("pallas_bq128", {3}, 3, 256),
        ("pallas_split", {3, 4}, 3, 256),
        ("pallas_fused", {2}, 2, 256),
        ("pallas_fused", {2}, 2, 250),  # masked atomic adds on the last query block
    ],
)
def test_the_candidate_attention_backends_lower_for_cuda(name, stages, kernels, s):
    """Their forward and backward kernels, in bfloat16: ``pallas_bq128``'s 128 x 64
    blocks in 3 stages; ``pallas_split``'s forward in 3 stages and its backward kernels
    (128 x 32, 32 x 128 blocks) in 4; ``pallas_fused``'s one backward kernel, whose dQ
    is float32 atomic adds (masked where the queries are ragged)."""
    cmd = ops.scaled_dot_product_attention(is_causal=True)
    specs = [jax.ShapeDtypeStruct((1, s, 2, 64), jnp.bfloat16)] * 3
    backend = ops.backends_of(cmd.name)[name]
    assert backend.supports(cmd, specs) is None

    def loss(q, k, v):
        out = backend.forward(q, k, v, **cmd.kwargs)
        return jnp.sum(jnp.square(out.astype(jnp.float32)))

    check = [export.DisabledSafetyCheck.custom_call(TRITON)]
    train = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    exported = export.export(train, platforms=["cuda"], disabled_checks=check)(*specs)
    text = exported.mlir_module().replace('"', " ")
    assert text.count(TRITON) >= kernels
    assert {int(n) for n in re.findall(r"num_stages = (\d+)", text)} == stages


def _dot_precisions(jaxpr):
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(eqn.params["precision"])
        for sub in jex.core.jaxprs_in_params(eqn.params):
            found += _dot_precisions(sub)
    return found


@pytest.mark.parametrize("name", ["gemm_transposed", "attention_causal_gqa", "fused_gemm_epilogue"])
@pytest.mark.parametrize(
    ("policy", "want"),
    [("float32", lax.Precision.HIGHEST), ("tensorfloat32", lax.Precision.HIGH)],
)
def test_kernel_products_take_the_ambient_matmul_precision(name, policy, want):
    """No kernel pins a precision: every product, forward and backward, records the one
    in force when it is traced (the Triton lowering reads HIGHEST as IEEE float32, HIGH
    and DEFAULT as TF32), so fnnc's matmul policy reaches inside the kernels."""
    cmd, shapes = small_cases(np.float32)[name]
    specs = [jax.ShapeDtypeStruct(s, d) for s, d in shapes]
    forward = ops.backends_of(cmd.name)["pallas"].forward
    diff = tuple(i for i, s in enumerate(specs) if jnp.issubdtype(s.dtype, jnp.floating))
    loss = lambda *xs: sum(jnp.sum(o) for o in jax.tree.leaves(forward(*xs, **cmd.kwargs)))
    with jax.default_matmul_precision(policy):
        jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=diff))(*specs).jaxpr
    found = _dot_precisions(jaxpr)
    assert found and all(p == (want, want) for p in found), found


def test_the_fused_graph_backward_calls_the_forward_kernel_as_the_forward_did():
    """``pallas_fused``'s graph backward gets the softmax statistics from the forward
    kernel's call, the one the forward node made: same operands, same kernel and
    settings, only the source location differs, so XLA's common subexpression
    elimination can merge the two."""
    from fnnc.ops.pallas import scaled_dot_product_attention as kernel

    def step(q, k, v, go):
        o = kernel.scaled_dot_product_attention(q, k, v, is_causal=True, blocks=kernel.FUSED)
        back = kernel.backward(
            (go,), (q, k, v), (o,), (0, 1, 2), scale=None, is_causal=True, blocks=kernel.FUSED
        )
        return o, back

    specs = [jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.bfloat16)] * 4
    check = [export.DisabledSafetyCheck.custom_call(TRITON)]
    text = export.export(jax.jit(step), platforms=["cuda"], disabled_checks=check)(*specs)
    calls = [
        re.sub(r" loc\(#loc\d+\)$", "", line.split("=", 1)[1])
        for line in text.mlir_module().splitlines()
        if f"custom_call @{TRITON}(%arg0, %arg1, %arg2)" in line
    ]
    assert len(calls) == 2 and calls[0] == calls[1]
