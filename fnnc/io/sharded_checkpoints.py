"""Sharded checkpoints: each process writes only its own shards, through Orbax.

:class:`ShardedCheckpoints` has the surface of :class:`~fnnc.io.Checkpoints` (``save``,
``restore``, ``restore_into``, ``steps``, ``latest``, ``delete``, ``keep_last`` /
``keep_every`` retention), but a checkpoint is a directory that Orbax's
``CheckpointManager`` writes, one sub-directory per step:

- ``<step>/state``: the arrays (a model's parameters by id), saved as the
  ``jax.Array`` values they are on their mesh: every process writes the shards it
  holds (a replicated array once), nothing is gathered;
- ``<step>/optimizer``: the optimizer state, the same way;
- ``<step>/fnnc``: JSON: the format, the metadata (a model's training progress, random
  key, loss scale), the parameters' shapes and the layout they were saved on.

Orbax writes a step into a temporary directory and renames it when every process has
finished, so a run killed mid-save leaves the steps before it intact (the half-written
one is not listed). Re-saving a step writes the new one beside it and swaps the two
(:mod:`fnnc.io.dir_swap`): a failed or killed re-save leaves the old step. A restore
reads the manifest and the arrays of a step in several Orbax calls; it holds a shared
lock on the directory meanwhile (:meth:`ShardedCheckpoints.reading`), against the
exclusive one a save or delete holds (:func:`fnnc.core.files.folder_locked`), so it
sees one save of the step whole even while another process re-saves it. Restoring
reads each array straight into the layout asked for
(``like`` leaves of ``jax.ShapeDtypeStruct`` with a ``sharding``; a model's current
layout in :meth:`ShardedCheckpoints.restore_into`), so a checkpoint written by 2
processes restores on 1 device, on a 4-device mesh or on 2 processes again, and each
process reads only the shards it needs. A damaged step raises :class:`CheckpointError`
naming the directory and the step. (Saving: :class:`~fnnc.io.sharded_saving.ShardedSaving`.)

Every process of a multi-process run calls ``save`` and ``restore`` (they are
collectives); the path must be on a filesystem they share. The SQLite formats stay
the interop export: ``Model.write`` (NNC's model file) and :class:`Checkpoints`.

>>> import os, tempfile
>>> import jax.numpy as jnp
>>> from fnnc.io import ShardedCheckpoints
>>> path = os.path.join(tempfile.mkdtemp(), "run")
>>> with ShardedCheckpoints(path, keep_last=2) as ckpt:
...     for step in (10, 20, 30):
...         ckpt.save(step, {"w": jnp.full(3, step, jnp.float32)}, metadata={"loss": 1 / step})
...     print(ckpt.steps(), ckpt.restore().state["w"], ckpt.restore(20).metadata)
[20, 30] [30. 30. 30.] {'loss': 0.05}
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import jax
import orbax.checkpoint as ocp

from fnnc.core.files import folder_locked
from fnnc.errors import CheckpointError
from fnnc.io import checkpoint_trees as trees
from fnnc.io.checkpoints import Checkpoint, retention
from fnnc.io.sharded_saving import FORMAT as FORMAT
from fnnc.io.sharded_saving import ITEMS as ITEMS
from fnnc.io.sharded_saving import STAGING as STAGING
from fnnc.io.sharded_saving import VERSION as VERSION
from fnnc.io.sharded_saving import ShardedSaving, step_number
from fnnc.io.structure import template


class ShardedCheckpoints(ShardedSaving):
    """A checkpoint directory of training steps, each process writing its own shards.

    Args:
        path: the directory (created by the first save; each step is a sub-directory).
        keep_last: keep the newest ``keep_last`` steps.
        keep_every: keep every step divisible by ``keep_every``.

    Given either, a save deletes every other step (the newest and the one just saved
    always stay), so ``keep_every=1000`` alone keeps the multiples of 1000; with neither,
    every step is kept. ``Model.train(resume=path)`` and
    ``CheckpointEvery(path)`` take it (a path that is a directory is read as one);
    ``restore_into(model)`` puts a model's step back onto the model's own layout.

    >>> import os, tempfile
    >>> import numpy as np, optax
    >>> from fnnc.io import ShardedCheckpoints
    >>> from fnnc.models import Dense, Input, Model
    >>> def mlp():
    ...     x = Input()
    ...     model = Model(x, Dense(2, name="fc")(x))
    ...     model.compile(np.zeros((4, 3), np.float32), loss="mse", minimizer=optax.adam(0.1))
    ...     return model
    >>> a, b = mlp(), mlp()
    >>> loss = a.fit(np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32))
    >>> with ShardedCheckpoints(os.path.join(tempfile.mkdtemp(), "run")) as ckpt:
    ...     ckpt.save(1, a)
    ...     _ = ckpt.restore_into(b)
    >>> bool((a.parameters()["t-fc-0-0"] == b.parameters()["t-fc-0-0"]).all())
    True
    """

    sharded = True  # how fnnc.models tells it from the gathered Checkpoints

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
    ):
        self.keep_last, self.keep_every = retention(keep_last, keep_every)
        if not isinstance(path, (str, os.PathLike)):
            raise CheckpointError(
                f"ShardedCheckpoints: the path is {type(path).__name__} {path!r:.40}; give the "
                "directory's path as a str or os.PathLike, e.g. ShardedCheckpoints('run.ckpt')"
            )
        self._path = os.path.abspath(os.fspath(path))
        if os.path.isfile(self._path):
            raise CheckpointError(
                f"sharded checkpoint: {self._path} is a file (a Checkpoints SQLite journal?); "
                "ShardedCheckpoints writes a directory: open the file with "
                "fnnc.io.Checkpoints, or give a new path"
            )
        self._manager: Any = None
        self._barriers = 0
        self._held = threading.local()  # how deep this thread is in reading()

    @property
    def path(self) -> str:
        return self._path

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None

    def __enter__(self) -> ShardedCheckpoints:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def steps(self) -> list[int]:
        """Retained (completely written) steps, ascending; none for a missing directory."""
        manager = self._open(create=False)
        if manager is None:
            return []
        manager.reload()  # another process (or run) may have saved since
        return sorted(manager.all_steps())

    @property
    def latest(self) -> int | None:
        """The newest (largest) step, or ``None`` when there is none."""
        steps = self.steps()
        return steps[-1] if steps else None

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Holds the steps as they are while a restore reads one in several calls: a
        shared lock on the directory, which saves and deletes wait for (they hold an
        exclusive one from their first change on disk to their last), so the manifest
        and the arrays read inside come from one save. Nothing is locked for a
        directory that does not exist, nor where the system cannot lock
        (:func:`fnnc.core.files.folder_locked`).

        It nests: inside it, this thread's ``manifest``, ``restore`` and ``reading``
        keep the one lock it holds rather than take another (a second lock on a new
        file descriptor, closed on return, would drop the first where ``flock`` is
        emulated by per-process POSIX locks, as on NFS). The lock is advisory and holds
        on local filesystems; on NFS a save's exclusive lock is not taken (see
        :func:`~fnnc.core.files.folder_locked`), so there a restore is not protected
        from a concurrent re-save or delete."""
        depth = getattr(self._held, "depth", 0)
        if depth or not os.path.isdir(self._path):
            self._held.depth = depth + 1
            try:
                yield
            finally:
                self._held.depth = depth
            return
        with folder_locked(self._path, shared=True):
            self._held.depth = 1
            try:
                yield
            finally:
                self._held.depth = 0

    def _writing(self) -> Any:
        """The exclusive lock a save or delete holds (by process 0, the one that moves
        steps into place; the others wait at its barriers, not on the lock).

        Process 0 takes it before the ``recover`` barrier, so while an outside reader
        holds :meth:`reading` the other processes wait at that barrier. Taking it later
        would not spare them: each change process 0 makes on disk that a reader can
        see (the new step's rename inside Orbax's save, the swap, retention's deletes)
        comes after a barrier and before the next one (or one inside Orbax's save), so
        its wait for the lock is always a wait of the others at that one. So a
        restore by another job must take less time than the barrier's timeout (Orbax's
        ``sync_global_processes``: 300 s with its distributed barrier)."""
        if jax.process_index() != 0:
            return contextlib.nullcontext()
        return folder_locked(self._path)

    def manifest(self, step: int | None = None) -> dict[str, Any]:
        """The JSON of ``step`` (default: the newest): format, metadata, and for a
        model its parameters' shapes, optimizer-state paths and saved layout."""
        with self.reading():
            return self._manifest(self.find_step(step))

    def restore(
        self, step: int | None = None, *, like: Any = None, optimizer_like: Any = None
    ) -> Checkpoint:
        """The checkpoint of ``step`` (default: the newest) as a :class:`Checkpoint`.

        Args:
            step: which retained step; ``None`` for the newest.
            like: a template of the state (arrays or ``jax.ShapeDtypeStruct`` leaves):
                its tree structure, and the ``sharding`` of its leaves (each process
                then reads only its shards). Without it, the saved structure comes back
                (tuples, NamedTuples such as Optax states, int keys: the step's manifest
                keeps it) with its arrays on one device.
            optimizer_like: the same for the optimizer state.

        Raises:
            CheckpointError: no checkpoints, an unknown step, or a damaged step.
        """
        with self.reading():  # the manifest and the arrays of one save
            return self._restore(step, like, optimizer_like)

    def _restore(self, step: int | None, like: Any, optimizer_like: Any) -> Checkpoint:
        step = self.find_step(step)
        manifest = self._manifest(step)
        saved = manifest.get("structure") or {}
        where = f"sharded checkpoint: step {step} in {self._path}"
        if like is None and saved.get("state") is not None:
            like = template(saved["state"], where)
        state = self.read_arrays(step, "state", like)
        optimizer = None
        if manifest.get("optimizer_saved"):
            if optimizer_like is None and saved.get("optimizer") is not None:
                optimizer_like = template(saved["optimizer"], where)
            optimizer = self.read_arrays(step, "optimizer", optimizer_like)
        created = manifest.get("created")
        created = float(created) if isinstance(created, (int, float)) else 0.0
        return Checkpoint(step, state, optimizer, manifest.get("metadata"), created)

    def restore_into(self, model: Any, step: int | None = None) -> Checkpoint:
        """Restores a saved model (parameters, optimizer state, random key, training
        progress) into ``model``, onto its current layout (its mesh may differ from the
        one the step was saved on); returns the :class:`Checkpoint` (its ``state``:
        the parameters as ``jax.Array`` values laid out as the model's).

        Raises:
            CheckpointError: the step is of another model (naming every missing, extra
                and mis-shaped parameter id), its optimizer state does not fit the
                model's minimizer, or the step is damaged.
        """
        return model.restore_checkpoint(self, step)

    def delete(self, step: int) -> None:
        """Deletes one step (every process calls it)."""
        step = step_number(step, self._path)
        if step not in self.steps():
            raise CheckpointError(f"sharded checkpoint: no step {step} in {self._path}")
        with self._writing():
            self._open(create=True).delete(step)

    # -- reading, for fnnc.models ---------------------------------------------------
    def find_step(self, step: int | None) -> int:
        """``step`` checked to be retained, or the newest for ``None`` (else CheckpointError)."""
        steps = self.steps()
        if step is None:
            if not steps:
                why = "" if os.path.isdir(self._path) else " (the directory does not exist)"
                raise CheckpointError(f"sharded checkpoint: {self._path} holds no steps{why}")
            return steps[-1]
        step = step_number(step, self._path)
        if step not in steps:
            raise CheckpointError(
                f"sharded checkpoint: no step {step} in {self._path}; retained steps: {steps}"
            )
        return step

    def read_arrays(self, step: int, item: str, like: Any) -> Any:
        """Item ``item`` (``"state"`` or ``"optimizer"``) of ``step``, each leaf laid
        out as the matching leaf of ``like`` (``None``: as saved, on one device)."""
        where = f"sharded checkpoint: step {step} in {self._path}"
        target = None if like is None else trees.keyed(jax.tree.map(trees.spec, like))
        args = ocp.args.StandardRestore(target)
        try:
            got = self._open(create=False).restore(step, args=ocp.args.Composite(**{item: args}))
        except Exception as e:  # Orbax, TensorStore and OS errors alike: the step is damaged
            raise CheckpointError(
                f"{where}: its {item!r} cannot be read ({type(e).__name__}: {str(e)[:300]}); "
                f"the checkpoint is damaged or was not saved with this structure: restore "
                f"another step (retained: {self.steps()})"
            ) from None
        if like is None:
            return trees.unkeyed(got[item])
        return trees.placed(like, jax.tree.leaves(got[item]))

    # -- internals ------------------------------------------------------------------
    def _open(self, *, create: bool) -> Any:
        """The Orbax manager (``None`` for a directory that does not exist and need not)."""
        if self._manager is None:
            if not create and not os.path.isdir(self._path):
                return None
            options = ocp.CheckpointManagerOptions(
                create=True,  # retention: _expired (Orbax's max_to_keep goes by save time)
                enable_async_checkpointing=False,  # save returns once the step is committed
            )
            self._manager = ocp.CheckpointManager(self._path, item_names=ITEMS, options=options)
        return self._manager

    def _manifest(self, step: int) -> dict[str, Any]:
        where = f"sharded checkpoint: step {step} in {self._path}"
        try:
            got = self._open(create=False).restore(
                step, args=ocp.args.Composite(fnnc=ocp.args.JsonRestore())
            )
            manifest = got["fnnc"]
        except Exception as e:
            raise CheckpointError(
                f"{where}: its fnnc metadata cannot be read ({type(e).__name__}: "
                f"{str(e)[:200]}); the checkpoint is damaged: restore another step"
            ) from None
        kind = (
            (manifest.get("format"), manifest.get("version")) if isinstance(manifest, dict) else ()
        )
        if kind != (FORMAT, VERSION):
            raise CheckpointError(
                f"{where} has an unknown format (expected a JSON object with format "
                f"{FORMAT!r}, version {VERSION})"
            )
        return manifest
