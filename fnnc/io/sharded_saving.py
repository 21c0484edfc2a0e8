"""How :class:`~fnnc.io.ShardedCheckpoints` saves a step (a mixin): the step's items
and manifest written through Orbax by every process, a re-save staged beside the old
step and swapped in (:mod:`fnnc.io.dir_swap`), retention applied after, with the
barriers that keep the processes of a multi-process run in step; and the on-disk names
(format, items, staging directory) its reads check."""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any

import jax
import orbax.checkpoint as ocp

from fnnc.errors import CheckpointError
from fnnc.io import checkpoint_trees as trees
from fnnc.io import dir_swap, tree
from fnnc.io.checkpoint_reading import as_step
from fnnc.io.structure import skeleton

FORMAT, VERSION = "fnnc.sharded_checkpoint", 1
ITEMS = ("state", "optimizer", "fnnc")
STAGING = ".fnnc-resave"  # where a re-saved step is written before it replaces the old one


class ShardedSaving:
    """:class:`~fnnc.io.ShardedCheckpoints`' ``save`` (see module doc)."""

    _path: str
    _barriers: int
    keep_last: int | None
    keep_every: int | None
    steps: Any  # ShardedCheckpoints'
    _open: Any
    _writing: Any

    def save(
        self,
        step: int,
        state: Any,
        optimizer_state: Any = None,
        metadata: Any = None,
    ) -> None:
        """Saves one step (replacing an earlier save of ``step``); every process calls it.

        Args:
            step: the training step (an int).
            state: a pytree of arrays (``jax.Array`` values are saved as they are laid
                out: each process writes its shards), or a compiled cnnp model
                (anything with ``sharded_checkpoint_state(metadata, step)``, which
                :class:`fnnc.models.Model` implements): its parameters, optimizer
                state and training progress, everything :meth:`restore_into` needs;
                or any object with ``parameters() -> dict[str, array]``, saved as
                that dict (restored as one, keyed by parameter id).
            optimizer_state: e.g. an Optax state (not with a model: it saves its own).
            metadata: anything JSON can hold (NumPy and JAX scalars as Python numbers).

        A save waits for every restore of another process or job that holds
        :meth:`reading` on this directory; in a multi-process run the other processes
        wait meanwhile at a barrier with a timeout (see ``_writing``), so keep outside
        restores (an evaluator) shorter than it.
        """
        step = step_number(step, self._path)
        source, metadata = "pytree", tree.plain_metadata(metadata)
        if callable(getattr(state, "sharded_checkpoint_state", None)):
            if optimizer_state is not None:
                raise CheckpointError(
                    "sharded checkpoint: a model's optimizer state is saved with it; drop "
                    "optimizer_state="
                )
            state, optimizer_state, info = state.sharded_checkpoint_state(metadata, step)
            source = "model"
        else:
            if callable(getattr(state, "parameters", None)):  # as Checkpoints: by parameter id
                state, source = dict(state.parameters()), "parameters"
            info = {"metadata": metadata}
        manifest = {"format": FORMAT, "version": VERSION, "source": source, **info}
        where = f"sharded checkpoint: step {step} for {self._path}"
        trees.check_savable(state, "state", where)
        trees.check_savable(optimizer_state, "optimizer state", where)
        if not jax.tree.leaves(state):
            raise CheckpointError(f"{where}: the state holds no arrays")
        if not jax.tree.leaves(optimizer_state):  # none yet (a model before its first step)
            optimizer_state = None
        manifest["created"] = time.time()
        manifest["optimizer_saved"] = optimizer_state is not None
        # Orbax gives tuples back as lists and int keys as str: restore rebuilds them
        manifest["structure"] = {"state": skeleton(state), "optimizer": skeleton(optimizer_state)}
        _check_json(manifest, step)
        manager = self._open(create=True)
        with self._writing():
            self._save(manager, step, state, optimizer_state, manifest)

    def _save(
        self, manager: Any, step: int, state: Any, optimizer_state: Any, manifest: Any
    ) -> None:
        self._barrier("recover", step)
        if jax.process_index() == 0:  # what a save killed mid-swap left
            dir_swap.recover(os.path.join(self._path, STAGING), self._path)
        self._barrier("recovered", step)
        items = {
            "state": ocp.args.StandardSave(trees.keyed(state)),
            "fnnc": ocp.args.JsonSave(manifest),
        }
        if optimizer_state is not None:
            items["optimizer"] = ocp.args.StandardSave(trees.keyed(optimizer_state))
        args = ocp.args.Composite(**items)
        if step in self.steps():
            self._resave(step, args)
            return
        try:
            manager.save(step, args=args, force=True)
            manager.wait_until_finished()
        except (ValueError, TypeError, OSError) as e:
            raise _unsaved(step, self._path, e) from None
        for old in self._expired(step):
            manager.delete(old)

    def _expired(self, saved: int) -> list[int]:
        """The steps retention drops after saving ``saved``, by :class:`Checkpoints`'
        rule: the newest ``keep_last`` steps (by number), those divisible by
        ``keep_every``, the one just saved and the newest stay. (Orbax's
        ``max_to_keep`` counts by save time: saving an older step deleted the newest.)"""
        if self.keep_last is None and self.keep_every is None:
            return []
        steps = self.steps()
        keep = {saved, steps[-1]}
        if self.keep_last is not None:
            keep.update(steps[-self.keep_last :])
        if self.keep_every is not None:
            keep.update(s for s in steps if s % self.keep_every == 0)
        return [s for s in steps if s not in keep]

    def _resave(self, step: int, args: Any) -> None:
        """Replaces ``step``: Orbax writes the new one in a staging directory, which is
        then swapped with the old one (:mod:`fnnc.io.dir_swap`), so a failure or a kill
        at any point leaves the old step or the new one, never none."""
        staging = os.path.join(self._path, STAGING)
        primary = jax.process_index() == 0
        options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False)
        try:
            writer = ocp.CheckpointManager(staging, item_names=ITEMS, options=options)
            try:
                writer.save(step, args=args, force=True)
                writer.wait_until_finished()
            finally:
                writer.close()
            self._barrier("staged", step)
            if primary:
                name = str(step)
                dir_swap.swap_in(
                    os.path.join(staging, name), os.path.join(self._path, name), staging
                )
            self._barrier("swapped", step)
        except (ValueError, TypeError, OSError) as e:
            raise _unsaved(step, self._path, e) from None
        finally:
            if primary:
                shutil.rmtree(staging, ignore_errors=True)
        self._open(create=True).reload()

    def _barrier(self, what: str, step: int) -> None:
        """Every process waits here (a no-op in one process); names are never reused."""
        if jax.process_count() > 1:
            self._barriers += 1
            ocp.multihost.sync_global_processes(f"fnnc_sharded_{what}_{step}_{self._barriers}")


def _unsaved(step: int, path: str, e: BaseException) -> CheckpointError:
    return CheckpointError(
        f"sharded checkpoint: step {step} in {path} cannot be saved "
        f"({type(e).__name__}: {str(e)[:300]}); save arrays in dicts, lists and tuples, "
        "on a filesystem with room; the steps saved before (and an earlier save of this "
        "step) are kept"
    )


def _check_json(manifest: dict[str, Any], step: int) -> None:
    try:
        json.dumps(manifest, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise CheckpointError(
            f"sharded checkpoint: metadata for step {step} is not JSON ({e}); use dicts, "
            "lists, str, int, finite floats, bool and None"
        ) from None


def step_number(step: Any, path: str) -> int:
    """``step`` as an int >= 0 (else CheckpointError naming the directory ``path``)."""
    step = as_step(step, "sharded checkpoint", path)
    if step < 0:
        raise CheckpointError(f"sharded checkpoint: step {step} for {path}: give an int >= 0")
    return step
