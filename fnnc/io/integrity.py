"""Row checksums in fnnc's own side table, and :func:`verify` of a whole file.

NNC's ``tensors`` table stays byte for byte what NNC writes and reads; the checksums
live beside it::

    fnnc_checksums (name TEXT PRIMARY KEY, row INTEGER, algo TEXT, digest TEXT)

``row`` is the SQLite rowid of the ``tensors`` row the digest was computed for, written
in the same transaction as that row. A writer that knows nothing of this table (NNC's
``REPLACE INTO tensors``) gives the row a new rowid, so its checksum is recognisably
*stale* and the row reads as unchecked, not as damaged; ``VACUUM`` may renumber rowids
too (same effect). Rows without a checksum (files NNC wrote) read as before.

The digest (``crc32``, the fastest stdlib hash here and made for detecting damaged
bytes: any burst of up to 32 flipped bits is caught) covers ``type``, ``format``,
``datatype``, ``dim`` and ``data`` as stored (encoded rows: the encoded bytes).

>>> import os, sqlite3, tempfile
>>> import numpy as np
>>> from fnnc.io import TensorFile
>>> path = os.path.join(tempfile.mkdtemp(), "w.sqlite")
>>> with TensorFile(path) as f:
...     f.write("w", np.arange(4, dtype=np.float32))
>>> conn = sqlite3.connect(path)  # change the bytes of the row behind fnnc's back
>>> ones = np.ones(4, np.float32).tobytes()
>>> _ = conn.execute("UPDATE tensors SET data=? WHERE name='w'", (ones,))
>>> conn.commit(); conn.close()
>>> report = TensorFile(path, readonly=True).verify()
>>> report.ok, [name for name, _ in report.damaged]
(False, ['w'])
"""

from __future__ import annotations

import dataclasses
import hashlib
import sqlite3
import struct
import zlib
from typing import TYPE_CHECKING, Any

from fnnc.errors import FnncError, TensorFileError
from fnnc.io.sqlite_errors import ERRORS

if TYPE_CHECKING:
    from fnnc.io.tensor_file import TensorFile

TABLE = "fnnc_checksums"
CREATE = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} "
    "(name TEXT PRIMARY KEY, row INTEGER, algo TEXT, digest TEXT)"
)
ALGO = "crc32"

CHECKED, UNCHECKED, STALE = "checked", "unchecked", "stale"
"""What :func:`check` found: the digest matched; no checksum; one for an older row."""


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


def record(conn: sqlite3.Connection, name: str, rowid: int, value: str) -> None:
    """Stores the checksum of row ``rowid`` (inside the caller's transaction)."""
    query = f"REPLACE INTO {TABLE} (name, row, algo, digest) VALUES (?, ?, ?, ?)"
    conn.execute(query, (name, rowid, ALGO, value))


def forget(conn: sqlite3.Connection, names: list[Any]) -> None:
    """Drops the checksums of ``names`` (inside the caller's transaction)."""
    conn.executemany(f"DELETE FROM {TABLE} WHERE name=?", [(n,) for n in names])


def check(
    conn: sqlite3.Connection, where: str, name: Any, rowid: int, fields: Any, data: bytes
) -> str:
    """:data:`CHECKED`, :data:`UNCHECKED` or :data:`STALE` for one row just read.

    Raises:
        TensorFileError: the row's bytes do not match the checksum written with them.
    """
    query = f"SELECT row, algo, digest FROM {TABLE} WHERE name=?"
    found = conn.execute(query, (name,)).fetchone()
    if found is None:
        return UNCHECKED
    row, algo, stored = found
    if row != rowid:
        return STALE
    computed = digest(fields, data, algo) if isinstance(algo, str) else None
    if computed is None:
        return UNCHECKED
    if computed != stored:
        raise TensorFileError(
            f"{where}: checksum mismatch ({algo} {stored!r:.70} stored with the row, "
            f"{computed} computed now): its bytes changed after fnnc wrote them (disk "
            "damage or an edit); restore the file from a copy, or rewrite the tensor"
        )
    return CHECKED


@dataclasses.dataclass(frozen=True)
class IntegrityReport:
    """What :meth:`fnnc.io.TensorFile.verify` found.

    Attributes:
        path: the file.
        checked: rows whose checksum matched.
        unchecked: rows that read fine but carry no current checksum (written by NNC,
            or rewritten by it after fnnc wrote them).
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
        try:
            status[file.load_row(name, decode=False)[2]].append(str(name))
        except FnncError as e:
            damaged.append((str(name), str(e)))
    return IntegrityReport(
        file.path, tuple(status[CHECKED]), tuple(status[UNCHECKED] + status[STALE]), tuple(damaged)
    )
