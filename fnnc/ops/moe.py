"""Mixture-of-experts family: segmented_gemm, moe_routing and comm_all_to_all (NNC's
SEGMENTED_GEMM, MOE_ROUTING and COMM_ALL_TO_ALL).

The three make one MoE layer: ``moe_routing`` picks each token's top-k experts and
gathers the token rows sorted by expert; ``segmented_gemm`` multiplies each run of rows
by its expert's weights (one grouped GEMM, ``jax.lax.ragged_dot``); the routing
weights and token indices then combine the rows back per token. ``comm_all_to_all``
is the expert-parallel exchange between ranks.

Layouts follow NNC's ``lib/nnc/cmd/blas/ccv_nnc_segmented_gemm_cpu_ref.c`` and
``lib/nnc/cmd/moe_routing`` (liuliu/ccv):

* ``segmented_gemm(a [M, K], indices [G], counts [G], w [E, K, N], bias [E, N])``:
  rows ``off_n .. off_n + counts[n]`` (``off_n`` the sum of the earlier counts) of
  ``a`` are multiplied by expert ``indices[n]``; ``transpose_b`` takes ``w [E, N, K]``
  (NNC's ``TRANSPOSE(1, 2)``, the layout of dense weights). Rows past
  ``sum(counts)`` are zero (NNC leaves them unwritten); a segment may name any expert,
  in any order, more than once.
* ``moe_routing(logits [T, E], route, activation [T, D])``: per token the expert
  probabilities are ``sqrt(softplus(logits))``; without ``preselected`` the top
  ``kth`` of ``probability + route`` (``route [E]``, a bias, ties to the lower
  expert) are chosen, with it ``route [T, kth]`` int32 names them. Their weights are
  ``p / max(sum p, 2^-14) * weight_scale`` (NNC's; ``normalize=False``:
  ``p * weight_scale``, the chosen probabilities themselves, as Switch Transformer's
  top-1 gate). The ``T * kth`` (token, slot) pairs are
  sorted by expert, then token, then slot (a single token keeps slot order), giving
  ``(gathered [T*kth, D], route_weights [T*kth] f32, token_indices [T*kth] i32,
  expert_indices [G] i32, expert_counts [G] i32)`` with ``G = min(T*kth, E)``; groups
  past the last used expert are ``-1`` and ``0``. A preselected expert id outside
  ``[0, E)`` (``-1`` included) drops its pair: it has no probability in the sum, weight
  0, is counted in no group and is sorted after every valid pair (its row, past
  ``sum(expert_counts)``, is zero out of ``segmented_gemm``).

NNC has no backward for segmented_gemm on CPU nor for moe_routing; fnnc derives both
from ``jax.vjp`` of the reference, so a MoE layer trains: the gradient reaches the
expert weights (rows of a repeated expert add up), the gathered activations (scattered
back to their tokens) and, through the routing weights, the router's logits (the
expert choice itself is piecewise constant and has none). With NNC's renormalised
weights and ``kth=1`` every weight is ``p / p * weight_scale``, a constant: the logits
get no gradient and a top-1 router never trains; ``normalize=False`` keeps ``p`` in the
weight so they do.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import NOTHING, Spec, defcommand
from fnnc.core.dispatch import Backend, register_backend
from fnnc.errors import DTypeError
from fnnc.ops._rules import fail, require_float, require_same_dtype, show, summing_dtype


def _require_int32(name: str, what: str, spec: Spec) -> None:
    if np.dtype(spec.dtype) != np.int32:
        raise DTypeError(f"{name}: {what} must be int32, got {show(spec)}")


def _segmented_gemm_shape(a, indices, counts, w, bias=None, *, transpose_b):
    name = "segmented_gemm"
    require_float(name, a, w, *([bias] if bias is not None else []))
    require_same_dtype(name, a, w, *([bias] if bias is not None else []))
    _require_int32(name, "indices", indices)
    _require_int32(name, "counts", counts)
    if a.ndim != 2 or w.ndim != 3:
        fail(f"{name}: a must be [M, K] and w [E, K, N] (or [E, N, K]); got {show(a)}, {show(w)}")
    if indices.ndim != 1 or tuple(counts.shape) != tuple(indices.shape):
        fail(
            f"{name}: indices {show(indices)} and counts {show(counts)} must both be [G], one "
            "expert and one row count per segment"
        )
    e, k, n = (w.shape[0], w.shape[2], w.shape[1]) if transpose_b else w.shape
    if a.shape[1] != k:
        fail(
            f"{name}: a {show(a)} has {a.shape[1]} columns but w {show(w)} takes {k} "
            f"(transpose_b={transpose_b})"
        )
    if bias is not None and tuple(bias.shape) != (e, n):
        fail(f"{name}: bias {show(bias)} must be [E, N] = [{e}, {n}], one row per expert")
    return Spec((a.shape[0], n), a.dtype)


@defcommand(family="blas", shape=_segmented_gemm_shape)
def segmented_gemm(a, indices, counts, w, bias=None, *, transpose_b=False):
    """Grouped GEMM: each segment of rows of ``a`` times its expert's ``w`` (+ bias).

    See the module docstring for layouts. Runs as one ``jax.lax.ragged_dot`` over the
    segments' weights. A 16-bit bias is added in float32 and the sum rounded once, so
    its gradient adds each expert's rows in float32.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> a = jnp.ones((5, 3))
    >>> w = jnp.stack([jnp.ones((3, 2)), 2 * jnp.ones((3, 2))])
    >>> i, c = jnp.array([1, 0], jnp.int32), jnp.array([2, 3], jnp.int32)
    >>> ops.segmented_gemm()(a, i, c, w)[:, 0]
    Array([6., 6., 3., 3., 3.], dtype=float32)
    """
    experts = w.shape[0]
    picked = jnp.take(w, jnp.clip(indices, 0, experts - 1), axis=0)  # [G, K, N]
    if transpose_b:
        picked = jnp.swapaxes(picked, 1, 2)
    counts = jnp.maximum(counts, 0)
    y = lax.ragged_dot(a, picked, counts)
    if bias is None:
        return y
    ends = jnp.cumsum(counts)
    group = jnp.searchsorted(ends, jnp.arange(a.shape[0], dtype=ends.dtype), side="right")
    inside = group < indices.shape[0]
    expert = jnp.take(indices, jnp.clip(group, 0, indices.shape[0] - 1))
    # The bias rows are taken in float32 for 16-bit types: the derived backward (jax.vjp)
    # then adds each expert's segment of gradient rows into its bias row in float32
    # and rounds once (bfloat16: 4096 rows of 0.1 had stopped at 32).
    wide = summing_dtype(y.dtype)
    rows = jnp.take(bias.astype(wide), jnp.clip(expert, 0, experts - 1), axis=0)
    rows = jnp.where(inside[:, None], rows, jnp.zeros((), wide))
    return (y.astype(wide) + rows).astype(y.dtype)


def _moe_routing_shape(
    logits, route, activation, *, kth, weight_scale, preselected, compact_single_token, normalize
):
    name = "moe_routing"
    require_float(name, logits, activation)
    if logits.ndim != 2 or activation.ndim != 2 or activation.shape[0] != logits.shape[0]:
        fail(
            f"{name}: logits must be [T, E] and activation [T, D] for the same T tokens; got "
            f"{show(logits)}, {show(activation)}"
        )
    t, e = logits.shape
    if kth <= 0 or kth > e:
        fail(f"{name}: kth={kth} must be in 1..{e}, the number of experts in logits {show(logits)}")
    if weight_scale <= 0:
        fail(f"{name}: weight_scale must be positive, got {weight_scale}")
    if preselected:
        _require_int32(name, "route (preselected experts)", route)
        if tuple(route.shape) != (t, kth):
            fail(f"{name}: preselected route {show(route)} must be [T, kth] = [{t}, {kth}]")
    else:
        require_same_dtype(name, logits, route)
        if tuple(route.shape) != (e,):
            fail(f"{name}: route {show(route)} must be [E] = [{e}], a bias per expert")
    pairs = t * kth
    rows = 1 if compact_single_token and t == 1 else pairs
    groups = min(pairs, e)
    return (
        Spec((rows, activation.shape[1]), activation.dtype),
        Spec((pairs,), np.float32),
        Spec((pairs,), np.int32),
        Spec((groups,), np.int32),
        Spec((groups,), np.int32),
    )


def _select(scores, kth):
    """Top ``kth`` experts per token, ties to the lower index (``lax.top_k`` does)."""
    return lax.top_k(scores, kth)[1].astype(jnp.int32)


@defcommand(family="moe", shape=_moe_routing_shape)
def moe_routing(
    logits,
    route,
    activation,
    *,
    kth=2,
    weight_scale=1.0,
    preselected=False,
    compact_single_token=False,
    normalize=True,
):
    """Top-k expert choice and token permutation for a MoE layer (see the module docstring).

    ``normalize=True`` (NNC's formula) divides the chosen probabilities by their sum, so
    with ``kth=1`` every weight is ``weight_scale`` and the logits get **no gradient**
    (a top-1 router never trains). ``normalize=False`` weights each row by its
    probability ``p = sqrt(softplus(logit))`` itself (times ``weight_scale``), as
    Switch Transformer's top-1 gate, so the logits get a gradient at any ``kth``.

    A ``preselected`` expert id outside ``[0, E)`` drops that (token, slot) pair: weight
    0, left out of its token's sum and of every group, its row sorted last.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> logits = jnp.array([[3.0, 0.0, 1.0], [0.0, 2.0, 1.0]])
    >>> out = ops.moe_routing(kth=1)(logits, jnp.zeros(3), jnp.eye(2, 4))
    >>> out[2], out[3], out[4]  # token per row; experts used, rows per expert
    (Array([0, 1], dtype=int32), Array([0, 1], dtype=int32), Array([1, 1], dtype=int32))
    """
    t, e = logits.shape
    x = logits.astype(jnp.float32)
    prob = jnp.sqrt(jnp.maximum(x, 0) + jnp.log1p(jnp.exp(-jnp.abs(x))))
    if preselected:
        chosen = route
    else:
        chosen = _select(lax.stop_gradient(prob + route.astype(jnp.float32)[None, :]), kth)
    valid = (chosen >= 0) & (chosen < e)  # only preselected ids can be out of range
    p = jnp.take_along_axis(prob, jnp.clip(chosen, 0, e - 1), axis=1)  # [T, kth]
    p = jnp.where(valid, p, 0.0)
    if normalize:
        p = p / jnp.maximum(jnp.sum(p, axis=1, keepdims=True), 6.103515625e-5)
    weights = (p * weight_scale).reshape(-1)
    # A dropped pair's expert is E: sorted after every valid one, and out of range of
    # the per-expert count (a -1 would wrap to the last expert there).
    experts = jnp.where(valid, chosen, e).reshape(-1)
    tokens = jnp.repeat(jnp.arange(t, dtype=jnp.int32), kth)
    if t == 1:
        gathered = activation if compact_single_token else jnp.repeat(activation, kth, axis=0)
        # Slot order, with dropped pairs moved last (the rows are all the one token's).
        order = jnp.argsort(experts == e, stable=True)
        kept = valid.reshape(-1)[order]
        ones = kept.astype(jnp.int32)
        return gathered, weights[order], tokens, jnp.where(kept, experts[order], -1), ones
    # Pairs are made in (token, slot) order, so a stable sort by expert alone gives
    # NNC's (expert, token, slot) order.
    order = jnp.argsort(experts, stable=True)
    tokens = tokens[order]
    gathered = jnp.take(activation, tokens, axis=0)
    per_expert = jnp.zeros((e,), jnp.int32).at[experts].add(1, mode="drop")
    used = per_expert > 0
    first = jnp.argsort(~used, stable=True).astype(jnp.int32)  # used experts first, ascending
    groups = min(t * kth, e)
    expert_indices = jnp.where(used[first], first, -1)[:groups]
    expert_counts = per_expert[first][:groups]
    return gathered, weights[order], tokens, expert_indices, expert_counts


def _all_to_all_shape(*xs, axis):
    name = "comm_all_to_all"
    first = xs[0]
    require_same_dtype(name, *xs)
    if any(tuple(x.shape) != tuple(first.shape) for x in xs):
        fail(f"{name}: every rank's tensor must have one shape; got {[show(x) for x in xs]}")
    if not 0 <= axis < first.ndim:
        fail(f"{name}: axis {axis} is out of range for {show(first)}")
    if first.shape[axis] % len(xs):
        fail(
            f"{name}: axis {axis} of {show(first)} has {first.shape[axis]} entries, not divisible "
            f"into {len(xs)} chunks, one per rank"
        )
    return tuple(Spec(tuple(first.shape), first.dtype) for _ in xs)


@defcommand(family="comm", shape=_all_to_all_shape, uses=NOTHING)
def comm_all_to_all(*xs, axis=0):
    """All-to-all between ``R`` ranks: output ``j`` is chunk ``j`` (along ``axis``) of
    every input, in rank order. One tensor per rank, as NNC's COMM_ALL_TO_ALL.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> a, b = ops.comm_all_to_all()(jnp.array([0, 1]), jnp.array([2, 3]))
    >>> a, b
    (Array([0, 2], dtype=int32), Array([1, 3], dtype=int32))
    """
    r = len(xs)
    chunks = [jnp.split(x, r, axis=axis) for x in xs]
    return tuple(jnp.concatenate([chunks[i][j] for i in range(r)], axis=axis) for j in range(r))


@comm_all_to_all.backward
def _all_to_all_backward(grads, inputs, outputs, *, axis):
    # The exchange is a permutation whose transpose is itself: rank i's chunk j went to
    # rank j's chunk i, so the gradients go back by the same exchange.
    gs = [jnp.zeros(o.shape, o.dtype) if g is None else g for g, o in zip(grads, inputs)]
    return comm_all_to_all.definition.forward(*gs, axis=axis)


def _devices_for(r: int) -> int:
    """The most devices, at most ``r`` and dividing it, that the ranks spread over."""
    return max(m for m in range(1, min(r, jax.device_count()) + 1) if r % m == 0)


@functools.lru_cache(maxsize=32)
def _exchange(r: int, m: int):
    """``shard_map`` over ``m`` devices of ``[R, m, R/m, chunk...]`` blocks: rank ``i``
    lives on device ``i // (R/m)``; chunks cross devices by ``lax.all_to_all`` and
    change places within a device by a transpose."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:m]), ("ranks",))
    spec = jax.sharding.PartitionSpec("ranks")

    def local(block):  # [r, m, r, c, ...]: my ranks a, chunks for (device g', rank b)
        got = lax.all_to_all(block, "ranks", 1, 1, tiled=True)  # [a, g (source), b, c, ...]
        got = jnp.moveaxis(got, 2, 0)  # [b, a, g, c, ...]
        got = jnp.swapaxes(got, 1, 2)  # [b, g, a, c, ...]: chunk i = g * r + a
        return jnp.reshape(got, (got.shape[0], -1, *got.shape[4:]))

    return jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=spec)


def _all_to_all_shard_map(*xs, axis=0):
    """NNC's all-to-all as a collective: rank ``i``'s tensor on device ``i // (R/m)`` of
    ``m`` devices (all ``R`` where there are that many), exchanged by
    ``lax.all_to_all`` inside ``shard_map``."""
    r = len(xs)
    m = _devices_for(r)
    stacked = jnp.stack([jnp.moveaxis(x, axis, 0) for x in xs])  # [R, n, rest...]
    n, rest = stacked.shape[1], stacked.shape[2:]
    blocks = jnp.reshape(stacked, (r, m, r // m, n // r, *rest))
    out = _exchange(r, m)(blocks)  # [R, n, rest...]
    return tuple(jnp.moveaxis(out[j], 0, axis) for j in range(r))


def _all_to_all_shard_map_backward(grads, inputs, outputs, wants, *, axis):
    gs = [jnp.zeros(x.shape, x.dtype) if g is None else g for g, x in zip(grads, inputs)]
    return _all_to_all_shard_map(*gs, axis=axis)


# Priority 0: the command cannot see where its tensors live, so the collective (which
# places rank i on a device of its own) is chosen only when forced.
register_backend(
    "comm_all_to_all",
    Backend(
        "shard_map",
        _all_to_all_shard_map,
        ("cpu", "gpu", "tpu"),
        priority=0,
        backward=_all_to_all_shard_map_backward,
    ),
)
