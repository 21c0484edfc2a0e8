"""Pooling against NumPy loops (padding never wins a max, never counts in a mean)."""

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


def _pool_loop(x, k, s, pads, reduce):
    """2-D pooling over the cells of each window that lie inside x."""
    n, h, w, c = x.shape
    oh = (h + sum(pads[0]) - k[0]) // s[0] + 1
    ow = (w + sum(pads[1]) - k[1]) // s[1] + 1
    y = np.zeros((n, oh, ow, c))
    for i, j in itertools.product(range(oh), range(ow)):
        r0, c0 = i * s[0] - pads[0][0], j * s[1] - pads[1][0]
        cells = x[:, max(r0, 0) : min(r0 + k[0], h), max(c0, 0) : min(c0 + k[1], w)]
        y[:, i, j] = reduce(cells, axis=(1, 2))
    return y


@pytest.mark.parametrize("reduce, cmd", [(np.max, ops.max_pool), (np.mean, ops.avg_pool)])
@pytest.mark.parametrize(
    "kw, k, s, pads",
    [
        (dict(), (2, 2), (2, 2), ((0, 0), (0, 0))),
        (dict(window=3, strides=2, padding=1), (3, 3), (2, 2), ((1, 1), (1, 1))),
        (
            dict(window=(3, 2), strides=1, padding=((2, 0), (1, 1))),
            (3, 2),
            (1, 1),
            ((2, 0), (1, 1)),
        ),
        (dict(window=3, strides=2, padding="SAME"), (3, 3), (2, 2), ((1, 1), (1, 1))),
    ],
)
def test_pool_matches_numpy_loop(reduce, cmd, kw, k, s, pads) -> None:
    x = rand([2, 5, 5, 3])
    assert_close(cmd(**kw)(x), _pool_loop(x, k, s, pads, reduce), rtol=1e-6, atol=1e-6)


def test_avg_pool_does_not_count_padding() -> None:
    # NNC divides by the cells inside the input: a constant input stays constant.
    y = ops.avg_pool(window=3, strides=1, padding=1)(np.full((1, 4, 4, 2), 5.0, np.float32))
    assert_close(y, np.full((1, 4, 4, 2), 5.0))


def test_pool_ranks_and_defaults() -> None:
    assert ops.max_pool(window=3)(rand([1, 6, 6, 1])).shape == (1, 2, 2, 1)
    assert ops.max_pool(window=2)(rand([2, 8, 3])).shape == (2, 4, 3)
    assert ops.avg_pool(window=2)(rand([1, 4, 4, 4, 2])).shape == (1, 2, 2, 2, 2)


def test_pool_errors() -> None:
    with pytest.raises(ShapeError, match="smaller than the window"):
        ops.max_pool(window=2, padding=2)(rand([1, 4, 4, 1]))
    with pytest.raises(ShapeError, match="at least one spatial axis"):
        ops.avg_pool()(rand([4, 4]))
    with pytest.raises(ShapeError, match=r"window=.*4 spatial axes"):
        ops.max_pool(window=(2, 2, 2))(rand([1, 4, 4, 4, 4, 1]))
    with pytest.raises(
        ShapeError, match=r"one sample without a batch axis: x float32\[1, 4, 4, 1\]"
    ):
        ops.max_pool(window=(2, 2, 2))(rand([1, 4, 4, 1]))
    with pytest.raises(DTypeError):
        ops.max_pool()(np.ones((1, 4, 4, 1), np.int32))


@pytest.mark.parametrize("name", ["max_pool", "avg_pool", "sum_pool"])
def test_one_sample_without_a_batch_axis_is_the_batch_of_one(name: str) -> None:
    """NNC's 3-d tensors: with a 2-D window, x [H, W, C] is one image; values, shape
    rule and gradient are those of x[None] with the batch axis dropped (jax.vjp of the
    batched forward as the oracle). An int window keeps rank 3 a batch of 1-D rows."""
    cmd = getattr(ops, name)(window=(3, 3), strides=(2, 2), padding=1)
    x = rand([7, 6, 4])
    y = cmd(x)
    assert y.shape == output_specs(cmd, [x])[0].shape == (4, 3, 4)
    assert_close(y, cmd(x[None])[0], rtol=0, atol=0)
    g = rand(y.shape, seed=1)
    (got,) = cmd.definition.backward((g,), (x,), (y,), **cmd.kwargs)
    _, pullback = jax.vjp(lambda v: cmd.definition.forward(v[None], **cmd.kwargs)[0], x)
    assert_close(got, pullback(jnp.asarray(g))[0], rtol=1e-6, atol=1e-6)
    assert getattr(ops, name)(window=2)(rand([2, 8, 3])).shape == (2, 4, 3)


def _pool_scatter(g, shape, k, s, pads, mean):
    """The transpose of ``_pool_loop``'s mean / sum: each window's ``g`` (over its count
    for a mean) added to every cell of it inside the input, in float64."""
    _, h, w, _ = shape
    gx = np.zeros(shape)
    for i, j in itertools.product(range(g.shape[1]), range(g.shape[2])):
        r0, c0 = i * s[0] - pads[0][0], j * s[1] - pads[1][0]
        rows, cols = slice(max(r0, 0), min(r0 + k[0], h)), slice(max(c0, 0), min(c0 + k[1], w))
        count = (rows.stop - rows.start) * (cols.stop - cols.start) if mean else 1
        gx[:, rows, cols] += np.asarray(g, np.float64)[:, i, j, None, None] / count
    return gx


# Half the spacing of 1 (round to nearest): one output rounding; a 2% margin for float32.
_ROUNDING = {jnp.bfloat16: 2.0**-8 * 1.02, np.float16: 2.0**-11 * 1.02}


@pytest.mark.parametrize("dtype", [jnp.bfloat16, np.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", ["avg_pool", "sum_pool"])
@pytest.mark.parametrize(
    "shape, k, s, pads",
    [
        ([2, 16, 16, 3], (16, 16), (16, 16), ((0, 0), (0, 0))),  # global pooling
        ([1, 9, 8, 2], (5, 5), (1, 1), ((2, 2), (2, 2))),  # overlapping, uneven counts
    ],
)
def test_16_bit_pools_sum_in_float32_and_round_once(name, dtype, shape, k, s, pads) -> None:
    """16-bit windows add in float32, forward and backward: each value is the float64
    NumPy oracle rounded once (positive values, so no cancellation inflates the error)."""
    cmd = getattr(ops, name)(window=k, strides=s, padding=pads)
    x = rand(shape, dtype, lo=0.5, hi=1.5)
    reduce = np.mean if name == "avg_pool" else np.sum
    y = cmd(x)
    assert y.dtype == dtype
    want = _pool_loop(np.asarray(x, np.float64), k, s, pads, reduce)
    np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=_ROUNDING[dtype], atol=0)
    g = rand(y.shape, dtype, seed=1, lo=0.5, hi=1.5)
    (gx,) = cmd.definition.backward((jnp.asarray(g),), (x,), (y,), **cmd.kwargs)
    assert gx.dtype == dtype
    want = _pool_scatter(g, shape, k, s, pads, mean=name == "avg_pool")
    np.testing.assert_allclose(np.asarray(gx, np.float64), want, rtol=_ROUNDING[dtype], atol=0)


def test_float16_avg_pool_of_a_large_window_does_not_overflow() -> None:
    # 32 * 32 * 100 is past float16's 65504; the mean is 100.
    y = ops.avg_pool(window=32)(np.full((1, 32, 32, 1), 100, np.float16))
    assert y.dtype == np.float16 and float(y[0, 0, 0, 0]) == 100.0
