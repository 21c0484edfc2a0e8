"""Pooling against NumPy loops (padding never wins a max, never counts in a mean)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fnnc import ops
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
    with pytest.raises(ShapeError, match=r"window=.*2 spatial axes"):
        ops.max_pool(window=(2, 2, 2))(rand([1, 4, 4, 1]))
    # NNC's 3-d HWC image: rank 3 is [batch, length, channels] here, and the error says so
    with pytest.raises(ShapeError, match=r"a rank-3 input has 1; .* batch axis of 1, x\[None\]"):
        ops.avg_pool(window=(3, 3))(rand([5, 5, 4]))
    with pytest.raises(DTypeError):
        ops.max_pool()(np.ones((1, 4, 4, 1), np.int32))
