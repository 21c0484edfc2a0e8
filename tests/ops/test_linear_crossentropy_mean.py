"""linear_softmax_crossentropy_mean against ``jax.grad`` of the plain formulation (a
product, logsumexp minus the label's logit, a mean): its mean and gradient outputs, its
backward (a scaling, NNC's convention and ``jax.vjp``), ragged blocks, label smoothing,
leading dims, bfloat16 against the unfused pair, and the products it runs."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import ClosedJaxpr, Jaxpr

from fnnc import ops
from fnnc.errors import CommandError, ShapeError
from tests.helpers import assert_close

CMD = ops.linear_softmax_crossentropy_mean


def _data(lead=(37,), d=16, v=101, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((*lead, d)), dtype)
    w = jnp.asarray(rng.standard_normal((v, d)) * 0.3, dtype)
    b = jnp.asarray(rng.standard_normal((v,)), dtype)
    return x, w, b, jnp.asarray(rng.integers(0, v, lead), jnp.int32)


def _plain_mean(x, w, b, label, trim0=0.0, trim1=1.0):
    """Mean cross-entropy of full logits, rounded to the inputs' dtype as a gemm's are."""
    z = jnp.matmul(x, w.T, preferred_element_type=jnp.float32)
    z = z + jnp.reshape(b.astype(jnp.float32), (1,) * (x.ndim - 1) + (-1,))
    z = z.astype(x.dtype).astype(jnp.float32)
    t = jnp.where(jax.nn.one_hot(label, w.shape[0]) > 0, trim1, trim0)
    return jnp.mean(jax.nn.logsumexp(z, axis=-1) - jnp.sum(t * z, axis=-1))


@pytest.mark.parametrize(
    "lead, row_chunk, trims",
    [((37,), 8, (0.0, 1.0)), ((37,), 5, (0.01, 0.9)), ((37,), 64, (0.0, 1.0)),
     ((3, 5), 4, (0.0, 1.0)), ((1,), 1, (0.0, 1.0))],
    ids=["ragged", "ragged-smoothed", "one-block", "lead-dims", "one-row"],
)  # fmt: skip
def test_mean_and_gradients_match_jax_grad_of_the_plain_formulation(lead, row_chunk, trims):
    x, w, b, label = _data(lead)
    cmd = CMD(row_chunk=row_chunk, trim0=trims[0], trim1=trims[1])
    mean, gx, gw, gb = jax.jit(lambda *a: cmd(*a))(x, w, label, b)
    want, (wx, ww, wb) = jax.value_and_grad(_plain_mean, argnums=(0, 1, 2))(x, w, b, label, *trims)
    assert mean.shape == (1,) * (len(lead) + 1) and mean.dtype == jnp.float32
    assert_close(mean.reshape(()), want, rtol=1e-5, atol=1e-6)
    assert_close((gx, gw, gb), (wx, ww, wb), rtol=1e-4, atol=1e-6)


def test_without_bias_and_with_float_labels():
    x, w, _, label = _data()
    mean, gx, gw, _ = jax.jit(lambda *a: CMD(row_chunk=6)(*a))(x, w, label.astype(jnp.float32))
    zero = jnp.zeros((w.shape[0],), jnp.float32)
    want, (wx, ww) = jax.value_and_grad(_plain_mean, argnums=(0, 1))(x, w, zero, label)
    assert_close(mean.reshape(()), want, rtol=1e-5, atol=1e-6)
    assert_close((gx, gw), (wx, ww), rtol=1e-4, atol=1e-6)


def test_the_backward_scales_the_gradient_outputs_by_the_means_cotangent():
    x, w, b, label = _data()
    cmd = CMD(row_chunk=8)
    outputs = jax.jit(lambda *a: cmd(*a))(x, w, label, b)
    g = jnp.full((1, 1), 2.5, jnp.float32)
    grads = cmd.definition.backward((g, None, None, None), (x, w, label, b), outputs, **cmd.kwargs)
    _, (wx, ww, wb) = jax.value_and_grad(_plain_mean, argnums=(0, 1, 2))(x, w, b, label)
    assert grads[2] is None  # the label
    assert_close(
        (grads[0], grads[1], grads[3]), (2.5 * wx, 2.5 * ww, 2.5 * wb), rtol=1e-4, atol=1e-6
    )
    # jax.grad of the command (its custom_vjp) is the same scaling
    jx, jw, jb = jax.grad(lambda *a: 2.5 * jnp.sum(cmd(*a)[0]), argnums=(0, 1, 3))(x, w, label, b)
    assert_close((jx, jw, jb), (grads[0], grads[1], grads[3]), rtol=1e-6, atol=1e-7)


def test_bfloat16_matches_the_unfused_pair_it_replaces():
    """The pair: a bfloat16 gemm, its logits converted to float32, softmax cross-entropy,
    a mean; ``jax.grad`` of it rounds the logits' gradient to bfloat16 before the gemm's
    backward, as the command does."""
    x, w, b, label = _data(dtype=jnp.bfloat16)

    def pair(x, w, b):
        z = ops.gemm(transpose_b=True)(x, w, b).astype(jnp.float32)
        return jnp.mean(ops.softmax_crossentropy()(z, label)[0])

    want, (wx, ww, wb) = jax.value_and_grad(pair, argnums=(0, 1, 2))(x, w, b)
    mean, gx, gw, gb = jax.jit(lambda *a: CMD(row_chunk=8)(*a))(x, w, label, b)
    # the gemm rounds its product before the bias, the fused commands after: 1e-3 apart
    assert_close(mean.reshape(()), want, rtol=1e-3)
    blockwise = ops.linear_softmax_crossentropy(row_chunk=8, class_chunk=32)
    assert_close(mean.reshape(()), jnp.mean(blockwise(x, w, label, b)[0]), rtol=1e-6)
    for got, ref in ((gx, wx), (gw, ww), (gb, wb)):  # float32 sums of the same bf16 terms
        assert_close(got.astype(jnp.bfloat16).astype(jnp.float32), ref.astype(jnp.float32),
                     rtol=2e-2, atol=1e-3)  # fmt: skip


def _matmul_flops(jaxpr) -> int:
    """Multiply-add FLOPs of a jaxpr's products, loops counted ``length`` times (XLA's
    cost analysis counts a loop's body once)."""
    total = 0
    for e in jaxpr.eqns:
        if e.primitive.name == "dot_general":
            (contracted, _), _ = e.params["dimension_numbers"]
            k = math.prod(e.invars[0].aval.shape[i] for i in contracted)
            total += 2 * math.prod(e.outvars[0].aval.shape) * k
        subs = [v for v in e.params.values() if isinstance(v, (Jaxpr, ClosedJaxpr))]
        subs += [
            s for v in e.params.values() if isinstance(v, tuple)
            for s in v if isinstance(s, (Jaxpr, ClosedJaxpr))
        ]  # fmt: skip
        inner = [_matmul_flops(getattr(s, "jaxpr", s)) for s in subs]
        assert e.primitive.name not in ("while", "cond"), "trip counts unknown"
        total += sum(inner) * e.params.get("length", 1)
    return total


def test_three_products_of_the_logits_size_per_training_step():
    """The forward multiplies ``x wᵀ``, ``dz w`` and ``dzᵀ x``; the backward none: three
    ``N x D x V`` products, where the blockwise command's forward and backward run four
    (it recomputes the logits) and the plain pair three (it keeps them)."""
    x, w, b, label = _data(lead=(64,), d=32, v=256)
    mean = lambda x, w, b: jnp.sum(CMD(row_chunk=16)(x, w, label, b)[0])
    blocks = ops.linear_softmax_crossentropy(row_chunk=16, class_chunk=64)
    blockwise = lambda x, w, b: jnp.mean(blocks(x, w, label, b)[0])
    pair = lambda x, w, b: _plain_mean(x, w, b, label)
    flops = {
        name: _matmul_flops(jax.make_jaxpr(jax.grad(f, argnums=(0, 1, 2)))(x, w, b).jaxpr)
        for name, f in (("mean", mean), ("blockwise", blockwise), ("pair", pair))
    }
    product = 2 * 64 * 32 * 256
    assert flops["blockwise"] == 4 * product and flops["pair"] == 3 * product
    assert flops["mean"] == 3 * product + 2 * 64 * 256  # + the bias's column sum, by ones


def test_bad_inputs_say_what_to_pass():
    x, w, _, label = _data()
    with pytest.raises(CommandError, match="row_chunk=0 must be a positive int"):
        CMD(row_chunk=0)(x, w, label)
    with pytest.raises(ShapeError, match=r"weights .* \[V, D\]"):
        CMD()(x, w[:, :3], label)


def test_float16_gradients_do_not_underflow():
    """(softmax - t) / N is about 1e-7 here, below float16's normal range: the command
    multiplies it in float32, so the gradients keep float32's accuracy."""
    x, w, b, label = _data(lead=(4096,), d=8, v=2048, seed=3)
    x16, w16, b16 = (a.astype(jnp.float16) for a in (x, w, b))
    _, gx, gw, gb = jax.jit(lambda *a: CMD(row_chunk=1024)(*a))(x16, w16, label, b16)
    up = lambda a: a.astype(jnp.float32)
    _, want = jax.value_and_grad(_plain_mean, argnums=(0, 1, 2))(up(x16), up(w16), up(b16), label)
    for got, ref in zip((gx, gw, gb), want):
        scale = float(jnp.max(jnp.abs(ref)))
        assert float(jnp.max(jnp.abs(got - ref))) < 2e-3 * scale
