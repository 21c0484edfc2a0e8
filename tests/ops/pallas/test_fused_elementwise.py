"""Kernels generated from fused_elementwise bodies, against the reference body."""

import jax
import jax.extend as jex
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder
from fnnc.ops.pallas import fused_elementwise as kernel
from fnnc.ops.pallas import gemm
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


@pytest.mark.parametrize("make", [_broadcasts, _select_two_outputs, _gemm_epilogue])
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
        (_body((4, 32), ops.ewexp(), ops.gelu()), r"primitives \['erf'\] have no Pallas Triton"),
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


def test_primitive_list_is_in_the_triton_lowering_table():
    # Imported, not skipped: this check exists to fail when JAX's table drifts.
    from jax._src.pallas.triton import lowering

    table = {p.name for p in lowering.triton_lowering_rules}
    assert not kernel.TRITON_PRIMITIVES - table, sorted(kernel.TRITON_PRIMITIVES - table)


def test_integer_bodies_are_declined():
    b = GraphBuilder()
    x, y = b.input((4, 32), np.int32), b.input((4, 32), np.int32)
    body = b.build([b.exec(ops.max(), b.exec(ops.min(), x, y), y)])
    assert "are not float tensors" in kernel.supports(ops.fused_elementwise(body=body), [x, y])
