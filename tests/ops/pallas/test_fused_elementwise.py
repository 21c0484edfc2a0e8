"""Kernels generated from fused_elementwise bodies, against the reference body."""

import re

import jax
import jax.extend as jex
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.core.dispatch import why_not
from fnnc.errors import BackendError
from fnnc.graph import GraphBuilder
from fnnc.ops.pallas import _triton, gemm
from fnnc.ops.pallas import fused_elementwise as kernel
from tests.helpers import rand
from tests.ops.pallas.checks import check_forced_eager, check_kernel, check_unsupported


def _broadcasts():
    """Full, row (bias), column and scalar inputs through a chain of five commands.

    37 lanes in blocks of 16: the last block is ragged, and the column and scalar
    gradients are summed over its valid lanes only.
    """
    b = GraphBuilder()
    x, bias, col, c = b.input((3, 2, 37)), b.input((37,)), b.input((3, 2, 1)), b.input(())
    y = b.exec(ops.gelu(approximate=True), b.exec(ops.add(), x, bias))
    y = b.exec(ops.swish(), b.exec(ops.ewsum(), b.exec(ops.ewprod(), y, col), c))
    args = [rand((3, 2, 37)), rand((37,), seed=1), rand((3, 2, 1), seed=2), rand((), seed=3)]
    return b.build([y]), args, [0, 1, 2, 3]


def _select_two_outputs():
    """A bool input (as int8 in the kernel) and two outputs."""
    b = GraphBuilder()
    x, m, z = b.input((16, 16)), b.input((16, 16), np.bool_), b.input((16,))
    y = b.exec(ops.select(), m, b.exec(ops.tanh(), x), z)
    mask = np.random.default_rng(0).uniform(size=(16, 16)) > 0.5
    return (
        b.build([b.exec(ops.sigmoid(), y), y]),
        [rand((16, 16)), mask, rand((16,), seed=1)],
        [0, 2],
    )


def _gemm_epilogue():
    """A body led by a gemm: bias + relu + residual as the product's epilogue."""
    b = GraphBuilder()
    x, w, bias, res = b.input((2, 16, 32)), b.input((64, 32)), b.input((64,)), b.input((2, 16, 64))
    y = b.exec(ops.gemm(transpose_b=True), x, w, bias)
    y = b.exec(ops.add(), b.exec(ops.leaky_relu(negative_slope=0.1), y), res)
    args = [
        rand((2, 16, 32)),
        rand((64, 32), seed=1),
        rand((64,), seed=2),
        rand((2, 16, 64), seed=3),
    ]
    return b.build([y]), args, [0, 1, 2, 3]


def _bias_gelu_exact():
    """Exact GELU: ``erf``, which the Triton lowering lacks, runs as fnnc's rule for it.

    Values up to 5 in magnitude reach past the rule's clamp (erf rounds to ±1 there).
    """
    b = GraphBuilder()
    x, bias = b.input((4, 37)), b.input((37,))
    y = b.exec(ops.gelu(), b.exec(ops.add(), x, bias))
    return b.build([y]), [rand((4, 37), lo=-5, hi=5), rand((37,), seed=1)], [0, 1]


@pytest.mark.parametrize(
    "make", [_broadcasts, _select_two_outputs, _gemm_epilogue, _bias_gelu_exact]
)
def test_matches_reference(monkeypatch, make):
    monkeypatch.setattr(kernel, "LANE_BLOCK", 16)  # several blocks along rows and lanes
    monkeypatch.setattr(gemm, "BLOCK_M", 16)
    body, args, diff = make()
    assert isinstance(kernel.plan(body), kernel.Plan)
    check_kernel(kernel, ops.fused_elementwise(body=body), args, diff=diff)


def test_the_gemm_epilogue_is_one_product_kernel():
    body, args, _ = _gemm_epilogue()
    plan = kernel.plan(body)
    assert plan.gemm == ops.gemm(transpose_b=True) and plan.gemm_inputs == (0, 1, 2)
    jaxpr = jax.make_jaxpr(lambda *a: kernel.fused_elementwise(*a, body=body))(*args).jaxpr
    assert _kernel_names(jaxpr) == ["fnnc_gemm"]


def _kernel_names(jaxpr):
    names = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            names.append(eqn.params["jaxpr"].debug_info.func_src_info.split()[0])
        for sub in jex.core.jaxprs_in_params(eqn.params):
            names += _kernel_names(sub)
    return names


def test_forced_eager_call():
    body, args, _ = _broadcasts()
    check_forced_eager(ops.fused_elementwise(body=body), args)


def _body(shape, *cmds, inputs=None):
    b = GraphBuilder()
    xs = [b.input(s) for s in (inputs or [shape])]
    y = xs[0]
    for cmd in cmds:
        y = b.exec(cmd, y, *xs[1:]) if cmd.name in ("add", "ewprod") else b.exec(cmd, y)
    return b.build([y])


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (_body((4, 32), ops.ewexp(), ops.ewerfc()), r"primitives \['erfc'\] have no Pallas Triton"),
        (
            _body((4, 8, 32), ops.add(), ops.relu(), inputs=[(4, 8, 32), (4, 1, 32)]),
            "is not a full, row, column or scalar tile",
        ),
    ],
)
def test_unsupported_bodies_fall_back_or_explain(body, reason):
    args = [rand(s.shape, seed=i) for i, s in enumerate(body.input_specs)]
    check_unsupported(ops.fused_elementwise(body=body), args, reason)


def test_non_elementwise_body_is_declined():
    b = GraphBuilder()
    x = b.input((4, 32))
    body = b.build([b.exec(ops.relu(), b.exec(ops.softmax(), x))])
    assert "are not elementwise" in kernel.supports(ops.fused_elementwise(body=body), [x])


def test_a_chain_triton_cannot_lower_falls_back_to_xla_for_gpu_at_selection():
    body = _body((4, 32), ops.tanh(), ops.ewerfc())
    cmd, specs = ops.fused_elementwise(body=body), list(body.input_specs)
    pallas = ops.backends_of("fused_elementwise")["pallas"]
    why = "fused_elementwise: primitives ['erfc'] have no Pallas Triton lowering"
    assert why_not(pallas, cmd, specs, "gpu") == why
    assert ops.select_backend(cmd, specs, "gpu") == "xla"
    with (
        config.override(backend_per_command={"fused_elementwise": "pallas"}),
        pytest.raises(
            BackendError, match=re.escape(f"cannot run inputs ['float32[4, 32]'] on gpu: {why}")
        ),
    ):
        ops.select_backend(cmd, specs, "gpu")


@pytest.fixture
def fresh_plans():
    """Plans are cached per body; a test that changes what lowers starts and ends clean."""
    kernel.plan.cache_clear()
    yield
    kernel.plan.cache_clear()


def test_the_decision_reads_the_installed_jax_s_triton_table(monkeypatch, fresh_plans):
    """A JAX whose Triton lowering lacked ``tanh`` would decline tanh chains (forward or
    backward): the table is read from JAX, never copied."""
    from jax._src.pallas.triton import lowering

    table = frozenset(p.name for p in lowering.triton_lowering_rules)
    assert _triton.lowered() == table
    body = _body((4, 32), ops.add(), ops.tanh(), inputs=[(4, 32), (32,)])
    cmd, specs = ops.fused_elementwise(body=body), list(body.input_specs)
    pallas = ops.backends_of(cmd.name)["pallas"]
    assert why_not(pallas, cmd, specs, "gpu") is None  # the kernel runs it on a GPU
    kernel.plan.cache_clear()
    monkeypatch.setattr(_triton, "lowered", lambda: table - {"tanh"})
    assert "primitives ['tanh'] have no Pallas Triton lowering" in kernel.supports(cmd, specs)
    assert "no Pallas Triton lowering" in why_not(pallas, cmd, specs, "gpu")


def test_erf_rule_is_xla_s_float32_erf():
    x = np.concatenate([np.linspace(-6, 6, 20001), [0.0, -0.0, np.inf, -np.inf, 1e-30]])
    x = x.astype(np.float32)
    got = np.asarray(jax.jit(_triton.RULES["erf"])(x))
    want = np.asarray(jax.jit(jax.lax.erf)(x))
    np.testing.assert_allclose(got, want, rtol=4e-7, atol=1e-7)
    assert np.isnan(jax.jit(_triton.RULES["erf"])(np.float32(np.nan)))


def test_one_minus_square_rule_keeps_precision_near_one():
    x = np.float32(1) - np.float32(2.0**-20) * np.arange(1, 64, dtype=np.float32)
    x = np.concatenate([x, -x, np.linspace(-3, 3, 101, dtype=np.float32)])
    got = np.asarray(jax.jit(_triton.RULES["one_minus_square"])(x))
    want = 1 - x.astype(np.float64) ** 2
    np.testing.assert_allclose(got, want, rtol=3e-7)


def test_integer_bodies_are_declined():
    b = GraphBuilder()
    x, y = b.input((4, 32), np.int32), b.input((4, 32), np.int32)
    body = b.build([b.exec(ops.max(), b.exec(ops.min(), x, y), y)])
    assert "are not float tensors" in kernel.supports(ops.fused_elementwise(body=body), [x, y])


def test_the_kernel_backward_keeps_each_member_s_own_backward():
    """relu then exp at x = 0: NNC's relu passes no gradient at 0 (JAX's VJP of
    jnp.maximum gives 0.5), in the kernel's backward and its jax.vjp as in the
    reference's backward; the closed form is exp(relu(x)) where x > 0, else 0."""
    body = _body((2, 37), ops.relu(), ops.ewexp())
    cmd = ops.fused_elementwise(body=body)
    x = np.zeros((2, 37), np.float32)
    x[0, ::2] = np.linspace(-1, 1, 19)
    g = np.ones((2, 37), np.float32)
    want = np.where(x > 0, np.exp(np.maximum(x, 0)), 0).astype(np.float32)
    (ref,) = cmd.definition.backward((g,), (x,), (None,), **cmd.kwargs)
    (got,) = jax.jit(lambda g, x: kernel.backward((g,), (x,), (None,), (0,), body=body))(g, x)
    _, pull = jax.vjp(lambda x: kernel.fused_elementwise(x, body=body), x)
    for grad in (ref, got, pull(g)[0]):
        np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-6)
