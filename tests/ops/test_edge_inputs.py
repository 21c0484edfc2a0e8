"""Inputs at the edge of what a command takes: integer images for a blending resize,
attention over no keys, a normalisation with a bias but no scale. Each either computes
what its oracle (NumPy, jax.grad) says or says clearly why it cannot."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import DTypeError
from tests.helpers import assert_close, rand


def test_bilinear_upsample_refuses_integers_and_nearest_takes_them():
    """Bilinear weights cast to uint8 are 0: the image came back black."""
    img = np.array([[0, 100], [200, 255]], np.uint8).reshape(1, 2, 2, 1)
    with pytest.raises(DTypeError, match=r"bilinear.*got uint8\[1, 2, 2, 1\]"):
        ops.upsample(scale=2, mode="bilinear")(img)
    near = np.asarray(ops.upsample(scale=2, mode="nearest")(img))
    assert near.dtype == np.uint8
    np.testing.assert_array_equal(near[0, :, :, 0], img[0, :, :, 0].repeat(2, 0).repeat(2, 1))
    as_float = ops.upsample(scale=2, mode="bilinear")(img.astype(np.float32))
    assert_close(as_float[0, 0, :, 0], np.array([0, 25, 75, 100], np.float32))


def test_attention_over_no_keys_is_zeros_and_so_is_its_gradient():
    """Every query attends nothing, which the command defines as a zero row."""
    q, k = rand((1, 2, 1, 4)), jnp.zeros((1, 0, 1, 4))
    attend = ops.scaled_dot_product_attention()
    out = attend(q, k, k)
    assert_close(out, np.zeros((1, 2, 1, 4), np.float32))
    d = ops.lookup("scaled_dot_product_attention")
    gq, gk, gv = d.backward([jnp.ones_like(out)], [q, k, k], [out], scale=None, is_causal=False)[:3]
    assert_close(gq, np.zeros(q.shape, np.float32))
    assert gk.shape == gv.shape == (1, 0, 1, 4)


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
def test_norm_backward_with_a_left_out_scale(name):
    """An eager call may leave the scale out as ``None`` before a bias (layer norm) or
    as its one parameter (rms norm); the backward gives it no gradient and the others
    jax.grad's."""
    x, bias = rand((3, 5)), rand((5,), seed=1)
    params = [None, bias] if name == "layer_norm" else [None]
    cmd = getattr(ops, name)(axes=(1,))
    outs = cmd(x, *params)
    gy = rand((3, 5), seed=2)

    def loss(x, *rest):
        return jnp.sum(cmd(x, *params[: len(params) - len(rest)], *rest)[0] * gy)

    live = params[1:]  # the bias, for layer norm
    want = jax.grad(loss, argnums=tuple(range(1 + len(live))))(x, *live)
    d = ops.lookup(name)
    grads = [gy] + [None] * (len(outs) - 1)
    got = d.backward(grads, [x, *params], list(outs), **dict(cmd.params))
    assert got[1] is None
    assert_close(got[0], want[0], 1e-5, 1e-5)
    for g, w in zip(got[2:], want[1:]):
        assert_close(g, w, 1e-5, 1e-5)
