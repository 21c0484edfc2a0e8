"""Pool family: max_pool and avg_pool (NNC's MAX_POOL and AVERAGE_POOL), and sum_pool.

Inputs are channels-last ``[batch, spatial..., channels]`` (NHWC for 2-D); the number of
spatial axes is the rank minus 2, or the length of a ``window``/``strides`` tuple: an
input one rank below that many spatial axes + 2 is one sample without the batch axis
(HWC for a 2-D window, as NNC's 3-d tensors), and so is the result. ``window``,
``strides`` (default: the window) and ``padding`` take one int for every axis or one
entry per axis; ``padding`` also takes ``"SAME"`` / ``"VALID"``. Padded cells never win
a max and are not counted in an average: NNC's
``lib/nnc/cmd/pool/ccv_nnc_avg_pool_cpu_ref.c`` divides each sum by the number of cells
of the window inside the input (``m[0] * m[1]``). ``sum_pool`` (not an NNC command) is
the window sum that Flax's ``avg_pool`` divides by the window size, so traced Flax
models map to commands with the very same values in float32. ``avg_pool`` and
``sum_pool`` add 16-bit windows in float32 and round once, as ``jnp.mean`` does (a
``reduce_window`` in bfloat16 drifts by a few percent over a 16x16 window, and one in
float16 overflows), so there they are closer to the exact sums than JAX's; so does
``max_pool``'s backward, where a cell that is the maximum of overlapping windows sums
their gradients.

On CPU, ``max_pool`` runs as elementwise passes over one strided view per window cell:
the forward is their maximum, the backward replays XLA's ``select_and_scatter`` (the
gradient of ``reduce_window``) with masks and pads, the very same values and tie rule.
XLA:CPU runs ``select_and_scatter`` serially: 25 ms against 1 ms for a 2x2 pool of
64x28x28x32 (``benchmarks/cpu_vs_torch.py``). Other platforms keep ``reduce_window``
and its derived gradient.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import NOTHING, Spec, Uses, defcommand
from fnnc.core.dtypes import at_least_float32
from fnnc.errors import ShapeError
from fnnc.ops import _spatial
from fnnc.ops._rules import fail, require_float, show


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


def _one_sample(x, window, strides) -> bool:
    """Whether ``x`` is one sample without the batch axis: a ``window`` (or
    ``strides``) tuple names the spatial axes and ``x`` has one more axis than those."""
    given = window if isinstance(window, tuple) else strides
    return isinstance(given, tuple) and _spatial.one_sample(x, len(given) + 2)


def _pool_shape(name: str):
    def rule(x, *, window, strides, padding):
        if not _one_sample(x, window, strides):
            *_, sizes = _geometry(name, x, window, strides, padding)
            return Spec((x.shape[0], *sizes, x.shape[-1]), x.dtype)
        lifted = _spatial.add_batch(x)
        try:
            *_, sizes = _geometry(name, lifted, window, strides, padding)
        except ShapeError as e:
            raise ShapeError(
                f"{e} (one sample without a batch axis: x {show(x)} is taken as "
                f"{show(lifted)}; pass a batched x, or an int window for 1-D pools)"
            ) from None
        return Spec((*sizes, x.shape[-1]), x.dtype)

    return rule


def _per_sample(forward):
    """``forward`` of a pool that also takes one sample without the batch axis."""

    @functools.wraps(forward)
    def run(x, *, window=(2, 2), strides=None, padding=0):
        if _one_sample(x, window, strides):
            return forward(x[None], window=window, strides=strides, padding=padding)[0]
        return forward(x, window=window, strides=strides, padding=padding)

    return run


def _reduce(x, init, op, k, s, pads):
    # A NumPy init (not jnp) lets JAX see the max / add monoid and use its autodiff rules.
    return lax.reduce_window(
        x, np.array(init, x.dtype), op, (1, *k, 1), (1, *s, 1), ((0, 0), *pads, (0, 0))
    )


@defcommand(family="pool", shape=_pool_shape("max_pool"), uses=Uses(inputs=(0,)))
@_per_sample
def max_pool(x, *, window=(2, 2), strides=None, padding=0):
    """Maximum over each window; padded cells never win.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.max_pool()(jnp.arange(16.0).reshape(1, 4, 4, 1))[0, :, :, 0]
    Array([[ 5.,  7.],
           [13., 15.]], dtype=float32)
    """
    k, s, pads, out = _geometry("max_pool", x, window, strides, padding)
    if jax.default_backend() == "cpu":
        # The same maxima as reduce_window's (max is exact, NaN wins in both), but as
        # one fused elementwise pass over strided views, which XLA:CPU runs faster and
        # fuses with the activation before it.
        return _max_of_cells(x, tuple(k), tuple(s), tuple(map(tuple, pads)), tuple(out))
    return _reduce(x, -jnp.inf, lax.max, k, s, pads)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3, 4))
def _max_of_cells(x, k, s, pads, out):
    """The CPU forward: the maximum of the window cells. Its JAX derivative is
    ``reduce_window``'s (each window's tangent at the cell ``select_and_scatter`` picks,
    its first maximum), not ``jnp.maximum``'s, which splits a tie: ``jax.grad`` of a
    graph run by ``interpret`` or ``compile`` then equals ``jax.grad`` of the pool."""
    _, cells = _window_cells(x, k, s, pads, out)
    return functools.reduce(jnp.maximum, cells)


@_max_of_cells.defjvp
def _max_of_cells_jvp(k, s, pads, out, primals, tangents):
    (x,), (t,) = primals, tangents
    _, cells = _window_cells(x, k, s, pads, out)
    _, moved = _window_cells(t, k, s, pads, out, fill=0)
    kept, tangent = cells[0], moved[0]
    for cell, dt in zip(cells[1:], moved[1:]):  # _max_pool_scatter's scan
        move = ~(kept >= cell)
        kept = jnp.where(move, cell, kept)
        tangent = jnp.where(move, dt, tangent)
    return functools.reduce(jnp.maximum, cells), tangent


def _window_cells(x, k, s, pads, out, fill=-np.inf):
    """One strided view ``[N, out..., C]`` per window cell (row-major), padded with
    ``fill`` (-inf: a padded cell never wins a maximum)."""
    n, c = x.shape[0], x.shape[-1]
    # Pad the high side up to the last window's end too, so every view is in bounds.
    hi = [max(h, (m - 1) * si + ki - lo - size) for (lo, h), m, si, ki, size in
          zip(pads, out, s, k, x.shape[1:-1])]  # fmt: skip
    spec = ((0, 0, 0), *((lo, h, 0) for (lo, _), h in zip(pads, hi)), (0, 0, 0))
    xp = lax.pad(x, np.array(fill, x.dtype), spec)
    cells = []
    for off in itertools.product(*(range(ki) for ki in k)):
        limit = tuple(o + (m - 1) * si + 1 for o, m, si in zip(off, out, s))
        cells.append(lax.slice(xp, (0, *off, 0), (n, *limit, c), (1, *s, 1)))
    return xp.shape[1:-1], cells


def _max_pool_scatter(g, x, k, s, pads, out):
    """XLA's ``select_and_scatter`` (select ``>=``) as masks and strided pads.

    Each window keeps its first cell and moves to a later one exactly when
    ``not (kept >= candidate)``, the scan XLA's ``SelectAndScatter`` runs (so ties go to
    the first maximum, a NaN wins as there, and padded cells take part as -inf); every
    window's gradient goes to its selected cell. XLA:CPU runs that op serially, several
    times slower than these elementwise passes, which it fuses.
    """
    padded, cells = _window_cells(x, k, s, pads, out)
    kept, index = cells[0], jnp.zeros(g.shape, np.int32)
    for t, cell in enumerate(cells[1:], 1):
        move = ~(kept >= cell)
        kept = jnp.where(move, cell, kept)
        index = jnp.where(move, np.int32(t), index)
    zero = np.array(0, g.dtype)
    picked = [jnp.where(index == t, g, zero) for t in range(len(cells))]
    if tuple(s) == tuple(k):
        return _interleave(picked, x.shape, k, pads, out)
    acc = None
    for piece, off in zip(picked, itertools.product(*(range(ki) for ki in k))):
        spec = [(o, p - o - (m - 1) * si - 1, si - 1) for o, p, m, si in zip(off, padded, out, s)]
        piece = lax.pad(piece, zero, ((0, 0, 0), *spec, (0, 0, 0)))
        acc = piece if acc is None else acc + piece
    start = (0, *(lo for lo, _ in pads), 0)
    limit = (x.shape[0], *(lo + n for n, (lo, _) in zip(x.shape[1:-1], pads)), x.shape[-1])
    return lax.slice(acc, start, limit)


def _interleave(picked, shape, k, pads, out):
    """Non-overlapping windows (strides == window): each cell's gradient is its window's
    masked gradient, so the pieces interleave by a reshape and a transpose (no sums)."""
    nd = len(k)
    stacked = jnp.stack(picked, axis=-2)  # [N, out..., K, C]
    grid = jnp.reshape(stacked, (shape[0], *out, *k, shape[-1]))
    order = (0, *itertools.chain(*((1 + i, 1 + nd + i) for i in range(nd))), 2 * nd + 1)
    full = jnp.reshape(
        jnp.transpose(grid, order), (shape[0], *(m * ki for m, ki in zip(out, k)), shape[-1])
    )
    # Crop the low padding and the cells past the input; cells no window reads get 0.
    spec = [(-lo, n + lo - m * ki, 0) for n, (lo, _), m, ki in zip(shape[1:-1], pads, out, k)]
    return lax.pad(full, np.array(0, full.dtype), ((0, 0, 0), *spec, (0, 0, 0)))


@max_pool.backward
def _max_pool_backward(grads, inputs, outputs, *, window, strides, padding):
    (g,), (x,) = grads, inputs
    if _one_sample(x, window, strides):
        lifted = (None if g is None else g[None],), (x[None],), outputs
        return (_max_pool_backward(*lifted, window=window, strides=strides, padding=padding)[0][0],)
    k, s, pads, out = _geometry("max_pool", x, window, strides, padding)
    if g is None:
        return (jnp.zeros(x.shape, x.dtype),)
    # A cell that is the maximum of several overlapping windows sums their gradients:
    # 16-bit ones are summed in float32 and rounded once (a bfloat16 sum of 25 shares,
    # window 5 stride 1, was up to 1.8 ulps off). The selection is the same in float32.
    wide = at_least_float32(x.dtype)
    if jax.default_backend() == "cpu":
        return (_max_pool_scatter(g.astype(wide), x, k, s, pads, out).astype(x.dtype),)
    f = functools.partial(_reduce, init=-jnp.inf, op=lax.max, k=k, s=s, pads=pads)
    return (jax.vjp(f, x.astype(wide))[1](g.astype(wide))[0].astype(x.dtype),)


def _window_counts(sizes, pads, k, s, out) -> np.ndarray:
    """How many cells of each window lie inside the input, shaped [1, out..., 1]."""
    counts = np.ones((), np.int64)
    for n, (lo, _), ki, si, m in zip(sizes, pads, k, s, out):
        start = np.arange(m) * si - lo
        c = np.minimum(start + ki, n) - np.maximum(start, 0)
        counts = np.multiply.outer(counts, c)
    return counts.reshape((1, *out, 1))


def _window_sums(x, k, s, pads):
    """Window sums in :func:`~fnnc.core.dtypes.at_least_float32`: a 16-bit running sum
    drifts (bfloat16 keeps 8 bits: a 16x16 mean can be off by 4%) and float16 overflows
    (32x32 cells of 100 give inf), so 16-bit windows add in float32, rounded once by
    the caller. The backward, the transpose of this map, also runs in float32."""
    return _reduce(x.astype(at_least_float32(x.dtype)), 0, lax.add, k, s, pads)


@defcommand(family="pool", shape=_pool_shape("avg_pool"), uses=NOTHING)
@_per_sample
def avg_pool(x, *, window=(2, 2), strides=None, padding=0):
    """Mean over each window, counting only cells inside the input (NNC's AVERAGE_POOL);
    16-bit floats are summed and divided in float32 and rounded once, as ``jnp.mean``.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.avg_pool(window=3, strides=1, padding=1)(jnp.ones((1, 3, 3, 1)))[0, :, :, 0]
    Array([[1., 1., 1.],
           [1., 1., 1.],
           [1., 1., 1.]], dtype=float32)
    """
    k, s, pads, out = _geometry("avg_pool", x, window, strides, padding)
    sums = _window_sums(x, k, s, pads)
    counts = jnp.asarray(_window_counts(x.shape[1:-1], pads, k, s, out), sums.dtype)
    return (sums / counts).astype(x.dtype)


def _transposed(factory):
    """The backward of a linear pool (average, sum): the transpose of its forward, which
    needs no values."""

    def backward(grads, inputs, outputs, *, window, strides, padding):
        (g,), (x,) = grads, inputs
        f = functools.partial(
            factory.definition.forward, window=window, strides=strides, padding=padding
        )
        return jax.linear_transpose(f, Spec(x.shape, x.dtype))(g.astype(x.dtype))

    return backward


avg_pool.backward(_transposed(avg_pool))


@defcommand(family="pool", shape=_pool_shape("sum_pool"), uses=NOTHING)
@_per_sample
def sum_pool(x, *, window=(2, 2), strides=None, padding=0):
    """Sum over each window; padded cells add zero (JAX's ``reduce_window`` with ``add``,
    which Flax's ``avg_pool`` divides by the window size). 16-bit floats are summed in
    float32 and rounded once.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.sum_pool()(jnp.arange(16.0).reshape(1, 4, 4, 1))[0, :, :, 0]
    Array([[10., 18.],
           [42., 50.]], dtype=float32)
    """
    k, s, pads, _ = _geometry("sum_pool", x, window, strides, padding)
    return _window_sums(x, k, s, pads).astype(x.dtype)


sum_pool.backward(_transposed(sum_pool))
