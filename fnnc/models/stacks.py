"""A :class:`~fnnc.models.Repeat`'s stacks and the unrolled model's per-block entries.

A Repeat stores block ``i``'s parameter as slice ``i`` of one ``[n, *shape]`` stack under
a stacked id; the unrolled model (and NNC, and files) has one entry per block under the
per-block ids (:mod:`fnnc.models.repeat` says how both are formed). These functions
convert dicts of parameter values and of optimizer-state views between the two.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fnnc.models.layer import ModelError


# -- stacked <-> per-block parameters ---------------------------------------------------
def stacked_ids(model: Any) -> dict[str, tuple[str, ...]]:
    """Stacked parameter id -> the per-block ids of its slices, for every parameter a
    :class:`Repeat` stacks in the compiled ``model`` (module doc)."""
    if not hasattr(model, "engine"):
        raise ModelError(
            f"expected a Model (the parameters first, then the model: "
            f"stack_parameters(params, model)), got a {type(model).__name__}"
        )
    return {pid: info.blocks for pid, info in model.engine.infos.items() if info.blocks}


def unstack_parameters(params: Mapping[str, Any], model: Any) -> dict[str, Any]:
    """``params`` (id -> array, as :meth:`Model.parameters` gives) with every stacked
    parameter of ``model`` split into its blocks' slices under their per-block ids: the
    parameters of the unrolled model. Other entries pass through."""
    blocks = stacked_ids(model)
    out: dict[str, Any] = {}
    for pid, value in params.items():
        if pid not in blocks:
            out[pid] = value
            continue
        for i, bid in enumerate(blocks[pid]):
            out[bid] = value[i]
    return out


def stack_parameters(
    params: Mapping[str, Any], model: Any, *, strict: bool = True
) -> dict[str, Any]:
    """The reverse of :func:`unstack_parameters`: per-block entries of ``params`` stacked
    under ``model``'s stacked ids. A stack some of whose blocks ``params`` lacks takes
    them from ``model``'s current values, or raises (``strict``) naming them. Entries
    that are no block's pass through."""
    blocks = stacked_ids(model)
    owner = {bid: pid for pid, ids in blocks.items() for bid in ids}
    out = {k: v for k, v in params.items() if k not in owner}
    current: dict[str, Any] | None = None
    for pid, ids in blocks.items():
        present = [bid for bid in ids if bid in params]
        if not present:
            continue
        missing = [bid for bid in ids if bid not in params]
        if missing and strict:
            raise ModelError(
                f"stack_parameters: {pid} stacks {len(ids)} blocks; no values for "
                f"{', '.join(missing)}. Give every block's parameter, or strict=False to "
                "keep the model's current values for those"
            )
        if missing and current is None:
            current = model.parameters()
        slices = [params[bid] if bid in params else current[pid][i] for i, bid in enumerate(ids)]
        out[pid] = jnp.stack([jnp.asarray(s) for s in slices])
    return out


# -- optimizer state (checkpoints keep per-block ids too) ---------------------------------
def _own(pid: str) -> Callable[[Any], bool]:
    """Whether a node of a parameter's state view is its own entry ``{pid: ...}`` (of a
    dict keyed by parameter ids, e.g. Adam's ``mu``; :func:`fnnc.models.optim.view`)."""
    return lambda node: isinstance(node, dict) and len(node) == 1 and pid in node


def rekey(view: Any, pid: str, new: str, fn: Callable[[Any], Any]) -> Any:
    """``view`` with its own entries moved to key ``new`` and ``fn`` applied to their
    leaves; the partition-wide leaves (``count``) kept."""
    is_own = _own(pid)
    leaves, treedef = jax.tree.flatten(view, is_leaf=is_own)
    moved = [{new: jax.tree.map(fn, x[pid])} if is_own(x) else x for x in leaves]
    return treedef.unflatten(moved)


def unstack_states(states: Mapping[str, Any], model: Any) -> dict[str, Any]:
    """Optimizer-state views (parameter id -> its view of its partition's Optax state)
    with each stacked parameter's view split into one view per block, under the
    per-block ids: the views the unrolled model would have."""
    blocks = stacked_ids(model)
    out: dict[str, Any] = {}
    for pid, view in states.items():
        if pid not in blocks:
            out[pid] = view
            continue
        for i, bid in enumerate(blocks[pid]):
            out[bid] = rekey(view, pid, bid, lambda a, i=i: a[i])
    return out


def stack_states(
    saved: Mapping[str, Any], likes: Mapping[str, Any], model: Any, rebuild: Callable
) -> dict[str, Any]:
    """The reverse of :func:`unstack_states` on saved (decoded) views: each stacked
    parameter of ``likes`` (id -> template view) none of whose own id is in ``saved``
    but all of whose blocks are gets its blocks' views, rebuilt with ``rebuild(data,
    template, what)`` on its template sliced to one block, stacked. The partition-wide
    leaves are block 0's (restoring checks that a partition's copies agree)."""
    blocks = stacked_ids(model)
    out = dict(saved)
    for pid, like in likes.items():
        ids = blocks.get(pid, ())
        if not ids or pid in saved or not all(b in saved for b in ids):
            continue
        views = []
        for bid in ids:
            block_like = rekey(like, pid, bid, lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype))
            views.append(rebuild(saved[bid], block_like, f"optimizer state of {bid}"))
        out[pid] = stack_views(views, ids, pid, np.stack)
        for bid in ids:
            del out[bid]
    return out


def stack_views(
    views: list[Any], ids: tuple[str, ...], pid: str, stack: Callable[..., Any] = jnp.stack
) -> Any:
    """One stacked view under ``pid`` from the per-block ``views`` (of block ids
    ``ids``): each own entry's leaves stacked with ``stack``, the partition-wide leaves
    (``count``) block 0's."""
    firsts, treedef = jax.tree.flatten(views[0], is_leaf=_own(ids[0]))
    per_block = [jax.tree.leaves(v, is_leaf=_own(b)) for v, b in zip(views, ids)]
    stacked = []
    for k, leaf in enumerate(firsts):
        if not _own(ids[0])(leaf):
            stacked.append(leaf)
            continue
        entries = [leaves[k][b] for leaves, b in zip(per_block, ids)]
        stacked.append({pid: jax.tree.map(lambda *xs: stack(xs), *entries)})
    return treedef.unflatten(stacked)


# -- the minimizer sees the blocks ---------------------------------------------------------
Blocks = tuple[tuple[str, tuple[str, ...]], ...]
"""Stacked parameter id -> its per-block ids, as pairs (hashable: it keys caches)."""


def per_block(transform: optax.GradientTransformation, blocks: Blocks) -> Any:
    """``transform`` over a dict of parameters in which each stacked parameter of
    ``blocks`` is seen as its blocks: the transformation gets (and keeps state for) one
    entry per block, under the per-block ids, as it does in the unrolled model; its
    updates and state come back stacked (``[n, ...]`` under the stacked id).

    So a rule with a norm per tensor (LAMB's trust ratio, Adafactor's factored moments,
    ``clip_by_block_rms``) takes it per block, and one over all parameters
    (``clip_by_global_norm``) still sees every block. A state entry of a stacked
    parameter is its blocks' entries stacked, so views and checkpoints split it per
    block (:func:`unstack_states`). Masks and labels given as dicts key the blocks by
    their per-block ids (the unrolled model's), and callables see one block's shape.

    >>> import jax.numpy as jnp
    >>> from fnnc.models.minimizers import lamb
    >>> w = {"s": jnp.array([[3.0, 4.0], [0.0, 1.0]])}  # two blocks, norms 5 and 1
    >>> tx = per_block(lamb(1.0, epsilon=0.0), (("s", ("s0", "s1")),))
    >>> u, _ = tx.update({"s": jnp.ones((2, 2))}, tx.init(w), w)
    >>> u["s"]  # each block's trust ratio by its own norm: 5 / sqrt(2), 1 / sqrt(2)
    Array([[-3.535534  , -3.535534  ],
           [-0.70710677, -0.70710677]], dtype=float32)
    """
    if not blocks:
        return transform
    of = dict(blocks)
    owner = {b: pid for pid, ids in blocks for b in ids}

    def split(tree: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for k, v in tree.items():
            if k not in of:
                out[k] = v
                continue
            for i, b in enumerate(of[k]):
                out[b] = jax.tree.map(lambda a, i=i: a[i], v)
        return out

    def join(tree: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for k, v in tree.items():
            if k not in owner:
                out[k] = v
            elif k == of[owner[k]][0]:
                parts = [tree[b] for b in of[owner[k]]]
                out[owner[k]] = jax.tree.map(lambda *xs: jnp.stack(xs), *parts)
        return out

    def in_state(tree: Any, keys: Mapping[str, Any], fn: Callable[[Any], Any]) -> Any:
        """``fn`` on every dict of ``tree`` keyed by parameter ids (some of ``keys``)."""

        def keyed(node: Any) -> bool:
            return isinstance(node, dict) and any(isinstance(k, str) and k in keys for k in node)

        return jax.tree.map(lambda n: fn(n) if keyed(n) else n, tree, is_leaf=keyed)

    def init(params: Any) -> Any:
        return in_state(transform.init(split(params)), owner, join)

    def update(updates: Any, state: Any, params: Any = None) -> Any:
        inner = in_state(state, of, split)
        params = None if params is None else split(params)
        new_updates, new_state = transform.update(split(updates), inner, params)
        return join(new_updates), in_state(new_state, owner, join)

    return optax.GradientTransformation(init, update)


cached_per_block = functools.lru_cache(maxsize=256)(per_block)
""":func:`per_block`, the same object for the same arguments (state caches key on it)."""


# primitives computing each element from the same element of their operands (or scalars)
_ELEMENTWISE_NAMES = """abs add and clamp convert_element_type copy cos div eq exp exp2 expm1
floor ceil ge gt integer_pow is_finite le log log1p logistic lt max min mul ne neg not or pow
rem round rsqrt select_n sign sin sqrt square sub tanh xor"""
_ELEMENTWISE = frozenset(_ELEMENTWISE_NAMES.split())
_NESTED_NAMES = "jit pjit closed_call core_call custom_jvp_call custom_vjp_call cond"
_NESTED = frozenset(_NESTED_NAMES.split())
# primitives elementwise only when their first operand is a scalar: a step size spread over
# a tensor (broadcast_in_dim), the predicate of a cond choosing for the whole tensor
_SCALAR_FIRST = frozenset({"broadcast_in_dim", "cond"})


def _subjaxprs(eqn: Any) -> list[Any]:
    return [
        getattr(s, "jaxpr", s)
        for v in eqn.params.values()
        for s in (v if isinstance(v, (tuple, list)) else (v,))
        if hasattr(s, "eqns") or hasattr(getattr(s, "jaxpr", None), "eqns")
    ]


def _elementwise(jaxpr: Any) -> bool:
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in _SCALAR_FIRST and eqn.invars[0].aval.shape:
            return False
        if name in _NESTED:
            if not all(_elementwise(s) for s in _subjaxprs(eqn)):
                return False
        elif name not in _ELEMENTWISE and name not in _SCALAR_FIRST:
            return False
    return True


@functools.lru_cache(maxsize=1024)
def acts_elementwise(transform: optax.GradientTransformation, specs: tuple[Any, ...]) -> bool:
    """Whether ``transform``'s update of parameters ``specs`` (``(id, shape, dtype)``
    triples) computes every element from the same element of its inputs and scalars
    (SGD, Adam, RMSProp; not LAMB, Adafactor, clipping), read from its jaxpr: then a
    stack updated as one tensor gets what its blocks would, bit for bit, and
    :func:`per_block` (which slices and restacks) is not needed."""
    params = {p: jax.ShapeDtypeStruct(shape, dtype) for p, shape, dtype in specs}
    try:
        state = jax.eval_shape(transform.init, params)
        jaxpr = jax.make_jaxpr(transform.update)(params, state, params)
    except Exception:  # a transformation this probe cannot trace: take the general path
        return False
    return _elementwise(jaxpr.jaxpr)
