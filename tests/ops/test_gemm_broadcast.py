"""gemm's batch axes broadcast without materialising an operand at the batch shape.

The dense layer ``[B, S, in] x [out, in]`` must be one matrix product of ``B*S`` rows
and its weight gradient one contraction over ``B*S``: broadcasting the weight to
``[B, out, in]`` first made XLA:CPU copy it per batch row and sum ``B`` weight
gradients (an LM step at batch 16 ran 3x slower than Flax's). Values are checked
against NumPy's ``matmul`` (forward) and ``jax.vjp`` of ``jnp.matmul`` (gradients) over
every way batch axes can broadcast; the structure against the traced program.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from tests.helpers import assert_close

M, K, N = 3, 4, 5
BATCHES = [
    ((), ()),
    ((2,), ()),
    ((), (2,)),
    ((2,), (2,)),
    ((2, 3), ()),
    ((), (2, 3)),
    ((2, 1), (3,)),
    ((1, 3), (2, 1)),
    ((2, 3), (3,)),
    ((1,), (2,)),
    ((2, 1, 3), (1, 3)),
]


def _oracle(a, b, ta, tb):
    """``a @ b`` in NumPy (float64), transposes applied first."""
    a = np.swapaxes(a, -1, -2) if ta else a
    b = np.swapaxes(b, -1, -2) if tb else b
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


@pytest.mark.parametrize(("ba", "bb"), BATCHES)
@pytest.mark.parametrize(("ta", "tb"), list(itertools.product([False, True], repeat=2)))
def test_values_and_gradients_match_numpy_and_jax(ba, bb, ta, tb):
    rng = np.random.default_rng(len(ba) * 7 + len(bb))
    a = rng.normal(size=(*ba, *((K, M) if ta else (M, K)))).astype(np.float32)
    b = rng.normal(size=(*bb, *((N, K) if tb else (K, N)))).astype(np.float32)
    cmd = ops.gemm(transpose_a=ta, transpose_b=tb)
    y = cmd(jnp.asarray(a), jnp.asarray(b))
    assert_close(y, _oracle(a, b, ta, tb), rtol=1e-5, atol=1e-5)

    def plain(a, b):
        a = jnp.swapaxes(a, -1, -2) if ta else a
        b = jnp.swapaxes(b, -1, -2) if tb else b
        return jnp.matmul(a, b, precision="highest")

    g = rng.normal(size=y.shape).astype(np.float32)
    _, vjp = jax.vjp(plain, a, b)
    want = vjp(jnp.asarray(g))
    got = _backward(cmd, g, a, b)
    for w, x, given in zip(want, got, (a, b)):
        assert x.shape == given.shape
        assert_close(x, w, rtol=1e-5, atol=1e-5)


def _backward(cmd, g, a, b):
    """The command's own backward (the XLA reference), for both operands."""
    return cmd.definition.backward((jnp.asarray(g),), (a, b), (None,), **cmd.kwargs)


def _primitives(fn, *args):
    """Every equation of ``fn``'s jaxpr, nested calls (the command's jit) included."""

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            yield eqn
            for param in eqn.params.values():
                inner = getattr(param, "jaxpr", param)
                if hasattr(inner, "eqns"):
                    yield from walk(inner)

    return list(walk(jax.make_jaxpr(fn)(*args).jaxpr))


def test_a_dense_layer_is_one_product_of_all_rows_and_its_weight_gradient_one_contraction():
    x, w = jnp.ones((16, 64, 32)), jnp.ones((48, 32))
    cmd = ops.gemm(transpose_b=True)
    y = cmd(x, w)
    forward = _primitives(lambda x, w: cmd(x, w), x, w)
    backward = _primitives(lambda g: _backward(cmd, g, x, w), jnp.ones(y.shape))
    for eqn in forward + backward:
        # no operand (nor gradient) is broadcast to [16, ...] to meet the other's batch
        if eqn.primitive.name == "broadcast_in_dim":
            assert eqn.outvars[0].aval.size == 1 or eqn.invars[0].aval.shape[0] == 16, eqn
    dots = [e for e in forward + backward if e.primitive.name == "dot_general"]
    assert len(dots) == 3
    for eqn in dots:
        (_, _), (batch_a, batch_b) = eqn.params["dimension_numbers"]
        assert batch_a == batch_b == (), f"a batched product: {eqn}"
    weight_grad = [e for e in dots if e.outvars[0].aval.shape == (48, 32)]
    assert len(weight_grad) == 1
    (contract_a, _), _ = weight_grad[0].params["dimension_numbers"]
    assert len(contract_a) == 2, "the weight gradient contracts batch and rows at once"
