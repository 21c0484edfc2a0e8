"""A compiled cnnp model in a sharded checkpoint (:class:`fnnc.io.ShardedCheckpoints`).

What is saved is what :mod:`fnnc.models.checkpoint_state` saves (parameters by id,
each trainable parameter's view of its optimizer state, the training progress, random
key and loss scale under ``"fnnc.train"`` in the metadata), but the arrays go to Orbax
as the ``jax.Array`` values the engine holds, laid out on the model's mesh: each
process writes the shards it holds, and no process ever gathers a parameter that is
split over processes (FSDP, tensor parallelism).

The optimizer state of parameter ``p`` is a dict of its view's leaves named as the
SQLite checkpoint's rows are (``mu``, ``nu``, ``count``; ``0/mu`` where the field
names alone repeat); the JSON keeps those names in order, so restoring rebuilds the
view on the model's minimizer template, and a minimizer of another structure is
named in a :class:`CheckpointError` instead of restoring into the wrong leaves.

A :class:`~fnnc.models.Repeat`'s stacks are saved as the SQLite checkpoint saves them,
under the unrolled model's per-block ids (:mod:`fnnc.models.stacks`), parameters and
optimizer-state views both: a run resumes across a Repeat model and the unrolled one,
either way. A block's slice is read whole onto the stack's devices and the stack is
laid out again; a step saved by an earlier version with the stacked ids restores as
it was saved.

Restoring reads every array straight into the layout the model has now: a parameter
where its current value lives (its ``sharding``), an optimizer-state leaf of the
parameter's shape as the parameter, every other leaf (``count``) replicated on the
parameter's mesh. So a step saved by 2 processes restores on 1 device, on a 4-device
FSDP mesh, or on 2 processes again.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from fnnc.errors import CheckpointError
from fnnc.io.checkpoints import Checkpoint
from fnnc.models import checkpoint_state as gathered  # it imports this module back
from fnnc.models import loss_scale, parallel, stacks
from fnnc.models.batches import progress
from fnnc.models.optim import SHARED, disagreements, owners

READER = "ShardedCheckpoints"  # the class its errors tell to restore the parameters with


def split_parameters(engine: Any) -> list[str]:
    """Ids of the parameters split over processes (no process holds all of one)."""
    return [
        pid
        for pid, v in engine.values.items()
        if isinstance(v, jax.Array) and not v.is_fully_addressable and not v.is_fully_replicated
    ]


def leaf_names(pid: str, view: Any) -> list[str]:
    """Names of the leaves of ``pid``'s optimizer-state ``view``, in leaf order (the
    SQLite checkpoint's row names without the parameter id: ``mu``, ``count``)."""
    own = f"[{pid!r}]"
    paths = [
        jax.tree_util.keystr(p).replace(own, "")
        for p, _ in jax.tree_util.tree_flatten_with_path(view)[0]
    ]
    names = [gathered._short(p) for p in paths]
    if len(set(names)) != len(names) or not all(names):
        names = [gathered._long(p) or "state" for p in paths]
    return names


def encode(model: Any, metadata: Any, step: int) -> tuple[Any, Any, dict[str, Any]]:
    """``(parameters, optimizer state, JSON info)`` of ``model`` for a sharded save: the
    arrays as the engine holds them (nothing gathered)."""
    if metadata is not None and not isinstance(metadata, dict):
        raise CheckpointError(
            f"sharded checkpoint: metadata saved with a model must be a dict or None, got "
            f"{type(metadata).__name__} (the model's progress is added under "
            f"{gathered.TRAIN_KEY!r})"
        )
    engine = model.engine
    engine._sync_live()  # the running fit's optimizer state, back in the store
    params = stacks.unstack_parameters(dict(engine.values), model)  # NNC's per-block ids
    views = {}
    for likes in gathered._templates(engine):
        for pid, like in likes.items():
            view = engine.store.find(pid, like)
            if view is not None:
                views[pid] = view
    optimizer, names = {}, {}
    for pid, view in stacks.unstack_states(views, model).items():
        names[pid] = leaf_names(pid, view)
        optimizer[pid] = dict(zip(names[pid], jax.tree.leaves(view)))
    train = progress(model).to_json()
    train["rng"] = np.asarray(jax.random.key_data(engine.key)).tolist()
    train["saved_step"] = step
    train.update(loss_scale.to_json(engine))
    train.update(parallel.layout_json(engine))
    info = {
        "metadata": {**(metadata or {}), gathered.TRAIN_KEY: train},
        "parameters": {p: [list(np.shape(v)), str(v.dtype)] for p, v in params.items()},
        "optimizer_leaves": names,
        "layout": {p: _spec_json(v) for p, v in params.items()},
    }
    return params, optimizer, info


def _spec_json(value: Any) -> Any:
    """The saved layout of one array: its mesh axes and partition spec, or ``None``."""
    sharding = getattr(value, "sharding", None)
    if not isinstance(sharding, NamedSharding):
        return None
    spec = [list(a) if isinstance(a, tuple) else a for a in sharding.spec]
    return {"mesh": dict(sharding.mesh.shape), "spec": spec}


def _replicated(sharding: Any) -> Any:
    """A whole-array layout on the devices of ``sharding``."""
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec())
    return sharding


def _saved_specs(where: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Parameter id -> ``jax.ShapeDtypeStruct`` as the manifest records them."""
    try:
        return {
            str(p): jax.ShapeDtypeStruct(tuple(int(n) for n in shape), np.dtype(dtype))
            for p, (shape, dtype) in manifest["parameters"].items()
        }
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(
            f"sharded checkpoint: {where}: its parameter list is damaged "
            f"({type(e).__name__}: {e}); restore another step"
        ) from None


def _optimizer_targets(
    where: str, engine: Any, saved: dict[str, Any], blocks: dict[str, tuple[str, ...]]
) -> tuple[Any, Any]:
    """``(targets, templates)``: per parameter with a saved optimizer state, its leaves
    as ``jax.ShapeDtypeStruct`` laid out for this model, and its view's template. A
    stacked parameter saved per block (``blocks``: stacked id -> block ids) gets one
    entry per block, each leaf whole on the stack's devices."""
    targets, templates = {}, {}
    for likes in gathered._templates(engine):
        members = frozenset(likes)
        for pid, like in likes.items():
            ids = blocks.get(pid, ())
            if pid not in saved and ids and all(b in saved for b in ids):
                place = _replicated(_sharding(engine.values[pid]))
                for bid in ids:
                    block_like = stacks.rekey(
                        like, pid, bid, lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype)
                    )
                    names = _saved_names(where, saved, bid, block_like)
                    targets[bid] = {
                        n: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=place)
                        for n, x in zip(names, jax.tree.leaves(block_like))
                    }
                    templates[bid] = block_like
                continue
            if pid not in saved:
                continue
            names = _saved_names(where, saved, pid, like)
            sharding = _sharding(engine.values[pid])
            leaves = []
            for leaf, owner in zip(jax.tree.leaves(like), owners(like, members)):
                whole = owner == SHARED or leaf.shape != engine.infos[pid].shape
                place = _replicated(sharding) if whole else sharding
                leaves.append(jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=place))
            targets[pid] = dict(zip(names, leaves))
            templates[pid] = like
    return targets, templates


def _saved_names(where: str, saved: dict[str, Any], pid: str, like: Any) -> list[str]:
    """The leaf names of ``pid``'s view ``like``, checked against those saved."""
    names = leaf_names(pid, like)
    if list(saved[pid]) != names:
        raise CheckpointError(
            f"sharded checkpoint: {where}: the optimizer state of {pid} does not fit "
            f"the model's minimizer (saved leaves {list(saved[pid])}, the minimizer's "
            f"{names}); set the minimizer the run was saved with"
        )
    return names


def _saved_blocks(saved: dict[str, Any], model: Any) -> dict[str, tuple[str, ...]]:
    """The model's stacked ids saved per block: stacked id -> its block ids."""
    return {
        pid: ids
        for pid, ids in stacks.stacked_ids(model).items()
        if pid not in saved and all(b in saved for b in ids)
    }


def _stacked_specs(specs: dict[str, Any], blocks: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """``specs`` with each stack's per-block entries as one ``[n, ...]`` entry."""
    out = {p: v for p, v in specs.items() if not any(p in ids for ids in blocks.values())}
    for pid, ids in blocks.items():
        first = specs[ids[0]]
        out[pid] = jax.ShapeDtypeStruct((len(ids), *first.shape), first.dtype)
    return out


def _stack_views(views: dict[str, Any], blocks: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """Per-block optimizer-state views stacked into their stack's view: own entries
    stacked, partition-wide leaves (``count``) block 0's (checked to agree later)."""
    out = {p: v for p, v in views.items() if not any(p in ids for ids in blocks.values())}
    for pid, ids in blocks.items():
        if not all(b in views for b in ids):
            continue
        out[pid] = stacks.stack_views([views[b] for b in ids], ids, pid)
    return out


def restore_into(checkpoints: Any, model: Any, step: int | None = None) -> Checkpoint:
    """Restores step ``step`` (default the newest) of sharded ``checkpoints`` into
    ``model`` onto its current layout; see :meth:`fnnc.io.ShardedCheckpoints.restore_into`.
    The manifest and the arrays are read under :meth:`~fnnc.io.ShardedCheckpoints.reading`
    (one save of the step, whole, while another process re-saves it)."""
    with checkpoints.reading():
        return _restore_into(checkpoints, model, step)


def _restore_into(checkpoints: Any, model: Any, step: int | None) -> Checkpoint:
    engine = model.engine
    step = checkpoints.find_step(step)
    manifest = checkpoints.manifest(step)
    where = f"step {step} of {checkpoints.path}"
    if manifest.get("source") != "model":
        raise CheckpointError(
            f"sharded checkpoint: {where} holds a pytree, not a model; restore it with "
            "ShardedCheckpoints.restore(like=...)"
        )
    specs = _saved_specs(where, manifest)
    blocks = _saved_blocks(specs, model)  # a Repeat's stacks saved per block
    saved = _stacked_specs(specs, blocks)
    gathered._check_same_model(where, saved, engine.infos, model.describe(), READER)
    meta = manifest.get("metadata")
    train = meta.get(gathered.TRAIN_KEY) if isinstance(meta, dict) else None
    key = gathered._saved_key(where, train, READER)  # checked before anything of the model changes
    scale = loss_scale.saved_state(engine, train, where) if train is not None else None
    parallel.check_restore(where, train or {})
    engine._sync_live()  # the running fit's state would otherwise win over the restored one
    saved_leaves = manifest.get("optimizer_leaves")
    if not isinstance(saved_leaves, dict):
        raise CheckpointError(f"sharded checkpoint: {where}: its optimizer list is damaged")
    opt_targets, templates = _optimizer_targets(where, engine, saved_leaves, blocks)
    like = {p: _target(engine.values[p], engine.infos[p]) for p in engine.infos if p not in blocks}
    for pid, ids in blocks.items():  # each block's slice whole on the stack's devices
        place = _replicated(_sharding(engine.values[pid]))
        info = engine.infos[pid]
        like.update(
            {b: jax.ShapeDtypeStruct(info.shape[1:], info.dtype, sharding=place) for b in ids}
        )
    params = checkpoints.read_arrays(step, "state", like)
    params = stacks.stack_parameters(params, model)
    opt = checkpoints.read_arrays(step, "optimizer", opt_targets) if opt_targets else {}
    states = {  # opt_targets[pid] lists the names in leaf order (a dict Orbax may sort)
        pid: jax.tree.unflatten(jax.tree.structure(view), [opt[pid][n] for n in opt_targets[pid]])
        for pid, view in templates.items()
    }
    states = _stack_views(states, blocks)
    for likes in gathered._templates(engine):
        differ = disagreements({p: states[p] for p in likes if p in states})
        if differ:
            raise CheckpointError(
                f"sharded checkpoint: {where}: the parameters {sorted(likes)} share one "
                "minimizer, but their saved optimizer states differ on what it holds as a "
                "whole:\n  " + "\n  ".join(differ[:8]) + "\nset the minimizers the run was "
                "saved with (model.set_minimizer(opt, params=[...]) per partition)"
            )
    engine.values.update(params)
    engine.place_parameters()
    gathered.put_run(model, states, train, key, scale)
    return Checkpoint(step, params, states, meta, float(manifest.get("created") or 0.0))


def _target(value: Any, info: Any) -> Any:
    """Where a parameter is restored to: its current layout, its declared shape and dtype."""
    return jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=_sharding(value))


def _sharding(value: Any) -> Any:
    """The layout of an engine value (``None``, Orbax's default device, for a host one)."""
    return getattr(value, "sharding", None)
