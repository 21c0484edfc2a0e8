"""linear_softmax_crossentropy against the plain formulation (a product, then
logsumexp minus the label's logit) and ``jax.grad`` of it: ragged blocks, label
smoothing, bfloat16, and the memory it does not take (XLA's memory analysis)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.core.dispatch import REFERENCE, as_specs, why_not
from fnnc.errors import CommandError, ShapeError
from fnnc.ops import measure_defaults
from tests.helpers import assert_close

CMD = ops.linear_softmax_crossentropy


def _data(n=37, d=16, v=101, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((n, d)), dtype)
    w = jnp.asarray(rng.standard_normal((v, d)) * 0.3, dtype)
    b = jnp.asarray(rng.standard_normal((v,)), dtype)
    return x, w, b, jnp.asarray(rng.integers(0, v, n), jnp.int32)


def _plain(x, w, b, label, trim0=0.0, trim1=1.0):
    """``(loss, lse)`` from full float32 logits, rounded to the inputs' dtype first."""
    z = jnp.matmul(x, w.T, preferred_element_type=jnp.float32) + b.astype(jnp.float32)[None, :]
    z = z.astype(x.dtype).astype(jnp.float32)
    t = jnp.where(jax.nn.one_hot(label, w.shape[0]) > 0, trim1, trim0)
    lse = jax.nn.logsumexp(z, axis=-1)
    return lse - jnp.sum(t * z, axis=-1), lse


def _run(cmd, x, w, label, b, g_loss, g_lse):
    """The command's forward and its hand-written backward (NNC's convention)."""
    fwd = jax.jit(lambda *a: cmd.definition.forward(*a, **cmd.kwargs))
    loss, lse = fwd(x, w, label, b)
    bwd = jax.jit(lambda *a: cmd.definition.backward(a[:2], a[2:], (loss, lse), **cmd.kwargs))
    return (loss, lse), bwd(g_loss, g_lse, x, w, label, b)


@pytest.mark.parametrize(
    "chunks, trims",
    [((8, 32), (0.0, 1.0)), ((5, 7), (0.01, 0.9)), ((64, 512), (0.0, 1.0))],
    ids=["ragged", "ragged-smoothed", "one-block"],
)
def test_matches_jax_grad_of_the_plain_formulation(chunks, trims):
    x, w, b, label = _data()
    cmd = CMD(row_chunk=chunks[0], class_chunk=chunks[1], trim0=trims[0], trim1=trims[1])
    rng = np.random.default_rng(1)
    g_loss, g_lse = (jnp.asarray(rng.standard_normal((37, 1)), jnp.float32) for _ in range(2))
    (loss, lse), grads = _run(cmd, x, w, label, b, g_loss, g_lse)
    want, vjp = jax.vjp(lambda x, w, b: _plain(x, w, b, label, *trims), x, w, b)
    assert_close(loss[:, 0], want[0], rtol=1e-5, atol=1e-5)
    assert_close(lse[:, 0], want[1], rtol=1e-5, atol=1e-5)
    gx, gw, gb = vjp((g_loss[:, 0], g_lse[:, 0]))
    assert grads[2] is None  # the label
    assert_close((grads[0], grads[1], grads[3]), (gx, gw, gb), rtol=1e-4, atol=1e-5)


def test_bfloat16_keeps_float32_statistics():
    x, w, b, label = _data(n=40, d=16, v=200, dtype=jnp.bfloat16)
    cmd = CMD(row_chunk=16, class_chunk=64)
    g = jnp.full((40, 1), 1 / 40, jnp.float32)
    (loss, _), grads = _run(cmd, x, w, label, b, g, None)
    assert loss.dtype == jnp.float32 and grads[0].dtype == jnp.bfloat16
    # The oracle is NumPy in float64 from the bfloat16 inputs, not the plain formulation
    # under XLA: each logit is rounded to bfloat16 up to twice (the product, then its sum
    # with the bias), and XLA:GPU may skip either rounding as excess precision, in the
    # command or in a reference (on an H100 the two disagreed by 0.015 at 9.1). A rounding
    # moves a logit by at most 2**-9 of the row's scale, so the loss (logsumexp less the
    # label's logit) is within 4 * 2**-9 of it.
    xw = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    z = xw + np.asarray(b, np.float64)
    top = z.max(axis=1, keepdims=True)
    exact = top[:, 0] + np.log(np.exp(z - top).sum(axis=1)) - z[np.arange(40), label]
    scale = np.abs(xw).max(axis=1) + np.abs(np.asarray(b, np.float64)).max()
    err = np.abs(np.asarray(loss[:, 0], np.float64) - exact)
    assert np.all(err <= 4 * 2.0**-9 * scale), (err / scale).max()
    _, vjp = jax.vjp(lambda x, w, b: _plain(x, w, b, label)[0], x, w, b)
    gx, gw, gb = vjp(g[:, 0])
    for got, ref in ((grads[0], gx), (grads[1], gw), (grads[3], gb)):
        assert_close(got.astype(jnp.float32), ref.astype(jnp.float32), rtol=3e-2, atol=3e-3)


def test_leading_axes_float_labels_and_no_bias():
    x, w, _, label = _data(n=12, v=40)
    cmd = CMD(row_chunk=5, class_chunk=16)
    loss, lse = cmd(jnp.reshape(x, (3, 4, 16)), w, jnp.reshape(label, (3, 4, 1)).astype(float))
    want = _plain(x, w, jnp.zeros((40,)), label)
    assert loss.shape == lse.shape == (3, 4, 1)
    assert_close(jnp.reshape(loss, (12,)), want[0], rtol=1e-5, atol=1e-5)


def _temp_bytes(fn, *args):
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_forward_and_backward_never_hold_the_full_logits():
    n, v = 256, 16384
    x, w, b, label = _data(n=n, d=32, v=v)
    cmd = CMD(row_chunk=64, class_chunk=1024)
    full = n * v * 4  # the float32 logits: 16 MiB

    def fused(x, w, b):
        loss, lse = cmd.definition.forward(x, w, label, b, **cmd.kwargs)
        g = jnp.ones_like(loss)
        return cmd.definition.backward((g, None), (x, w, label, b), (loss, lse), **cmd.kwargs)

    def plain(x, w, b):
        return jax.grad(lambda *a: jnp.sum(_plain(*a, label)[0]), argnums=(0, 1, 2))(x, w, b)

    assert _temp_bytes(plain, x, w, b) >= full  # the measure sees the logits where they are
    assert _temp_bytes(fused, x, w, b) < full / 8


@pytest.mark.parametrize(
    "args, error, match",
    [
        (((4, 8), (10, 8), (4, 10)), ShapeError, "per-class targets"),
        (((4, 8), (10, 6), (4,)), ShapeError, "same D"),
        (((4, 8), (10, 8), (4,), (9,)), ShapeError, "one per class"),
    ],
)
def test_bad_inputs_are_named(args, error, match):
    specs = [jax.ShapeDtypeStruct(s, jnp.float32) for s in args]
    with pytest.raises(error, match=match):
        CMD().shape(*specs)


def test_chunks_must_be_positive():
    with pytest.raises(CommandError, match="row_chunk=0"):
        CMD(row_chunk=0).shape(
            *[jax.ShapeDtypeStruct(s, jnp.float32) for s in ((4, 8), (9, 8))],
            jax.ShapeDtypeStruct((4,), jnp.int32),
        )


def test_jax_grad_of_the_command_is_blockwise_too():
    n, v = 256, 16384
    x, w, b, label = _data(n=n, d=32, v=v)
    cmd = CMD(row_chunk=64, class_chunk=1024)

    def loss(x, w, b):
        return jnp.sum(cmd.definition.forward(x, w, label, b, **cmd.kwargs)[0])

    grad = jax.grad(loss, argnums=(0, 1, 2))
    assert _temp_bytes(grad, x, w, b) < n * v * 4 / 8
    small = _data()
    small_cmd = CMD(row_chunk=8, class_chunk=32)
    got = jax.grad(
        lambda *a: jnp.sum(small_cmd.definition.forward(a[0], a[1], small[3], a[2])[0]),
        argnums=(0, 1, 2),
    )(*small[:3])
    want = jax.grad(lambda *a: jnp.sum(_plain(*a, small[3])[0]), argnums=(0, 1, 2))(*small[:3])
    assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_dense_backend_is_chosen_only_by_measurement_and_is_timed():
    dense = ops.backends_of(CMD().name)["dense"]
    assert dense.priority == 0 and dense.backward is not None
    x, w, b, label = _data()
    specs = as_specs([x, w, label, b], "case")
    for platform in ("cpu", "gpu"):
        assert ops.select_backend(CMD(), specs, platform) == REFERENCE
    with config.override(backend_per_command={CMD().name: "dense"}):
        loss, lse = CMD()(x, w, label, b)
    assert_close((loss[:, 0], lse[:, 0]), _plain(x, w, b, label), rtol=1e-5, atol=1e-5)
    cases = measure_defaults.cases(measure_defaults.SIZES["small"], jnp.float32)
    (cmd, args, diff), *_ = [c for c in cases if c[0].name == CMD().name]
    assert why_not(dense, cmd, as_specs(args, "case"), "gpu") is None and diff == (0, 1, 3)
