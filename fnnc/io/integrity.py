"""Row checksums in fnnc's own side table, and :func:`verify` of a whole file.

NNC's ``tensors`` table stays byte for byte what NNC writes and reads; the checksums
live beside it::

    fnnc_checksums (name TEXT PRIMARY KEY, row INTEGER, algo TEXT, digest TEXT, shape TEXT)

``row`` is the SQLite rowid of the ``tensors`` row the digest was computed for, written
in the same transaction as that row. ``shape`` is the array's shape as JSON where NNC's
``dim`` cannot say it: ``"[]"`` for a row written from a rank-0 array, which NNC sees
(and ``dim`` holds) as ``[1]`` and fnnc reads back as ``()``, and the shape of a
zero-size array (``"[0, 4]"``; ``dim`` is all zeros, ``(0,)`` to NNC); ``NULL``
otherwise. Files
made before the column read as before (a scalar as ``[1]``); fnnc adds the column the
next time it writes to such a file. The file also carries three triggers
(:data:`TRIGGERS`) that drop a name's checksum whenever any SQLite writer inserts,
replaces, updates or deletes that row: NNC's ``REPLACE INTO tensors``, s4nnc's
``DELETE FROM tensors`` followed by a write (which reuses the rowid), a script's
``UPDATE``. Triggers live in the file, so every SQLite writer runs them, NNC's
included; a row another writer changed therefore reads as *unchecked*, never as
damaged, while damage that bypasses SQLite (flipped bits on disk) is still caught.
A row's recorded shape goes with its checksum, so a scalar row that NNC rewrote reads
as the ``[1]`` NNC wrote. NNC reads only the ``tensors`` table and ignores the rest.

Files written before fnnc kept these triggers still read (reads never write); fnnc adds
the triggers the next time it writes to the file. In such a file a row another writer
replaced reads as unchecked through its changed rowid (``VACUUM`` may renumber rowids:
same effect); one it deleted and wrote again can reuse the rowid and read as a mismatch,
and the error then says so. To remove fnnc's bookkeeping from a file, drop the triggers
with the table (``DROP TRIGGER fnnc_checksums_on_insert`` and so on): SQLite refuses
writes to ``tensors`` whose triggers name a missing table.

The digest (``crc32``, the fastest stdlib hash here and made for detecting damaged
bytes: any burst of up to 32 flipped bits is caught) covers ``type``, ``format``,
``datatype``, ``dim`` and ``data`` as stored (encoded rows: the encoded bytes).

A checkpoint's manifest (its row of ``fnnc_checkpoints``, :mod:`fnnc.io.checkpoints`)
is checked the same way: the row's ``checksum`` column holds ``"<algo>:<digest>"`` of
its ``step``, ``created`` and ``manifest``, written in the same statement. Steps saved
before fnnc wrote that column (a ``NULL`` checksum, or a table without the column)
restore unchecked, as NNC-written tensor rows read; saving a step into such a file
adds the column and checks the new step.

>>> import os, sqlite3, tempfile
>>> import numpy as np
>>> from fnnc.io import TensorFile
>>> path = os.path.join(tempfile.mkdtemp(), "w.sqlite")
>>> with TensorFile(path) as f:
...     f.write("w", np.arange(4, dtype=np.float32))
>>> with open(path, "rb") as file:  # damage: bytes change behind SQLite's back
...     raw = file.read()
>>> stored, ones = np.arange(4, dtype=np.float32).tobytes(), np.ones(4, np.float32).tobytes()
>>> with open(path, "wb") as file:
...     _ = file.write(raw.replace(stored, ones))
>>> report = TensorFile(path, readonly=True).verify()
>>> report.ok, [name for name, _ in report.damaged]
(False, ['w'])
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sqlite3
import struct
import zlib
from typing import TYPE_CHECKING, Any

from fnnc.errors import CheckpointError, FnncError, TensorFileError
from fnnc.io import format as fmt
from fnnc.io.sqlite_errors import ERRORS

if TYPE_CHECKING:
    from fnnc.io.tensor_file import TensorFile

TABLE = "fnnc_checksums"
CREATE = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} "
    "(name TEXT PRIMARY KEY, row INTEGER, algo TEXT, digest TEXT, shape TEXT)"
)
ALGO = "crc32"
SHAPE_COLUMN = "shape"
"""The column of :data:`TABLE` holding fnnc's shape of a row NNC's ``dim`` cannot
describe (a rank-0 array: ``"[]"``; a zero-size one: ``"[0, 4]"``); absent in files
made before it."""

_EVENTS = (("INSERT", "NEW.name"), ("UPDATE", "OLD.name OR name=NEW.name"), ("DELETE", "OLD.name"))
TRIGGER_NAMES = tuple(f"{TABLE}_on_{event.lower()}" for event, _ in _EVENTS)
TRIGGERS = tuple(
    f"CREATE TRIGGER IF NOT EXISTS {trigger} AFTER {event} ON tensors "
    f"BEGIN DELETE FROM {TABLE} WHERE name={names}; END"
    for trigger, (event, names) in zip(TRIGGER_NAMES, _EVENTS, strict=True)
)
"""Keep checksums current under any SQLite writer: a row inserted (``REPLACE``
included), updated or deleted loses its checksum; fnnc's own write records the new one
after its insert, in the same transaction."""

CHECKED, UNCHECKED, STALE = "checked", "unchecked", "stale"
"""What :func:`check` found: the digest matched; no checksum; one for an older row."""

MANIFESTS, MANIFEST_COLUMN = "fnnc_checkpoints", "checksum"


def digest(fields: tuple[int, int, int, bytes], data: Any, algo: str = ALGO) -> str | None:
    """The hex digest of a row (``(type, format, datatype, dim)`` and ``data``), or
    ``None`` for an algorithm this fnnc does not know."""
    type_, format_, datatype, dim = fields
    head = struct.pack("<3q", type_, format_, datatype) + dim
    if algo == "crc32":
        return f"{zlib.crc32(data, zlib.crc32(head)):08x}"
    if algo == "sha256":
        return hashlib.sha256(head + bytes(data)).hexdigest()
    return None


def manifest_digest(step: Any, created: Any, manifest: Any, algo: str = ALGO) -> str | None:
    """The hex digest of a checkpoint's manifest row (its ``step``, ``created`` and
    ``manifest`` values as SQLite gives them back), or ``None`` for an unknown ``algo``.
    ``repr`` of the step and the save time is exact: a REAL reads back as the float
    written, and any other value it was changed to gives another digest."""
    text = manifest if isinstance(manifest, bytes) else str(manifest).encode("utf-8", "replace")
    data = f"{step!r}\n{created!r}\n".encode() + text
    if algo == "crc32":
        return f"{zlib.crc32(data):08x}"
    if algo == "sha256":
        return hashlib.sha256(data).hexdigest()
    return None


def _has_column(conn: sqlite3.Connection, table: str, column: str) -> bool:
    columns = conn.execute(f"PRAGMA table_info({table})").fetchall()
    return any(c[1] == column for c in columns)


def _add_column(conn: sqlite3.Connection, table: str, column: str) -> None:
    """Adds the TEXT ``column`` to ``table`` made before it (inside the caller's
    transaction); the rows already there keep ``NULL``."""
    if not _has_column(conn, table, column):
        conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT")


def manifest_checksums(conn: sqlite3.Connection) -> bool:
    """Whether the file's checkpoint table has the checksum column (files saved
    before it have none; reading adds nothing)."""
    return _has_column(conn, MANIFESTS, MANIFEST_COLUMN)


def add_manifest_checksums(conn: sqlite3.Connection) -> None:
    """Adds the checksum column to a checkpoint table made before it (inside the
    caller's transaction: a save); the steps already there keep ``NULL``."""
    _add_column(conn, MANIFESTS, MANIFEST_COLUMN)


def check_manifest(where: str, step: Any, created: Any, manifest: Any, stored: Any) -> str:
    """:data:`CHECKED` or :data:`UNCHECKED` (no checksum, or an unknown algorithm) for
    one row of the checkpoint table, ``stored`` being its ``checksum`` value.

    Raises:
        CheckpointError: the row's values do not match the checksum saved with them.
    """
    if stored is None:
        return UNCHECKED
    algo, _, value = stored.partition(":") if isinstance(stored, str) else ("", "", "")
    computed = manifest_digest(step, created, manifest, algo) if value else None
    if computed is None and value:
        return UNCHECKED
    if computed != value:
        raise CheckpointError(
            f"{where}: its manifest does not match the checksum saved with it "
            f"({stored!r:.80} stored, {computed} computed now): the step's "
            "progress, metadata or tree changed after fnnc wrote them (disk damage or an "
            "edit); the checkpoint is damaged, restore another step"
        )
    return CHECKED


def shapes_recorded(conn: sqlite3.Connection) -> bool:
    """Whether the file's checksum table has the :data:`SHAPE_COLUMN` (tables made
    before it have none; reading adds nothing)."""
    return _has_column(conn, TABLE, SHAPE_COLUMN)


def add_shape_column(conn: sqlite3.Connection) -> None:
    """Adds :data:`SHAPE_COLUMN` to a checksum table made before it (inside the
    caller's transaction: a write); the rows already there keep ``NULL``."""
    _add_column(conn, TABLE, SHAPE_COLUMN)


def record(
    conn: sqlite3.Connection,
    name: str,
    rowid: int,
    value: str,
    shape: tuple[int, ...] | None = None,
) -> None:
    """Stores the checksum of row ``rowid``, and ``shape`` where NNC's ``dim`` cannot
    hold it (``()``; ``None``: the ``dim`` says it), inside the caller's transaction,
    which has added :data:`SHAPE_COLUMN` (:func:`add_shape_column`)."""
    text = None if shape is None else json.dumps(list(shape))
    query = f"REPLACE INTO {TABLE} (name, row, algo, digest, {SHAPE_COLUMN}) VALUES (?, ?, ?, ?, ?)"
    conn.execute(query, (name, rowid, ALGO, value, text))


def recorded_shapes(conn: sqlite3.Connection, name: Any = None) -> dict[Any, tuple[Any, Any]]:
    """``name -> (row, shape)`` of the checksum table's rows that record a shape (all of
    them, or ``name``'s): one query, no ``PRAGMA``; ``{}`` in a table made before
    :data:`SHAPE_COLUMN`. Check each with :func:`written_shape`."""
    where, params = ("", ()) if name is None else (" WHERE name=?", (name,))
    cursor = conn.execute(f"SELECT * FROM {TABLE}{where}", params)
    columns = [d[0] for d in cursor.description]
    if not {"name", "row", SHAPE_COLUMN} <= set(columns):  # an older (or edited) table
        return {}
    at = [columns.index(c) for c in ("name", "row", SHAPE_COLUMN)]
    return {r[at[0]]: (r[at[1]], r[at[2]]) for r in cursor if r[at[2]] is not None}


def written_shape(
    recorded: tuple[Any, Any] | None, rowid: int, stored: tuple[int, ...]
) -> tuple[int, ...] | None:
    """fnnc's shape of row ``rowid`` (``()`` for a rank-0 array NNC sees as ``[1]``) from
    its ``(row, shape)`` entry of :func:`recorded_shapes`, or ``None``: no shape
    recorded (files without :data:`SHAPE_COLUMN`, rows NNC wrote), one recorded for an
    older row (another writer replaced it since), or one that does not hold the
    ``stored`` shape's elements (not fnnc's: the ``dim`` is read as it is)."""
    if recorded is None or recorded[0] != rowid or not isinstance(recorded[1], str):
        return None
    text = recorded[1]
    try:  # damage or an edit may have left anything here: never an error, never deep
        shape = json.loads(text) if len(text) <= 16 * fmt.MAX_DIM else None
    except (ValueError, RecursionError):
        return None
    if not (
        isinstance(shape, list)
        and len(shape) <= fmt.MAX_DIM
        and all(type(d) is int and d >= 0 for d in shape)
        and math.prod(shape) == math.prod(stored)
    ):
        return None
    return tuple(shape)


def forget(conn: sqlite3.Connection, names: list[Any]) -> None:
    """Drops the checksums of ``names`` (inside the caller's transaction)."""
    conn.executemany(f"DELETE FROM {TABLE} WHERE name=?", [(n,) for n in names])


def check(
    conn: sqlite3.Connection, where: str, name: Any, rowid: int, fields: Any, data: bytes
) -> tuple[str, dict[Any, tuple[Any, Any]]]:
    """:data:`CHECKED`, :data:`UNCHECKED` or :data:`STALE` for one row just read, and
    its recorded shape as :func:`recorded_shapes` of ``name`` gives it (one query).

    Raises:
        TensorFileError: the row's bytes do not match the checksum written with them.
    """
    cursor = conn.execute(f"SELECT * FROM {TABLE} WHERE name=?", (name,))
    found = cursor.fetchone()
    if found is None:
        return UNCHECKED, {}
    entry = dict(zip([d[0] for d in cursor.description], found))
    row, algo, stored, text = (entry.get(c) for c in ("row", "algo", "digest", SHAPE_COLUMN))
    shapes = {} if text is None else {name: (row, text)}
    if row != rowid:
        return STALE, shapes
    computed = digest(fields, data, algo) if isinstance(algo, str) else None
    if computed is None:
        return UNCHECKED, shapes
    if computed != stored:
        raise TensorFileError(
            f"{where}: checksum mismatch ({algo} {stored!r:.70} stored with the row, "
            f"{computed} computed now): its bytes changed after fnnc wrote them (disk "
            f"damage){_untracked(conn)}; restore the file from a copy, or rewrite the tensor"
        )
    return CHECKED, shapes


def _untracked(conn: sqlite3.Connection) -> str:
    """What else a mismatch may mean in a file without :data:`TRIGGERS` (written by an
    older fnnc): another writer deleted the row and wrote it again under the same rowid."""
    query = "SELECT count(*) FROM sqlite_master WHERE type='trigger' AND name IN (?, ?, ?)"
    if conn.execute(query, TRIGGER_NAMES).fetchone()[0] == len(TRIGGERS):
        return ""
    return (
        ", or another writer (NNC, sqlite3) deleted the row and wrote it again: this file "
        "predates the triggers that keep fnnc's checksums current (fnnc adds them on its "
        "next write)"
    )


@dataclasses.dataclass(frozen=True)
class IntegrityReport:
    """What :meth:`fnnc.io.TensorFile.verify` found.

    Attributes:
        path: the file.
        checked: rows whose checksum matched (checkpoint manifests as
            ``<manifest of checkpoint step S>``).
        unchecked: rows that read fine but carry no current checksum (written by NNC,
            or rewritten by it after fnnc wrote them; manifests saved before fnnc
            wrote their checksums).
        damaged: ``(row name, why)`` for every row that cannot be read as stored, and
            ``("<file>", why)`` for damage SQLite's ``integrity_check`` found in the
            file's structure.
    """

    path: str
    checked: tuple[str, ...]
    unchecked: tuple[str, ...]
    damaged: tuple[tuple[str, str], ...]

    @property
    def ok(self) -> bool:
        """No damage found."""
        return not self.damaged

    def lines(self) -> list[str]:
        """The report as text, one finding per line."""
        total = len(self.checked) + len(self.unchecked) + len(self.damaged)
        head = f"{self.path}: {total} rows: {len(self.checked)} match their checksum, "
        head += f"{len(self.unchecked)} have none, {len(self.damaged)} damaged"
        return [head] + [f"  damaged: {name}: {why}" for name, why in self.damaged]

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def raise_if_damaged(self) -> IntegrityReport:
        """Raises :class:`TensorFileError` listing every damaged row; else returns self."""
        if self.damaged:
            raise TensorFileError(str(self) + "\nrestore the file from a copy")
        return self


def verify(file: TensorFile) -> IntegrityReport:
    """Checks the file's structure and every row (see :meth:`TensorFile.verify`)."""
    damaged: list[tuple[str, str]] = []
    status: dict[str, list[str]] = {CHECKED: [], UNCHECKED: [], STALE: []}
    conn = file.connection
    try:
        problems = [r[0] for r in conn.execute("PRAGMA integrity_check(100)")]
        damaged += [("<file>", str(p)) for p in problems if p != "ok"]
    except ERRORS as e:
        damaged.append(("<file>", f"{e} (SQLite's integrity_check could not run)"))
    try:
        names = file.names()
    except FnncError as e:
        return IntegrityReport(file.path, (), (), (*damaged, ("<tensors>", str(e))))
    for name in names:
        if (why := fmt.untitled(name, file.path)) is not None:
            damaged.append((fmt.label(name), why))
            continue
        try:
            if file.info(name).dtype is None:  # NNC's palettized QX: its own format
                status[UNCHECKED].append(str(name))
                continue
            status[file.load_row(name, decode=False)[2]].append(str(name))
        except FnncError as e:
            damaged.append((str(name), str(e)))
    if file.has_table(MANIFESTS):
        _verify_manifests(file, status, damaged)
    return IntegrityReport(
        file.path, tuple(status[CHECKED]), tuple(status[UNCHECKED] + status[STALE]), tuple(damaged)
    )


def _verify_manifests(
    file: TensorFile, status: dict[str, list[str]], damaged: list[tuple[str, str]]
) -> None:
    """Checks every checkpoint manifest into ``status`` and ``damaged``, each named
    ``<manifest of checkpoint step S>``."""
    conn = file.connection
    column = MANIFEST_COLUMN if manifest_checksums(conn) else "NULL"
    query = f"SELECT step, created, manifest, {column} FROM {MANIFESTS} ORDER BY step"
    try:
        rows = conn.execute(query).fetchall()
    except ERRORS as e:
        damaged.append((f"<{MANIFESTS}>", f"{e} (its rows cannot be read)"))
        return
    for step, created, manifest, stored in rows:
        name = f"<manifest of checkpoint step {step}>"
        where = f"checkpoint: step {step} in {file.path}"
        try:
            status[check_manifest(where, step, created, manifest, stored)].append(name)
        except CheckpointError as e:
            damaged.append((name, str(e)))
