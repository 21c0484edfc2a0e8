"""How :class:`~fnnc.io.Checkpoints` reads a step back (a mixin): the step's manifest
row, checked against its checksum and fnnc's format, and each tensor row it names, read
exactly as the manifest describes it, into a :class:`Checkpoint`; with the step-number
and manifest checks that saving and deleting share."""

from __future__ import annotations

import dataclasses
import json
import math
import operator
from typing import Any

import numpy as np

from fnnc.errors import CheckpointError, TensorFileError, TensorNotFoundError
from fnnc.io import integrity, tree

FORMAT, VERSION = "fnnc.checkpoint", 1


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One restored step.

    Attributes:
        step: the training step.
        state: the saved state, in its saved structure (a dict id -> array when a model
            with ``parameters()`` was saved).
        optimizer_state: the saved optimizer state, or ``None``.
        metadata: the saved JSON metadata, or ``None``.
        created: the save time (seconds since the epoch).
    """

    step: int
    state: Any
    optimizer_state: Any
    metadata: Any
    created: float


class JournalReading:
    """:class:`~fnnc.io.Checkpoints`' ``restore`` (see module doc)."""

    file: Any  # Checkpoints': its TensorFile
    path: Any
    latest: Any
    steps: Any
    _journal: Any

    def restore(
        self, step: int | None = None, *, like: Any = None, optimizer_like: Any = None
    ) -> Checkpoint:
        """The checkpoint of ``step`` (default: the newest) as a :class:`Checkpoint`.

        Args:
            step: which retained step; ``None`` for the newest.
            like: a template of the state: its tree structure is used (any pytree,
                custom nodes included) instead of the saved one; leaves must match.
            optimizer_like: the same for the optimizer state (e.g. ``opt.init(params)``).

        Raises:
            CheckpointError: no checkpoints (or no file), an unknown step, a damaged
                manifest or row, or a NamedTuple class that is not imported and no
                template.
            TensorFileError: the file is not SQLite or its pages are damaged.
        """
        with self.file.operation(f"restore checkpoint step {step}"), self.file.snapshot():
            return self._restore(step, like, optimizer_like)  # one committed state

    def _restore(self, step: int | None, like: Any, optimizer_like: Any) -> Checkpoint:
        if step is None:
            step = self.latest
            if step is None:
                why = "" if self.file.exists() else " (the file does not exist; check the path)"
                raise CheckpointError(f"checkpoint: {self.path} holds no checkpoints{why}")
        step = step_number(step, self.path)
        row = self._manifest_row(step) if self._journal() else None
        if row is None:
            raise CheckpointError(
                f"checkpoint: no step {step} in {self.path}; retained steps: {self.steps()}"
            )
        where = f"checkpoint: step {step} in {self.path}"
        integrity.check_manifest(where, step, *row)
        manifest = parse_manifest(row[1], where)
        created = row[0]
        if isinstance(created, bool) or not isinstance(created, (int, float)):
            raise CheckpointError(f"{where}: its save time is {created!r:.40}, not a number")
        read = lambda name, shape, dtype: self._row(name, shape, dtype, where)
        out = []
        for key, template in (("state", like), ("optimizer", optimizer_like)):
            if key not in manifest:
                raise CheckpointError(f"{where}: the manifest has no {key!r} entry; it is damaged")
            try:
                value = tree.decode(manifest[key], read, loose=template is not None, where=where)
            except RecursionError:
                raise CheckpointError(f"{where}: the {key} is nested too deeply") from None
            out.append(value if template is None else tree.rebuild(value, template, key))
        return Checkpoint(step, out[0], out[1], manifest.get("metadata"), float(created))

    def _manifest_row(self, step: int) -> tuple[Any, Any, Any] | None:
        """``(created, manifest, checksum)`` of ``step`` (checksum ``None`` in files
        saved before fnnc wrote it), or ``None`` for a step the journal lacks."""
        conn = self.file.connection
        checksum = integrity.MANIFEST_COLUMN if integrity.manifest_checksums(conn) else "NULL"
        query = f"SELECT created, manifest, {checksum} FROM fnnc_checkpoints WHERE step=?"
        return conn.execute(query, (step,)).fetchone()

    def _row(self, name: str, shape: tuple[int, ...], dtype: np.dtype, where: str) -> np.ndarray:
        """Row ``name`` as the manifest describes it, exactly (or CheckpointError)."""
        try:
            arr = self.file.read(name)
        except TensorNotFoundError:
            raise CheckpointError(
                f"{where}: the manifest names tensor row {name!r}, which the file lacks; the "
                f"checkpoint is damaged (retained steps: {self.steps()})"
            ) from None
        except TensorFileError as e:
            raise CheckpointError(f"{where}: {e}") from e
        if arr.dtype != dtype or arr.size != math.prod(shape):
            raise CheckpointError(
                f"{where}: row {name!r} holds {arr.dtype}{list(arr.shape)}, the manifest says "
                f"{dtype}{list(shape)}; the checkpoint is damaged"
            )
        return arr.reshape(shape)


def as_step(step: Any, what: str, path: str) -> int:
    """``step`` as an int (Python or NumPy; a bool is no step), else a
    :class:`CheckpointError` saying ``what`` (``"checkpoint"``) and ``path``."""
    try:
        if isinstance(step, (bool, np.bool_)):  # True is no step number
            raise TypeError
        return operator.index(step)
    except TypeError:
        hint = (  # restore(model): the model in the step's place
            "; to restore into a model, call restore_into(model, step)"
            if hasattr(step, "checkpoint_state")
            else ""
        )
        raise CheckpointError(
            f"{what}: step {step!r:.40} for {path} is a {type(step).__name__}; give an int{hint}"
        ) from None


def step_number(step: Any, path: str) -> int:
    """``step`` as an int SQLite can store (a 64-bit signed integer); else CheckpointError."""
    step = as_step(step, "checkpoint", path)
    if not -(2**63) <= step < 2**63:
        raise CheckpointError(f"checkpoint: step {step} for {path} is outside SQLite's int64 range")
    return step


def parse_manifest(text: Any, where: str) -> dict[str, Any]:
    """The manifest JSON of one step, checked to be fnnc's."""
    try:
        manifest = json.loads(text)
    except (TypeError, ValueError, RecursionError) as e:
        raise CheckpointError(
            f"{where}: its manifest is not JSON ({type(e).__name__}: {str(e)[:100]}); the "
            "checkpoint is damaged, restore another step"
        ) from None
    kind = (manifest.get("format"), manifest.get("version")) if isinstance(manifest, dict) else ()
    if kind != (FORMAT, VERSION):
        raise CheckpointError(
            f"{where} has an unknown format (expected a JSON object with format "
            f"{FORMAT!r}, version {VERSION})"
        )
    return manifest
