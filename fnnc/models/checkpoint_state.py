"""A compiled cnnp model in a checkpoint: parameters, optimizer state, RNG, progress.

:meth:`Checkpoints.save(step, model) <fnnc.io.Checkpoints.save>` stores

- every parameter in a row named by its id, as NNC names them:
  ``__ckpt-<step>__[t-fc1-0-0]``, and internals as NNC names them on device 0,
  ``__ckpt-<step>__[r-bn-0-0(0)]`` (so ``Model.read(path, name="ckpt-<step>")`` and
  NNC's ``ccv_cnnp_model_read`` read a step; checkpoints saved before name internals
  by id alone and restore as well); a :class:`~fnnc.models.Repeat`'s stacks per block,
  under the unrolled model's ids, optimizer state included (:mod:`fnnc.models.stacks`);
- the optimizer state of each trainable parameter in rows named ``<id>/<field>``, the
  field path of the Optax state (``t-fc1-0-0/mu``, ``t-fc1-0-0/count``; positions are
  added, ``t-fc1-0-0/0/mu``, only where the field names alone repeat). The model's
  minimizer is one transformation over the parameter dict (:mod:`fnnc.models.optim`);
  a parameter's rows are its partition's state as it sees it: its own entries of the
  per-parameter dicts (``mu``, ``nu``, MultiSteps' ``acc_grads``) and the leaves of the
  partition as a whole (``count``, MultiSteps' ``mini_step`` and ``gradient_step``,
  ``inject_hyperparams``' ``hyperparams/learning_rate``), written under every parameter
  of the partition, so each parameter's rows are a complete state as they were when
  minimizers ran per parameter (and such checkpoints restore). Restoring checks that the
  copies agree within each partition;
- in the metadata under ``"fnnc.train"``: the training step, epoch, batch, shuffling
  seed and data position (:class:`fnnc.models.batches.Progress`) and the engine's
  random key, so a resumed run draws what the stopped one would have; the loss scale
  of float16 training (:mod:`fnnc.models.loss_scale`); the run's process and device
  counts (a data position saved by one process count does not fit another).

:func:`restore_into` puts it all back into a model, after checking the checkpoint is
of this model (every missing, extra and mis-shaped parameter is listed).

:mod:`fnnc.io` knows no models: a :class:`~fnnc.models.Model` offers
``checkpoint_state`` and ``restore_checkpoint``, which call this module, and
``Checkpoints`` calls those methods on any object that has them.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

import jax
import numpy as np

from fnnc.errors import CheckpointError
from fnnc.io import tree
from fnnc.models import loss_scale, parallel, sharded_state, stacks
from fnnc.models.batches import Progress, progress
from fnnc.models.optim import disagreements, views_like

TRAIN_KEY = "fnnc.train"


def _short(path: str) -> str:
    """``[0].mu`` -> ``mu``: the field names of a path (dict keys kept)."""
    parts = re.findall(r"\.(\w+)|\['([^']*)'\]", path)
    return "/".join(a or b for a, b in parts)


def _long(path: str) -> str:
    """``[0].mu`` -> ``0/mu``: every step of a path."""
    parts = re.findall(r"\.(\w+)|\[(\d+)\]|\['([^']*)'\]", path)
    return "/".join(a or b or c for a, b, c in parts)


def _rename(data: Any, names: dict[str, str]) -> Any:
    if isinstance(data, list):
        return [_rename(v, names) for v in data]
    if isinstance(data, dict):
        out = {k: _rename(v, names) for k, v in data.items()}
        if isinstance(data.get("$array"), str):
            out["$array"] = names[data["$array"]]
        return out
    return data


def _optimizer_rows(pid: str, state: Any, row: Any) -> tuple[Any, tree.Rows]:
    data, rows = tree.encode(state, "", lambda path: path)
    own = f"[{pid!r}]"  # the parameter's entry of a per-parameter dict: its row says it
    short = {p: _short(p.replace(own, "")) for p, _ in rows}
    if len(set(short.values())) != len(short) or not all(short.values()):
        short = {p: _long(p.replace(own, "")) or "state" for p, _ in rows}
    names = {p: row(f"{pid}/{s}") for p, s in short.items()}
    return _rename(data, names), [(names[p], a) for p, a in rows]


def _templates(engine: Any) -> list[dict[str, Any]]:
    """Per partition of the current minimizer: parameter id -> the template of its
    view of the partition's state (``jax.ShapeDtypeStruct`` leaves)."""
    mins = engine.minimizers_of(engine.trainable())
    out = []
    for template, ids in zip(mins.templates(), mins.parts):
        specs = {p: jax.ShapeDtypeStruct(engine.infos[p].shape, engine.infos[p].dtype) for p in ids}
        out.append(views_like(template, specs))
    return out


def current_states(engine: Any, pids: Collection[str] | None = None) -> dict[str, Any]:
    """Trainable parameter id -> its view of its partition's Optax state (of ``pids``
    only, when given: each is copied to the host)."""
    engine._sync_live()
    out = {}
    for likes in _templates(engine):
        for pid, like in likes.items():
            if pids is not None and pid not in pids:
                continue
            state = engine.store.find(pid, like)
            if state is not None:
                out[pid] = engine._host(state)
    return out


def encode_model(model: Any, row: Any, metadata: Any, step: int) -> tuple[Any, Any, Any, Any]:
    """``(state data, optimizer data, metadata, rows)`` for the manifest of ``model``."""
    if metadata is not None and not isinstance(metadata, dict):
        raise CheckpointError(
            f"checkpoint: metadata saved with a model must be a dict or None, got "
            f"{type(metadata).__name__} (the model's progress is added under {TRAIN_KEY!r})"
        )
    engine = model.engine
    split = sharded_state.split_parameters(engine)
    if split:
        raise CheckpointError(
            f"checkpoint: parameters {split[:4]}{' ...' if len(split) > 4 else ''} of model "
            f"{model.describe()} are split over {jax.process_count()} processes; Checkpoints "
            "would gather each to process 0 whole. Save with fnnc.io.ShardedCheckpoints(dir) "
            "(each process writes its own shards; CheckpointEvery(dir) picks it for such a "
            "model), or export the parameters with model.write(path)"
        )
    params = stacks.unstack_parameters(model.parameters(), model)  # NNC's per-block ids
    # an internal's row is <id>(0), as ccv_cnnp_model_write names it, so that NNC's
    # ccv_cnnp_model_read(handle, "ckpt-<step>", ...) and Model.read(name=) find it
    internals = {b for p, i in engine.infos.items() if i.internal for b in i.blocks or (p,)}
    encoded = [
        (k, tree.encode(v, f"{k}(0)" if k in internals else str(k), row)) for k, v in params.items()
    ]
    state_data = {"$dict": [[k, data] for k, (data, _) in encoded]}
    rows = [r for _, (_, leaf_rows) in encoded for r in leaf_rows]
    opt_items = []
    for pid, state in stacks.unstack_states(current_states(engine), model).items():
        data, opt_rows = _optimizer_rows(pid, state, row)
        opt_items.append([pid, data])
        rows += opt_rows
    train = progress(model).to_json()
    train["rng"] = np.asarray(jax.random.key_data(engine.key)).tolist()
    train["saved_step"] = step
    train.update(loss_scale.to_json(engine))  # float16 training's scale state
    train.update(parallel.layout_json(engine))  # processes and devices of the run
    meta = {**(metadata or {}), TRAIN_KEY: train}
    return state_data, {"$dict": opt_items}, meta, rows


def restore_into(checkpoints: Any, model: Any, step: int | None = None) -> Any:
    """Restores step ``step`` (default the newest) of ``checkpoints`` into ``model``;
    see :meth:`fnnc.io.Checkpoints.restore_into`."""
    if getattr(checkpoints, "sharded", False):  # fnnc.io.ShardedCheckpoints
        return sharded_state.restore_into(checkpoints, model, step)
    engine = model.engine
    ckpt = checkpoints.restore(step)
    where = f"step {ckpt.step} of {checkpoints.path}"
    saved = ckpt.state if isinstance(ckpt.state, dict) else None
    if saved is None:
        raise CheckpointError(
            f"checkpoint: {where} holds a {type(ckpt.state).__name__}, not a model's "
            "parameters; restore it with Checkpoints.restore()"
        )
    saved = stacks.stack_parameters(saved, model)  # a Repeat's stacks from per-block rows
    _check_same_model(where, saved, engine.infos, model.describe())
    meta = ckpt.metadata.get(TRAIN_KEY) if isinstance(ckpt.metadata, dict) else None
    # Everything is checked before anything of the model changes: a damaged entry
    # leaves the model as it was, not with the parameters of one step and the rest
    # of another.
    key = _saved_key(where, meta)
    scale = loss_scale.saved_state(engine, meta, where) if meta is not None else None
    parallel.check_restore(where, meta or {})
    states = _saved_states(where, ckpt.optimizer_state or {}, model)
    engine.set_parameters(saved)  # checks every value before it sets any
    engine._sync_live()  # the running fit's state would otherwise win over the restored one
    put_run(model, states, meta, key, scale)
    return ckpt


def put_run(model: Any, states: dict[str, Any], train: Any, key: Any, scale: Any) -> None:
    """Puts a restored step's optimizer ``states`` into ``model`` and, for a model's own
    save (``train``, its progress entry, not ``None``), its progress, random key and
    loss scale; such a save's optimizer state is all the run had, so it replaces the
    whole store (a parameter it holds none of starts afresh, as it did then)."""
    engine = model.engine
    if train is not None:
        engine.store.reset()
    for pid, state in states.items():
        engine.store.put(pid, state)
    if train is not None:
        progress(model).load(train)
        engine.key = key
        loss_scale.put(engine, scale)


def _saved_states(where: str, opt_saved: dict[str, Any], model: Any) -> dict[str, Any]:
    """The saved optimizer states (parameter id -> view) rebuilt on the templates of the
    model's minimizer, after checking that the copies of each partition's shared leaves
    agree (they were written under every parameter of the partition)."""
    states = {}
    for likes in _templates(model.engine):
        opt_saved = stacks.stack_states(opt_saved, likes, model, tree.rebuild)
        part = {}
        for pid, like in likes.items():
            if pid not in opt_saved:
                continue
            try:
                state = tree.rebuild(opt_saved[pid], like, f"optimizer state of {pid}")
                part[pid] = _in_dtypes_of(where, pid, state, like)
            except CheckpointError as e:
                raise CheckpointError(
                    f"checkpoint: {where}: the optimizer state of {pid} does not fit the "
                    f"model's minimizer ({e}); set the minimizer the run was saved with"
                ) from None
        differ = disagreements(part)
        if differ:
            raise CheckpointError(
                f"checkpoint: {where}: the parameters {sorted(part)} share one minimizer "
                "(one partition of the model's transformation), but their saved optimizer "
                "states differ on what the partition holds as a whole:\n  "
                + "\n  ".join(differ[:8])
                + "\nThey were trained in different partitions: set the minimizers the run "
                "was saved with (model.set_minimizer(opt, params=[...]) per partition) "
                "before restoring"
            )
        states.update(part)
    return states


def _in_dtypes_of(where: str, pid: str, state: Any, like: Any) -> Any:
    """``state`` with each leaf in the dtype of its template ``like``. The model keeps
    a state under its leaves' dtypes, so one left in the saved dtypes would never be
    found (a fresh state would silently replace it): a checkpoint of float32 parameters
    restored into a model with float16 ones (set_parameters converts those) has its
    float moments converted likewise, and integer counters converted between widths;
    any other change of kind is refused."""

    def convert(path: Any, leaf: Any, want: Any) -> Any:
        leaf = np.asarray(leaf)
        if leaf.dtype == want.dtype:
            return leaf
        issub = jax.numpy.issubdtype  # knows ml_dtypes' bfloat16 is floating
        if any(issub(leaf.dtype, k) and issub(want.dtype, k) for k in _KINDS):
            return leaf.astype(want.dtype)
        raise CheckpointError(
            f"checkpoint: {where}: the optimizer state of {pid} holds "
            f"{jax.tree_util.keystr(path)} as {leaf.dtype}, the model's minimizer keeps it "
            f"as {want.dtype}; restore into a model whose parameters have the saved dtypes, "
            "or only the parameters: model.set_parameters(Checkpoints(path).restore(step)"
            ".state)"
        )

    return jax.tree_util.tree_map_with_path(convert, state, like)


_KINDS = (np.floating, np.integer)


def _saved_key(where: str, train: Any, reader: str = "Checkpoints") -> Any:
    """The random key saved in the progress entry ``train`` (``None`` without one),
    after checking the entry: a damaged one raises :class:`CheckpointError`."""
    if train is None:
        return None
    try:
        if not isinstance(train, dict):
            raise TypeError(f"a {type(train).__name__}, not a dict")
        Progress().load(train)  # its fields, read as restoring will
        return jax.random.wrap_key_data(np.asarray(train["rng"], np.uint32))
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise CheckpointError(
            f"checkpoint: {where}: its training progress ({TRAIN_KEY!r} in the metadata) "
            f"is damaged ({type(e).__name__}: {e}); restore another step, or only the "
            f"parameters: model.set_parameters({reader}(path).restore(step).state)"
        ) from None


def _check_same_model(
    where: str, saved: dict[str, Any], infos: Any, name: str, reader: str = "Checkpoints"
) -> None:
    """Raises :class:`CheckpointError` listing every parameter of ``saved`` missing,
    extra or mis-shaped for the model (``reader``: the class the hint restores with)."""
    missing = [k for k in infos if k not in saved]
    extra = [k for k in saved if k not in infos]
    shapes = [
        f"{k}: saved {list(np.shape(v))}, model {list(infos[k].shape)}"
        for k, v in saved.items()
        if k in infos and tuple(np.shape(v)) != tuple(infos[k].shape)
    ]
    if not (missing or extra or shapes):
        return
    lines = [f"checkpoint: {where} is not of model {name}:"]
    if missing:
        lines.append(f"  missing (in the model, not in the checkpoint): {missing}")
    if extra:
        lines.append(f"  extra (in the checkpoint, not in the model): {extra}")
    if shapes:
        lines.append("  shape mismatches: " + "; ".join(shapes))
    lines.append(
        "Restore into the model that saved it, or copy the parameters that fit (it "
        "returns the ids it skipped; the optimizer state is not copied) with "
        f"model.set_parameters({reader}(path).restore().state, strict=False)."
    )
    raise CheckpointError("\n".join(lines))
