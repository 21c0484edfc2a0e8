"""Checkpoints: a journal of training steps in one SQLite file, each saved atomically.

Layout (one file, beside NNC's ``tensors`` table):

- ``tensors``: every array, as NNC tensor rows named ``__ckpt-<step>__[<label>]``, where
  ``<label>`` is a parameter id (state given as a model with ``parameters()``), or
  ``state<path>`` / ``optimizer<path>`` (pytrees; ``<path>`` like ``['w'][0].mu``).
  NNC's ``ccv_cnnp_model_read(handle, "ckpt-<step>", ...)`` reads a model's step.
- ``fnnc_checkpoints (step INTEGER PRIMARY KEY, created REAL, manifest TEXT, checksum
  TEXT)``: per step the JSON tree of the state and optimizer state (see
  :mod:`fnnc.io.tree`), metadata, and a checksum of the row, checked as tensor rows'
  are (:mod:`fnnc.io.integrity`; steps saved before it restore unchecked).

A save is one SQLite transaction (rows, manifest and the retention deletes together),
so a process killed at any instant leaves the previous checkpoints intact: the next
opener rolls the half-written one back. Only process 0 of a multi-process run writes
(:mod:`fnnc.io.processes`).

Reading writes nothing: a missing file is an empty journal (``steps() == []``, so
``train(resume=path)`` starts fresh) and :meth:`Checkpoints.restore` says the file does
not exist; an SQLite file without the journal table (any other database) is left as it
is. A damaged manifest (changed after it was saved, not JSON, wrong types, out-of-range
values, rows it names that the file lacks) raises :class:`CheckpointError` naming the
file and the step (reading a step back: :mod:`fnnc.io.checkpoint_reading`).

>>> import os, tempfile
>>> import numpy as np
>>> from fnnc.io import Checkpoints
>>> path = os.path.join(tempfile.mkdtemp(), "run.ckpt")
>>> with Checkpoints(path, keep_last=2) as ckpt:
...     for step in (10, 20, 30):
...         ckpt.save(step, {"w": np.full(3, step, np.float32)}, metadata={"loss": 1 / step})
...     print(ckpt.steps(), ckpt.restore().state["w"], ckpt.restore(20).metadata)
[20, 30] [30. 30. 30.] {'loss': 0.05}
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np

from fnnc.errors import CheckpointError
from fnnc.io import integrity, tree
from fnnc.io.checkpoint_reading import FORMAT as FORMAT
from fnnc.io.checkpoint_reading import VERSION as VERSION
from fnnc.io.checkpoint_reading import Checkpoint as Checkpoint
from fnnc.io.checkpoint_reading import JournalReading, parse_manifest, step_number
from fnnc.io.processes import writes_files
from fnnc.io.tensor_file import TensorFile

_CREATE = (
    "CREATE TABLE IF NOT EXISTS fnnc_checkpoints "
    "(step INTEGER PRIMARY KEY, created REAL, manifest TEXT, checksum TEXT)"
)


class Checkpoints(JournalReading):
    """A checkpoint journal: :meth:`save` steps, :meth:`restore` any retained one.

    Args:
        path: the SQLite file (created by the first save; may be shared with model
            tensors).
        keep_last: keep the newest ``keep_last`` steps.
        keep_every: keep every step divisible by ``keep_every``.

    Given either, a save deletes every other step (the newest and the one just saved
    always stay), so ``keep_every=1000`` alone keeps the multiples of 1000; with neither,
    every step is kept.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
    ):
        self.keep_last, self.keep_every = retention(keep_last, keep_every)
        if isinstance(path, (str, os.PathLike)) and os.path.isdir(path):
            raise CheckpointError(
                f"checkpoint: {os.fspath(path)} is a directory (a ShardedCheckpoints one?); "
                "Checkpoints keeps one SQLite file: open the directory with "
                "fnnc.io.ShardedCheckpoints, or give a file path"
            )
        self.file = TensorFile(path)

    @property
    def path(self) -> str:
        return self.file.path

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def steps(self) -> list[int]:
        """Retained steps, ascending (none for a file that does not exist yet)."""
        with self.file.operation("list checkpoint steps"):
            if not self._journal():
                return []
            query = "SELECT step FROM fnnc_checkpoints ORDER BY step"
            return [r[0] for r in self.file.connection.execute(query)]

    @property
    def latest(self) -> int | None:
        """The newest (largest) step, or ``None`` when there is none."""
        with self.file.operation("list checkpoint steps"):
            if not self._journal():
                return None
            query = "SELECT max(step) FROM fnnc_checkpoints"
            return self.file.connection.execute(query).fetchone()[0]

    def save(
        self,
        step: int,
        state: Any,
        optimizer_state: Any = None,
        metadata: Any = None,
    ) -> None:
        """Saves one generation atomically (replacing an earlier save of ``step``).

        Args:
            step: the training step (an int >= 0).
            state: a pytree of arrays (dict/list/tuple/NamedTuple/None containers), an
                object with ``parameters() -> dict[str, array]``, or a compiled cnnp
                model: then everything to resume training is saved, see
                :meth:`restore_into` (any object with ``checkpoint_state(row, metadata,
                step)``, which :class:`fnnc.models.Model` implements).
            optimizer_state: e.g. an Optax state; restored in the same structure.
            metadata: anything JSON can hold (loss, epoch, config; NumPy and JAX scalars
                are stored as Python numbers); a dict with a model.

        In a multi-process run every process calls this (a model's state is gathered
        first), and only process 0 writes the file.
        """
        step = step_number(step, self.path)
        if step < 0:  # as sharded checkpoints: a step counts training steps, from 0
            raise CheckpointError(
                f"checkpoint: step {step} for {self.path}: a saved step is the training step, "
                "an int >= 0 (e.g. model.train_progress.step)"
            )
        prefix = f"__ckpt-{step}__["
        source, metadata = "pytree", tree.plain_metadata(metadata)
        row = lambda label: f"{prefix}{label}]"
        if callable(getattr(state, "checkpoint_state", None)):  # a model: everything to resume
            if optimizer_state is not None:
                raise CheckpointError(
                    "checkpoint: a model's optimizer state is saved with it; drop optimizer_state="
                )
            state_data, opt_data, metadata, rows = state.checkpoint_state(row, metadata, step)
            source = "model"
        else:
            if callable(getattr(state, "parameters", None)):
                state, source = dict(state.parameters()), "parameters"
            if source == "parameters":  # rows named by parameter id, as NNC names them
                encoded = [(k, tree.encode(v, str(k), row)) for k, v in state.items()]
                state_data = {"$dict": [[k, data] for k, (data, _) in encoded]}
                rows = [r for _, (_, leaf_rows) in encoded for r in leaf_rows]
            else:
                state_data, rows = tree.encode(state, "state", row)
            opt_data, opt_rows = tree.encode(optimizer_state, "optimizer", row)
            rows += opt_rows
        names = [name for name, _ in rows]
        if len(set(names)) != len(names):
            raise CheckpointError(f"checkpoint: step {step} would write duplicate rows")
        manifest = {"format": FORMAT, "version": VERSION, "source": source}
        manifest.update(state=state_data, optimizer=opt_data, metadata=metadata)
        try:
            text = json.dumps(manifest, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint: metadata for step {step} is not JSON ({e}); "
                "use dicts, lists, str, int, finite floats, bool and None"
            ) from None
        if not writes_files():
            return
        with self.file.operation(f"save checkpoint step {step}"), self.file.transaction():
            conn = self.file.connection
            conn.execute(_CREATE)
            integrity.add_manifest_checksums(conn)  # a file saved by an older fnnc
            self._drop([step])
            for name, array in rows:
                self.file.write(name, array)
            created = time.time()
            checksum = f"{integrity.ALGO}:{integrity.manifest_digest(step, created, text)}"
            query = (
                "INSERT INTO fnnc_checkpoints (step, created, manifest, checksum) "
                "VALUES (?, ?, ?, ?)"
            )
            conn.execute(query, (step, created, text, checksum))
            self._drop(self._expired(step))

    def restore_into(self, model: Any, step: int | None = None) -> Checkpoint:
        """Restores a saved model (parameters, optimizer state, random key, training
        progress) into ``model``, compiled the same way; returns the :class:`Checkpoint`.
        ``model.train(data, epochs=E)`` then continues the run where it was saved.
        Parameters saved in another float dtype than the model's (a float32 run restored
        into a model built on float16 inputs) are converted to the model's, and the
        float leaves of the optimizer state (Adam's moments) with them.

        Raises:
            CheckpointError: the checkpoint is of another model (listing the missing,
                extra and mis-shaped parameter ids), or its optimizer state does not
                fit the model's minimizer (another structure, or a leaf of another kind
                of dtype: a float where it keeps an integer).

        >>> import os, tempfile
        >>> import numpy as np, optax
        >>> from fnnc.io import Checkpoints
        >>> from fnnc.models import Dense, Input, Model
        >>> def mlp():
        ...     x = Input()
        ...     model = Model(x, Dense(2, name="fc")(x))
        ...     model.compile(np.zeros((4, 3), np.float32), loss="mse", minimizer=optax.adam(0.1))
        ...     return model
        >>> a, b = mlp(), mlp()
        >>> loss = a.fit(np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32))
        >>> with Checkpoints(os.path.join(tempfile.mkdtemp(), "run.ckpt")) as ckpt:
        ...     ckpt.save(1, a)
        ...     _ = ckpt.restore_into(b)
        ...     rows = sorted(ckpt.file.names())
        >>> bool((a.parameters()["t-fc-0-0"] == b.parameters()["t-fc-0-0"]).all())
        True
        >>> [r for r in rows if "/" in r]  # doctest: +NORMALIZE_WHITESPACE
        ['__ckpt-1__[t-fc-0-0/count]', '__ckpt-1__[t-fc-0-0/mu]', '__ckpt-1__[t-fc-0-0/nu]',
         '__ckpt-1__[t-fc-0-1/count]', '__ckpt-1__[t-fc-0-1/mu]', '__ckpt-1__[t-fc-0-1/nu]']
        """
        if not hasattr(model, "restore_checkpoint"):
            raise CheckpointError(
                f"restore_into: expected a compiled fnnc.models Model, got "
                f"{type(model).__name__}; restore plain state with ckpt.restore(step)"
            )
        return model.restore_checkpoint(self, step)

    def delete(self, step: int) -> None:
        """Deletes one step (its rows and its manifest) atomically (process 0 only)."""
        step = step_number(step, self.path)
        if step not in self.steps():
            raise CheckpointError(f"checkpoint: no step {step} in {self.path}")
        if writes_files():
            with self.file.operation(f"delete checkpoint step {step}"), self.file.transaction():
                self._drop([step])

    # -- internals ---------------------------------------------------------------
    def _journal(self) -> bool:
        """Whether the file exists and holds the journal table (reading creates neither)."""
        return self.file.exists() and self.file.has_table("fnnc_checkpoints")

    def _expired(self, saved: int) -> list[int]:
        if self.keep_last is None and self.keep_every is None:
            return []
        steps = self.steps()
        keep = {saved, steps[-1]}  # the one just written and the newest are never dropped
        if self.keep_last is not None:
            keep.update(steps[-self.keep_last :])
        if self.keep_every is not None:
            keep.update(s for s in steps if s % self.keep_every == 0)
        return [s for s in steps if s not in keep]

    def _drop(self, steps: list[int]) -> bool:
        """Deletes ``steps`` inside the caller's transaction. A step whose manifest is
        damaged (or changed since it was saved) loses every row named as its rows are
        (``__ckpt-<step>__[...]``)."""
        conn, dropped = self.file.connection, False
        for step in steps:
            found = self._manifest_row(step)
            if found is None:
                continue
            try:  # a changed manifest may name rows of other steps: not trusted
                integrity.check_manifest("", step, *found)
                names = _row_names(parse_manifest(found[1], ""))
            except CheckpointError:
                prefix = f"__ckpt-{step}__["
                names = [n for n in self.file.names() if str(n).startswith(prefix)]
            self.file.discard(names)
            conn.execute("DELETE FROM fnnc_checkpoints WHERE step=?", (step,))
            dropped = True
        return dropped


def retention(keep_last: Any, keep_every: Any) -> tuple[int | None, int | None]:
    """``keep_last`` and ``keep_every`` as Python ints (or ``None``), checked: each a
    positive Python or NumPy int. A float (``2.0``, ``2.5``) or a bool is refused when the
    journal is opened, not taken (``keep_every=2.5`` divides no step, so every save would
    delete every other step) or left to fail at the first save, after the training step."""
    out = []
    for what, value in (("keep_last", keep_last), ("keep_every", keep_every)):
        whole = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
        if value is not None and (not whole or value < 1):
            raise CheckpointError(
                f"{what}={value!r} ({type(value).__name__}): expected a positive int or None"
            )
        out.append(None if value is None else int(value))
    return out[0], out[1]


def _row_names(data: dict[str, Any]) -> list[str]:
    """Every row a manifest names (iterative: a deep manifest cannot exhaust the stack)."""
    found: list[str] = []
    stack = [data.get("state"), data.get("optimizer")]
    while stack:
        x = stack.pop()
        if isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, dict):
            if isinstance(x.get("$array"), str):
                found.append(x["$array"])
            stack.extend(x.values())
    return found
