"""Pool family: max_pool and avg_pool (NNC's MAX_POOL and AVERAGE_POOL).

Inputs are channels-last ``[batch, spatial..., channels]`` (NHWC for 2-D); the number
of spatial axes is the rank minus 2. ``window``, ``strides`` (default: the window)
and ``padding`` take one int for every axis or one entry per axis; ``padding`` also
takes ``"SAME"`` / ``"VALID"``. Padded cells never win a max and are not counted in
an average: NNC's ``lib/nnc/cmd/pool/ccv_nnc_avg_pool_cpu_ref.c`` divides each sum by
the number of cells of the window inside the input (``m[0] * m[1]``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.ops import _spatial
from fnnc.ops._rules import fail, require_float, show
from fnnc.core.command import NOTHING, Spec, Uses, defcommand


def _geometry(name: str, x, window, strides, padding):
    """(window, strides, explicit pads, output sizes) of a pool over ``x``."""
    if x.ndim < 3:
        fail(
            f"{name}: x {show(x)} must be [batch, spatial..., channels] "
            "with at least one spatial axis"
        )
    require_float(name, x)
    nd = x.ndim - 2
    k = _spatial.ints(name, "window", window, nd)
    s = k if strides is None else _spatial.ints(name, "strides", strides, nd)
    pads = _spatial.explicit(_spatial.padding_of(name, padding, nd), x.shape[1:-1], k, s)
    if any(lo >= ki or hi >= ki for (lo, hi), ki in zip(pads, k)):
        fail(f"{name}: padding {pads} must be smaller than the window {k} on every axis")
    return k, s, pads, _spatial.out_sizes(name, show(x), x.shape[1:-1], pads, k, s)


def _pool_shape(name: str):
    def rule(x, *, window, strides, padding):
        *_, sizes = _geometry(name, x, window, strides, padding)
        return Spec((x.shape[0], *sizes, x.shape[-1]), x.dtype)

    return rule


def _reduce(x, init, op, k, s, pads):
    # A NumPy init (not jnp) lets JAX see the max / add monoid and use its autodiff rules.
    return lax.reduce_window(
        x, np.array(init, x.dtype), op, (1, *k, 1), (1, *s, 1), ((0, 0), *pads, (0, 0))
    )


@defcommand(family="pool", shape=_pool_shape("max_pool"), uses=Uses(inputs=(0,)))
def max_pool(x, *, window=(2, 2), strides=None, padding=0):
    """Maximum over each window; padded cells never win.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.max_pool()(jnp.arange(16.0).reshape(1, 4, 4, 1))[0, :, :, 0]
    Array([[ 5.,  7.],
           [13., 15.]], dtype=float32)
    """
    k, s, pads, _ = _geometry("max_pool", x, window, strides, padding)
    return _reduce(x, -jnp.inf, lax.max, k, s, pads)


def _window_counts(sizes, pads, k, s, out) -> np.ndarray:
    """How many cells of each window lie inside the input, shaped [1, out..., 1]."""
    counts = np.ones((), np.int64)
    for n, (lo, _), ki, si, m in zip(sizes, pads, k, s, out):
        start = np.arange(m) * si - lo
        c = np.minimum(start + ki, n) - np.maximum(start, 0)
        counts = np.multiply.outer(counts, c)
    return counts.reshape((1, *out, 1))


@defcommand(family="pool", shape=_pool_shape("avg_pool"), uses=NOTHING)
def avg_pool(x, *, window=(2, 2), strides=None, padding=0):
    """Mean over each window, counting only cells inside the input (NNC's AVERAGE_POOL).

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.avg_pool(window=3, strides=1, padding=1)(jnp.ones((1, 3, 3, 1)))[0, :, :, 0]
    Array([[1., 1., 1.],
           [1., 1., 1.],
           [1., 1., 1.]], dtype=float32)
    """
    k, s, pads, out = _geometry("avg_pool", x, window, strides, padding)
    sums = _reduce(x, 0, lax.add, k, s, pads)
    return sums / jnp.asarray(_window_counts(x.shape[1:-1], pads, k, s, out), x.dtype)


@avg_pool.backward
def _avg_pool_backward(grads, inputs, outputs, *, window, strides, padding):
    # Average pooling is linear: its backward is its transpose, which needs no values.
    (g,), (x,) = grads, inputs
    f = functools.partial(
        avg_pool.definition.forward, window=window, strides=strides, padding=padding
    )
    return jax.linear_transpose(f, Spec(x.shape, x.dtype))(g)
