"""Opening a tensor file's SQLite connection: readers never create or change a file.

- :func:`open_reader` opens with SQLite's URI ``mode=ro``: a missing file is an error
  (plain ``sqlite3.connect`` would create it), nothing can be written through the
  connection (no tables appear in an unrelated database), and a file the process may
  not write (``chmod a-w``, a read-only mount) reads as any other.
- The one exception is a *hot journal*: a writer killed mid-transaction leaves
  ``<file>-journal``, and SQLite must roll it back before anyone may read (what is in
  the file may be half a transaction). A read-only connection cannot (SQLite's
  ``SQLITE_READONLY_ROLLBACK``); the reader then opens the file ``mode=rw`` with
  ``query_only`` once, which restores the last committed state (the only change a read
  ever causes, and the one any SQLite reader, NNC's included, makes) and writes nothing
  else. Without write access it is an error saying so.
- :func:`open_writer` opens ``mode=rwc`` (created if missing) with NNC's rollback
  journal, ``synchronous=FULL`` and, for a new file, 64 KiB pages.

WAL: fnnc never turns it on (see :mod:`fnnc.io.tensor_file`); a file another tool put
in WAL mode still reads, since SQLite's read-only WAL readers open the ``-wal`` and
``-shm`` side files (creating them when the folder is writable).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import urllib.parse

from fnnc.errors import TensorFileError
from fnnc.io.sqlite_errors import ERRORS, NNC_COLUMNS, translate, translating

PAGE_SIZE = 65536
"""Page size of new files (roughly halves the cost of writing large blobs)."""

TIMEOUT = 30.0
"""Seconds to wait for another process's lock before SQLite reports the file busy."""


def _uri(path: str, mode: str) -> str:
    return "file:" + urllib.parse.quote(os.path.abspath(path)) + f"?mode={mode}"


def _connect(path: str, mode: str) -> sqlite3.Connection:
    # check_same_thread=False: a file made in one thread (a data loader's per-thread
    # reader) may be closed by the garbage collector in another; each connection is
    # still used by one thread at a time, and SQLite itself is serialized.
    return sqlite3.connect(
        _uri(path, mode), uri=True, isolation_level=None, timeout=TIMEOUT,
        check_same_thread=False,
    )  # fmt: skip


def missing(path: str) -> TensorFileError:
    """The error for reading a file that does not exist."""
    where = os.path.dirname(os.path.abspath(path))
    hint = "" if os.path.isdir(where) else f" (the folder {where} does not exist either)"
    return TensorFileError(f"{path}: no such file{hint}; check the path (reading never creates it)")


def open_reader(path: str) -> sqlite3.Connection:
    """A read-only connection to the existing SQLite file ``path`` (header checked).

    Raises:
        TensorFileError: the file is missing, not SQLite, damaged, or has a hot journal
            that cannot be rolled back for lack of write access.
    """
    if not os.path.exists(path):
        raise missing(path)
    if not os.path.isfile(path):
        raise TensorFileError(f"{path}: not a file (a folder or device); give a tensor file")
    conn = None
    try:
        conn = _connect(path, "ro")
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.OperationalError as e:
            if getattr(e, "sqlite_errorname", "") != "SQLITE_READONLY_ROLLBACK":
                raise
            conn.close()
            conn = _rollback_then_read(path)
        return conn
    except ERRORS as e:
        if conn is not None:
            conn.close()
        raise translate(e, path, "open") from e


def _rollback_then_read(path: str) -> sqlite3.Connection:
    """A query-only read-write connection: opening it rolls a hot journal back."""
    folder = os.path.dirname(os.path.abspath(path))
    if not (os.access(path, os.W_OK) and os.access(folder, os.W_OK)):
        raise TensorFileError(
            f"{path}: cannot read: a writer was killed mid-transaction and left "
            f"{path}-journal, which must be rolled back before the file can be read; that "
            "needs write access to the file and its folder: open it once with write access"
        )
    conn = _connect(path, "rw")
    try:
        conn.execute("PRAGMA query_only=1")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except BaseException:
        conn.close()
        raise
    return conn


def open_writer(path: str) -> sqlite3.Connection:
    """A read-write connection to ``path``, created (empty) if it is missing.

    Raises:
        TensorFileError: the file is not SQLite, damaged, or cannot be created.
    """
    conn = None
    try:
        conn = _connect(path, "rwc")
        if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
            conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
        conn.execute("PRAGMA synchronous=FULL")
        return conn
    except ERRORS as e:
        if conn is not None:
            conn.close()
        raise translate(e, path, "open for writing") from e


def check_columns(conn: sqlite3.Connection, path: str) -> None:
    """A ``tensors`` table, where there is one, has NNC's columns."""
    with translating(path, "open"):
        columns = [r[1] for r in conn.execute("PRAGMA table_info(tensors)")]
    lacking = [c for c in NNC_COLUMNS if c not in columns]
    if columns and lacking:
        raise TensorFileError(
            f"{path}: its tensors table has columns ({', '.join(map(str, columns))}), not "
            f"NNC's ({', '.join(NNC_COLUMNS)}); lacking {', '.join(lacking)}. It was not "
            "written by NNC or fnnc: give an NNC tensor file"
        )


class Handle:
    """The connection of one file: read-only (:func:`open_reader`) from first use until
    the first write, then read-write (:func:`open_writer`; each outermost transaction
    runs ``setup``, e.g. ``CREATE TABLE IF NOT EXISTS``, through :meth:`create_tables`).
    Closed for good by :meth:`close`."""

    def __init__(self, path: str, *, setup: tuple[str, ...] = ()):
        self.path, self.setup = path, setup
        self.conn: sqlite3.Connection | None = None
        self.writing = self.closed = False
        self.tables: set[str] = set()
        """Tables known to exist (found once, they are not looked up again)."""

    def exists(self) -> bool:
        """Whether the file exists (or is open)."""
        return self.conn is not None or os.path.exists(self.path)

    def reader(self) -> sqlite3.Connection:
        """The connection, opened read-only if none is open."""
        if self.conn is None:
            self._not_closed()
            conn = open_reader(self.path)
            self._adopt(conn, writing=False)
        assert self.conn is not None
        return self.conn

    def writer(self) -> sqlite3.Connection:
        """The connection, reopened for writing (the file created) if it is read-only."""
        if not self.writing:
            self._not_closed()
            if self.conn is not None:
                self.conn.close()
                self.conn = None
            self._adopt(open_writer(self.path), writing=True)
        assert self.conn is not None
        return self.conn

    def create_tables(self) -> None:
        """Runs ``setup`` (``CREATE ... IF NOT EXISTS``) on the writer, inside the
        caller's transaction, so a batch that fails leaves no new tables either."""
        for statement in self.setup:
            self.writer().execute(statement)

    def remove_file(self) -> None:
        """Closes the connection and deletes the file (one this handle created, whose
        first transaction failed); the next write creates it anew."""
        if self.conn is not None:
            self.conn.close()
        self.conn, self.writing, self.tables = None, False, set()
        for leftover in (self.path, self.path + "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(leftover)

    def has_table(self, table: str) -> bool:
        """Whether the file has a table called ``table``."""
        if table not in self.tables:
            query = "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?"
            if self.reader().execute(query, (table,)).fetchone() is not None:
                self.tables.add(table)
        return table in self.tables

    def close(self) -> None:
        """Closes the connection; the handle cannot be used again."""
        if self.conn is not None:
            self.conn.close()
        self.conn, self.writing, self.closed = None, False, True

    def __del__(self) -> None:
        # A file dropped without close() (``TensorFile(path).names()``) closes its
        # connection here, as a file object does, rather than leaving it to the
        # garbage collector (which Python 3.13 reports as a ResourceWarning).
        conn = getattr(self, "conn", None)
        if conn is not None:
            # a finaliser must not raise; try/except, not contextlib.suppress: at
            # interpreter exit module globals such as contextlib may already be gone
            try:  # noqa: SIM105
                conn.close()
            except Exception:
                pass

    def _adopt(self, conn: sqlite3.Connection, *, writing: bool) -> None:
        try:
            check_columns(conn, self.path)
        except BaseException:
            conn.close()
            raise
        self.conn, self.writing, self.tables = conn, writing, set()

    def _not_closed(self) -> None:
        if self.closed:
            raise TensorFileError(f"{self.path}: the file was closed; open it again")
