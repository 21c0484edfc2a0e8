"""Convolutions against a NumPy loop and against jax.vjp; their error messages."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.core.command import output_specs
from fnnc.errors import DTypeError, ShapeError
from tests.helpers import assert_close, rand


def _conv2d_loop(x, w, b, stride, pads, dil, groups):
    """NHWC convolution with weight [out, kh, kw, in/groups], one output at a time."""
    n, h, wd, _ = x.shape
    o, kh, kw, cg = w.shape
    xp = np.pad(x, ((0, 0), pads[0], pads[1], (0, 0))).astype(np.float64)
    oh = (h + sum(pads[0]) - (kh - 1) * dil[0] - 1) // stride[0] + 1
    ow = (wd + sum(pads[1]) - (kw - 1) * dil[1] - 1) // stride[1] + 1
    y = np.zeros((n, oh, ow, o))
    for bi, i, j, oc in itertools.product(range(n), range(oh), range(ow), range(o)):
        g = oc // (o // groups)
        for di, dj in itertools.product(range(kh), range(kw)):
            cell = xp[
                bi, i * stride[0] + di * dil[0], j * stride[1] + dj * dil[1], g * cg : (g + 1) * cg
            ]
            y[bi, i, j, oc] += cell @ w[oc, di, dj]
        y[bi, i, j, oc] += 0 if b is None else b[oc]
    return y


@pytest.mark.parametrize(
    "x_shape, w_shape, bias, kw",
    [
        ([2, 4, 5, 3], [2, 3, 3, 3], True, dict()),
        (
            [1, 6, 5, 4],
            [4, 3, 2, 2],
            False,
            dict(strides=(2, 1), padding=((1, 1), (0, 2)), dilation=(1, 2), groups=2),
        ),
        ([1, 5, 5, 3], [3, 1, 1, 1], True, dict(padding=1, groups=3)),
    ],
)
def test_convolution_matches_numpy_loop(x_shape, w_shape, bias, kw) -> None:
    x, w = rand(x_shape), rand(w_shape, seed=1)
    b = rand([w_shape[0]], seed=2) if bias else None
    got = ops.convolution(**kw)(x, w, *([b] if bias else []))
    nd = 2
    norm = lambda v, d: (v,) * nd if isinstance(v, int) else v
    pads = tuple((p, p) if isinstance(p, int) else p for p in norm(kw.get("padding", 0), 0))
    want = _conv2d_loop(
        x,
        w,
        b,
        norm(kw.get("strides", 1), 1),
        pads,
        norm(kw.get("dilation", 1), 1),
        kw.get("groups", 1),
    )
    assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_convolution_same_padding_keeps_size_and_1d_3d_work() -> None:
    assert ops.convolution(padding="SAME")(rand([1, 5, 7, 2]), rand([4, 3, 3, 2])).shape == (
        1,
        5,
        7,
        4,
    )
    assert ops.convolution(strides=2, padding="SAME")(
        rand([1, 5, 7, 2]), rand([4, 3, 3, 2])
    ).shape == (1, 3, 4, 4)
    x1, w1 = rand([2, 9, 3]), rand([5, 3, 3], seed=1)
    y1 = ops.convolution(strides=2)(x1, w1)
    want = _conv2d_loop(x1[:, None], w1[:, None], None, (1, 2), ((0, 0), (0, 0)), (1, 1), 1)[:, 0]
    assert_close(y1, want, rtol=1e-5, atol=1e-5)
    assert ops.convolution(padding=1)(rand([1, 3, 4, 5, 2]), rand([3, 3, 3, 3, 2])).shape == (
        1,
        3,
        4,
        5,
        3,
    )


@pytest.mark.parametrize(
    "x_shape, w_shape, kw, output_padding",
    [
        ([1, 6, 7, 3], [4, 3, 3, 3], dict(strides=2, padding=((1, 0), (2, 1))), (0, 1)),
        ([1, 5, 5, 4], [6, 2, 2, 2], dict(padding="SAME", dilation=2, groups=2), 0),
        ([1, 6, 6, 2], [2, 3, 3, 2], dict(strides=2, padding="SAME"), 0),
        ([2, 9, 3], [2, 4, 3], dict(strides=(3,), dilation=(2,), padding=((2, 1),)), (2,)),
        ([1, 4, 3, 4, 2], [3, 2, 2, 2, 2], dict(strides=(2, 1, 2)), 0),
    ],
)
def test_convolution_transpose_is_the_adjoint_of_convolution(
    x_shape, w_shape, kw, output_padding
) -> None:
    x, w = rand(x_shape), rand(w_shape, seed=1)
    y, pullback = jax.vjp(
        lambda x_: ops.convolution(**kw).definition.forward(x_, w, **ops.convolution(**kw).kwargs),
        x,
    )
    g = rand(y.shape, seed=2)
    (want,) = pullback(jnp.asarray(g))
    got = ops.convolution_transpose(**kw, output_padding=output_padding)(g, w)
    assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_convolution_transpose_bias_and_shapes() -> None:
    x, w, b = rand([1, 4, 4, 8]), rand([8, 3, 3, 3], seed=1), rand([3], seed=2)
    y = ops.convolution_transpose(strides=2, padding="SAME")(x, w, b)
    assert y.shape == (1, 8, 8, 3)
    assert_close(
        y - ops.convolution_transpose(strides=2, padding="SAME")(x, w),
        np.broadcast_to(b, y.shape),
        atol=1e-5,
    )
    assert ops.convolution_transpose(groups=2)(rand([1, 3, 3, 4]), rand([4, 3, 3, 5])).shape == (
        1,
        5,
        5,
        10,
    )


def test_convolution_errors_say_what_to_do() -> None:
    with pytest.raises(
        ShapeError,
        match=r"weight float32\[8, 3, 3, 4\] expects 4 input channels "
        r".*got x float32\[2, 8, 8, 3\]",
    ):
        ops.convolution()(rand([2, 8, 8, 3]), rand([8, 3, 3, 4]))
    with pytest.raises(ShapeError, match="groups=3"):
        ops.convolution(groups=3)(rand([1, 5, 5, 6]), rand([8, 3, 3, 2]))
    with pytest.raises(ShapeError, match=r"strides=.*1 spatial axes"):
        ops.convolution(strides=(1, 1))(rand([1, 8, 3]), rand([4, 3, 3]))
    with pytest.raises(ShapeError, match=r"or \[spatial\.\.\., channels\] for one sample"):
        ops.convolution()(rand([8, 3]), rand([4, 3, 3, 3]))
    with pytest.raises(ShapeError, match="does not fit spatial size 2"):
        ops.convolution()(rand([1, 2, 2, 3]), rand([4, 3, 3, 3]))
    with pytest.raises(ShapeError, match=r"bias float32\[3\] must be \[4\]"):
        ops.convolution()(rand([1, 5, 5, 3]), rand([4, 3, 3, 3]), rand([3]))
    with pytest.raises(DTypeError, match="floating-point"):
        ops.convolution()(np.ones((1, 5, 5, 3), np.int32), np.ones((4, 3, 3, 3), np.int32))
    with pytest.raises(ShapeError, match="output_padding"):
        ops.convolution_transpose(strides=2, output_padding=2)(
            rand([1, 3, 3, 4]), rand([4, 3, 3, 3])
        )
    with pytest.raises(ShapeError, match="expects 4 input channels"):
        ops.convolution_transpose()(rand([1, 3, 3, 3]), rand([4, 3, 3, 3]))


@pytest.mark.parametrize("transpose", [False, True], ids=["convolution", "transpose"])
def test_one_sample_without_a_batch_axis_is_the_batch_of_one(transpose: bool) -> None:
    """NNC's 3-d tensors: x [H, W, C] (one rank below the weight) is one image; the
    result, its shape rule and the gradients of x, w and bias are those of x[None]
    with the batch axis dropped (jax.vjp of lax's convolution as the oracle)."""
    make = ops.convolution_transpose if transpose else ops.convolution
    cmd = make(strides=2, padding=((1, 1), (0, 1)))
    x, w, b = rand([7, 6, 4]), rand([4, 3, 2, 3] if transpose else [5, 3, 2, 4], seed=1), None
    b = rand([3 if transpose else 5], seed=2)
    y = cmd(x, w, b)
    batched = cmd(x[None], w, b)
    assert y.shape == batched.shape[1:] == output_specs(cmd, [x, w, b])[0].shape
    assert_close(y, batched[0], rtol=0, atol=0)
    g = rand(y.shape, seed=3)
    got = cmd.definition.backward((g,), (x, w, b), (y,), **cmd.kwargs)
    _, pullback = jax.vjp(
        lambda x_, w_, b_: cmd.definition.forward(x_[None], w_, b_, **cmd.kwargs)[0], x, w, b
    )
    for a_, w_ in zip(got, pullback(jnp.asarray(g))):
        assert_close(a_, w_, rtol=1e-5, atol=1e-5)


def test_numpy_ints_are_ints_in_spatial_arguments():
    """np.int64(2) (from np.arange, shape // 2) is accepted wherever 2 is, the same numbers."""
    x, w, b = rand([1, 5, 5, 4]), rand([4, 3, 3, 2]), rand([4])
    i = np.int64
    got = ops.convolution(strides=i(2), padding=(i(1), (i(0), i(1))), dilation=i(1), groups=i(2))
    y = np.asarray(got(x, w, b))
    want = _conv2d_loop(x, w, b, (2, 2), ((1, 1), (0, 1)), (1, 1), 2)
    assert_close(y, want, rtol=1e-5, atol=1e-5)
    p = np.asarray(ops.max_pool(window=i(2), strides=(i(1), i(2)), padding=i(0))(x))
    assert_close(p, ops.max_pool(window=2, strides=(1, 2), padding=0)(x))
    assert str(got) == "convolution[strides=2, padding=(1,(0,1)), groups=2]"


def _conv2d_t_loop(x, w, stride, dil, groups, size):
    """NHWC transposed convolution as a float64 scatter: every x cell adds ``x * w`` into
    the window it came from; SAME crops TensorFlow's pads and pads up to ``size`` with 0."""
    n, h, wd, o = x.shape
    _, kh, kw, cg = w.shape
    keff = [(k - 1) * d + 1 for k, d in zip((kh, kw), dil)]
    full = [(m - 1) * s + k for m, s, k in zip((h, wd), stride, keff)]
    pads = [max((m - 1) * s + k - m * s, 0) for m, s, k in zip((h, wd), stride, keff)]
    lows = [p // 2 for p in pads]
    y = np.zeros((n, *(max(f, lo + z) for f, lo, z in zip(full, lows, size)), cg * groups))
    for bi, i, j, oc in itertools.product(range(n), range(h), range(wd), range(o)):
        g = oc // (o // groups)
        for di, dj in itertools.product(range(kh), range(kw)):
            r, c = i * stride[0] + di * dil[0], j * stride[1] + dj * dil[1]
            y[bi, r, c, g * cg : (g + 1) * cg] += x[bi, i, j, oc] * w[oc, di, dj].astype(np.float64)
    return y[:, lows[0] : lows[0] + size[0], lows[1] : lows[1] + size[1]]


@pytest.mark.parametrize(
    "x_shape, w_shape, kw",
    [
        ([2, 3, 3, 4], [4, 1, 1, 3], dict(strides=2)),  # the 1x1 stride-2 projection
        ([1, 3, 2, 4], [4, 2, 1, 2], dict(strides=(3, 2))),
        ([1, 2, 3, 2], [2, 2, 2, 3], dict(strides=(4, 1), dilation=(2, 1))),  # 3 < 4, 2 > 1
        ([1, 2, 3, 4], [4, 1, 2, 3], dict(strides=(2, 3), groups=2)),
    ],
)
def test_convolution_transpose_same_with_kernel_smaller_than_stride(x_shape, w_shape, kw) -> None:
    """SAME gives x * stride even when the dilated kernel is smaller than the stride (no
    pads then): the cells past the last window are 0, forward (NumPy scatter oracle) and
    backward (the convolution loop, the adjoint, and jax.vjp of the forward)."""
    cmd = ops.convolution_transpose(padding="SAME", **kw)
    x, w = rand(x_shape), rand(w_shape, seed=1)
    s = (kw["strides"],) * 2 if isinstance(kw["strides"], int) else kw["strides"]
    dil, groups = kw.get("dilation", (1, 1)), kw.get("groups", 1)
    size = (x_shape[1] * s[0], x_shape[2] * s[1])
    y = cmd(x, w)
    assert (
        y.shape == output_specs(cmd, [x, w])[0].shape == (x_shape[0], *size, w_shape[-1] * groups)
    )
    assert_close(y, _conv2d_t_loop(x, w, s, dil, groups, size), rtol=1e-5, atol=1e-5)
    g = rand(y.shape, seed=2)
    gx, gw = cmd.definition.backward((g,), (x, w), (y,), **cmd.kwargs)
    keff = [(k - 1) * d + 1 for k, d in zip(w_shape[1:3], dil)]
    total = [max(k - si, 0) for k, si in zip(keff, s)]
    pads = tuple((t // 2, t - t // 2) for t in total)
    assert_close(gx, _conv2d_loop(g, w, None, s, pads, dil, groups), rtol=1e-5, atol=1e-5)
    _, pullback = jax.vjp(lambda x_, w_: cmd.definition.forward(x_, w_, **cmd.kwargs), x, w)
    assert_close((gx, gw), pullback(jnp.asarray(g)), rtol=1e-5, atol=1e-5)
