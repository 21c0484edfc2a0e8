"""upsample's ``format="NCHW"`` (NNC's CPU kernel reads the format of its input tensor):
the NCHW command on an NCHW tensor equals the NHWC command on the transposed tensor,
transposed back, forward and gradient, to the bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError

X = (np.random.default_rng(0).integers(-8, 9, size=(2, 3, 4, 5)) / 4).astype(np.float32)
TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)


@pytest.mark.parametrize(
    ("mode", "align"), [("nearest", False), ("bilinear", False), ("bilinear", True)]
)
def test_nchw_upsample_is_the_nhwc_one_on_the_transposed_input(mode, align):
    kw = dict(scale=(2, 1.5), mode=mode, align_corners=align)
    nchw, nhwc = ops.upsample(**kw, format="NCHW"), ops.upsample(**kw)
    g = np.random.default_rng(1).normal(size=(2, 3, 8, 8)).astype(np.float32)

    def twin(x):
        return jnp.transpose(nhwc(jnp.transpose(x, TO_NHWC)), TO_NCHW)

    y = nchw(X)
    assert y.shape == (2, 3, 8, 8)
    np.testing.assert_array_equal(y, twin(X))
    np.testing.assert_array_equal(ops.upsample(**kw, format=1)(X), y)  # NNC's int
    np.testing.assert_array_equal(nchw(X[0]), y[0])  # CHW, one image
    grad = jax.grad(lambda x: (nchw(x) * g).sum())(X)
    np.testing.assert_array_equal(grad, jax.grad(lambda x: (twin(x) * g).sum())(X))


def test_nchw_nearest_upsample_repeats_each_pixel():
    # closed form: scale 2 nearest is np.repeat on H and W
    want = np.repeat(np.repeat(X, 2, axis=2), 2, axis=3)
    np.testing.assert_array_equal(ops.upsample(format="nchw")(X), want)
    np.testing.assert_array_equal(ops.upsample(format=2)(X), np.repeat(np.repeat(X, 2, 1), 2, 2))


@pytest.mark.parametrize("bad", ["CHWN", 4, None])
def test_a_bad_upsample_format_names_the_command_and_the_choices(bad):
    with pytest.raises(CommandError, match=r"upsample: format is .*'NCHW'"):
        ops.upsample(format=bad)(X)
