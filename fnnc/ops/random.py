"""Random family: dropout, random_uniform, random_normal (NNC's DROPOUT, RANDOM_UNIFORM,
RANDOM_NORMAL), and random_split (fnnc's: keys for the blocks of a loop).

Randomness comes from an explicit key input so that graphs hold only plain arrays: a
key is the raw ``uint32[2]`` data of a threefry key,
``jax.random.key_data(jax.random.key(0))``. The same key gives the same numbers, so a
recomputed (rematerialised) dropout repeats its mask. All three commands are marked
``random`` (CSE never merges two of them).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.core.command import NOTHING, Spec, Uses, defcommand
from fnnc.core.dtypes import at_least_float32
from fnnc.core.keys import is_key
from fnnc.errors import CommandError, DTypeError
from fnnc.ops._rules import fail, jax_dtype, require_float, show

_IMPL = "threefry2x32"


def _check_key(name: str, key) -> None:
    typed = is_key(key)
    if typed or np.dtype(key.dtype) != np.uint32:
        raise DTypeError(
            f"{name}: key {show(key)} must be uint32[2] key data; "
            "pass jax.random.key_data(jax.random.key(seed))"
        )
    if tuple(key.shape) != (2,):
        fail(f"{name}: key {show(key)} must be uint32[2] key data (one threefry key)")


def _key(key):
    return jax.random.wrap_key_data(key, impl=_IMPL)


def _dropout_shape(x, key, *, p, entirety):
    require_float("dropout", x)
    _check_key("dropout", key)
    if not 0.0 <= p < 1.0:
        raise CommandError(f"dropout: p={p!r} must be in [0, 1)")
    return Spec(x.shape, x.dtype), Spec(x.shape, x.dtype)


@defcommand(family="random", shape=_dropout_shape, uses=Uses(inputs=(), outputs=(1,)), random=True)
def dropout(x, key, *, p=0.5, entirety=False):
    """Zeroes each entry with probability ``p`` and scales the rest by ``1 / (1 - p)``.

    Returns ``(y, mask)`` where ``mask`` (in ``x``'s dtype) is 1 where kept and
    ``y = x * mask / (1 - p)``. ``entirety=True`` keeps or drops the whole tensor at
    once (NNC's ``entirety`` option). The backward reads only the mask.

    >>> import jax, jax.numpy as jnp
    >>> from fnnc import ops
    >>> key = jax.random.key_data(jax.random.key(0))
    >>> y, mask = ops.dropout(p=0.5)(jnp.ones((2, 3)), key)
    >>> bool(jnp.all(y == 2 * mask))
    True
    """
    shape = () if entirety else x.shape
    # float32 draws whatever x's dtype or the x64 flag: the mask depends on key and shape only.
    keep = jax.random.bernoulli(_key(key), jnp.float32(1.0 - p), shape)
    mask = jnp.broadcast_to(keep.astype(x.dtype), x.shape)
    return _scaled(x, mask, p), mask


def _scaled(t, mask, p: float):
    """``t * mask / (1 - p)``, in float32 at least and rounded to t's type once: a
    16-bit ``1 / (1 - p)`` is rounded itself (bfloat16 1/0.9 = 1.109375), which scaled
    every kept value 0.16% low, biasing the expectation dropout keeps."""
    wide = at_least_float32(t.dtype)
    scale = jnp.asarray(1.0 / (1.0 - p), wide)
    return (t.astype(wide) * mask.astype(wide) * scale).astype(t.dtype)


@dropout.backward
def _dropout_backward(grads, inputs, outputs, *, p, entirety):
    (g, _), (_, mask) = grads, outputs
    return (None if g is None else _scaled(g, mask, p)), None


def _sample_shape(name: str):
    def rule(key, *, shape, dtype, **params):
        _check_key(name, key)
        if not isinstance(shape, tuple) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise CommandError(f"{name}: shape={shape!r} must be a tuple of ints >= 0")
        spec = Spec(shape, jax_dtype(dtype))  # x64 off: float64 samples are float32
        require_float(name, spec)
        return spec

    return rule


@defcommand(
    family="random",
    shape=_sample_shape("random_uniform"),
    uses=NOTHING,
    random=True,
    differentiable=False,
)
def random_uniform(key, *, shape, dtype="float32", low=0.0, high=1.0):
    """Uniform samples in ``[low, high)`` of the given ``shape`` and float ``dtype``;
    with ``low > high``, in ``[high, low)``, as NNC's ``r * high + (1 - r) * low``
    samples between them either way (``jax.random.uniform`` gives all ``low`` then).

    >>> import jax
    >>> from fnnc import ops
    >>> ops.random_uniform(shape=(2, 3))(jax.random.key_data(jax.random.key(0))).shape
    (2, 3)
    """
    low, high = min(low, high), max(low, high)
    dtype = jax_dtype(dtype)
    wide = at_least_float32(dtype)
    u = jax.random.uniform(_key(key), shape, wide, low, high)
    if wide == dtype:
        return u
    # 16-bit: drawn in float32 and rounded once, as NNC writes a float draw into a 16-bit
    # tensor (jax.random.uniform in bfloat16 fills its 7-bit mantissa: 128 values in
    # [0, 1)); a draw that rounds up to high is kept below it (stepping toward low:
    # float8_e4m3fn has no -inf, its -inf is NaN)
    y, top, bottom = u.astype(dtype), jnp.asarray(high, dtype), jnp.asarray(low, dtype)
    below = jnp.maximum(jnp.nextafter(top, bottom), bottom)
    return jnp.where(y >= top, below, y)


@defcommand(
    family="random",
    shape=_sample_shape("random_normal"),
    uses=NOTHING,
    random=True,
    differentiable=False,
)
def random_normal(key, *, shape, dtype="float32", mean=0.0, std=1.0):
    """Normal samples ``mean + std * N(0, 1)`` of the given ``shape`` and float ``dtype``
    (16-bit ones drawn and scaled in float32 and rounded once, as NNC writes a float draw
    into a 16-bit tensor: a bfloat16 draw has a 7-bit mantissa's values only)."""
    dtype = jax_dtype(dtype)
    wide = at_least_float32(dtype)
    z = jax.random.normal(_key(key), shape, wide)
    return (z * jnp.asarray(std, wide) + jnp.asarray(mean, wide)).astype(dtype)


def _split_shape(key, *, n):
    _check_key("random_split", key)
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise CommandError(f"random_split: n={n!r} must be an int >= 1")
    return Spec((int(n), 2), np.dtype(np.uint32))


@defcommand(family="random", shape=_split_shape, uses=NOTHING, differentiable=False)
def random_split(key, *, n):
    """``n`` independent keys ``uint32[n, 2]`` from one, as ``jax.random.split``: row
    ``i`` is ``key_data(split(key, n)[i])``. A loop over blocks
    (:class:`~fnnc.models.Repeat`) slices one key per block from it, so each block's
    dropout draws its own mask. Deterministic: the same key gives the same rows.

    >>> import jax
    >>> from fnnc import ops
    >>> keys = ops.random_split(n=3)(jax.random.key_data(jax.random.key(0)))
    >>> keys.shape, str(keys.dtype)
    ((3, 2), 'uint32')
    """
    return jax.random.key_data(jax.random.split(_key(key), n))


def fold_keys(keys, data):
    """Key data ``keys`` (``uint32[..., 2]``) with the integer ``data`` folded into each
    (``jax.random.fold_in``): a fresh, independent stream per value of ``data``, the same
    one each time. A pipelined loop (:mod:`fnnc.ops.pipeline`) folds the microbatch into
    each block's key, so every microbatch draws its own dropout mask.

    >>> import jax
    >>> keys = jax.random.key_data(jax.random.split(jax.random.key(0), 3))
    >>> fold_keys(keys, 1).shape
    (3, 2)
    """
    flat = keys.reshape(-1, keys.shape[-1])
    folded = jax.vmap(lambda k: jax.random.key_data(jax.random.fold_in(_key(k), data)))(flat)
    return folded.reshape(keys.shape)
