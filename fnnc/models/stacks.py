"""A :class:`~fnnc.models.Repeat`'s stacks and the unrolled model's per-block entries.

A Repeat stores block ``i``'s parameter as slice ``i`` of one ``[n, *shape]`` stack under
a stacked id; the unrolled model (and NNC, and files) has one entry per block under the
per-block ids (:mod:`fnnc.models.repeat` says how both are formed). These functions
convert dicts of parameter values and of optimizer-state views between the two.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

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
