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
        check_whole_pages(conn, path)
        return conn
    except ERRORS as e:
        if conn is not None:
            conn.close()
        raise translate(e, path, "open") from e
    except TensorFileError:
        if conn is not None:
            conn.close()
        raise


def check_whole_pages(conn: sqlite3.Connection, path: str) -> None:
    """The file holds every page SQLite counts in it, else it was cut short.

    SQLite writes whole pages, and refuses a file missing pages its header counts, but
    it reads a last page cut part way (a copy or download stopped early) as if the rest
    were zeros: the tail of the tensor stored there reads back as zeros, and NNC's rows
    carry no checksum to tell. Checked under a read transaction (no rollback-journal
    writer changes the file meanwhile); not for WAL files, whose checkpoints extend the
    file while readers read. Bytes after the last page are no loss: SQLite ignores them.

    Raises:
        TensorFileError: the file is shorter than its pages.
    """
    began = not conn.in_transaction
    if began:
        conn.execute("BEGIN")
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the shared lock
        wal = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal"
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        size = os.stat(path).st_size
    finally:
        if began and conn.in_transaction:
            conn.execute("COMMIT")
    if not wal and size < pages * page:
        raise TensorFileError(
            f"{path}: the file is {size} bytes, short of its {pages} pages of {page} bytes "
            f"({pages * page} bytes): it was cut short (a copy or download stopped early), "
            f"and its last page ({size % page or page} of {page} bytes present) would read "
            "as zeros; copy or download it again"
        )


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
        else:
            check_whole_pages(conn, path)
        conn.execute("PRAGMA synchronous=FULL")
        return conn
    except ERRORS as e:
        if conn is not None:
            conn.close()
        raise translate(e, path, "open for writing") from e
    except TensorFileError:
        if conn is not None:
            conn.close()
        raise


def check_columns(conn: sqlite3.Connection, path: str) -> None:
    """A ``tensors`` table, where there is one, has NNC's columns and NNC's key: ``name``
    is unique (``PRIMARY KEY (name)``, so a write replaces a row) and rows have rowids
    (fnnc's checksums name them; ``WITHOUT ROWID`` tables have none)."""
    with translating(path, "open"):
        columns = [r[1] for r in conn.execute("PRAGMA table_info(tensors)")]
        if not columns:
            return
        lacking = [c for c in NNC_COLUMNS if c not in columns]
        kind, sql = conn.execute(
            "SELECT type, sql FROM sqlite_master WHERE name='tensors' AND type IN ('table', 'view')"
        ).fetchone()
        keyed = kind != "table" or _name_is_unique(conn)
        rowids = kind != "table" or not _without_rowid(conn, sql)
    if lacking:
        raise TensorFileError(
            f"{path}: its tensors table has columns ({', '.join(map(str, columns))}), not "
            f"NNC's ({', '.join(NNC_COLUMNS)}); lacking {', '.join(lacking)}. It was not "
            "written by NNC or fnnc: give an NNC tensor file"
        )
    for ok, what in (
        (keyed, "name is not its PRIMARY KEY (nor UNIQUE): a write would add a second row "
         "of a name and reads would return the old one"),
        (rowids, "it is a WITHOUT ROWID table: fnnc's checksums name rows by rowid"),
    ):  # fmt: skip
        if not ok:
            raise TensorFileError(
                f"{path}: its tensors table is not NNC's: {what}. NNC and fnnc make it with "
                f"{_NNC_TABLE}. It was not written by NNC or fnnc: copy its rows into a "
                "file with that table (INSERT INTO ... SELECT), or give an NNC tensor file"
            )


_NNC_TABLE = "CREATE TABLE tensors (name TEXT, ..., data BLOB, PRIMARY KEY (name))"


def _name_is_unique(conn: sqlite3.Connection) -> bool:
    """Whether ``tensors.name`` alone is the primary key or has a unique index."""
    keys = [r[1] for r in conn.execute("PRAGMA table_info(tensors)") if r[5]]
    if keys == ["name"]:
        return True
    for _, index, unique, _, partial in conn.execute("PRAGMA index_list(tensors)"):
        columns = [r[0] for r in conn.execute("SELECT name FROM pragma_index_info(?)", (index,))]
        if unique and not partial and columns == ["name"]:
            return True
    return False


def _without_rowid(conn: sqlite3.Connection, sql: str | None) -> bool:
    try:  # SQLite 3.37+ says so in table_list
        row = conn.execute(
            "SELECT wr FROM pragma_table_list WHERE schema='main' AND name='tensors'"
        ).fetchone()
        return bool(row and row[0])
    except sqlite3.OperationalError:
        return sql is not None and "WITHOUTROWID" in "".join(sql.upper().split())


NNC_GRAPH_TABLES = ("tensor_symbol", "graph_exec_symbol", "graph", "tensor_bind")
"""The tables of NNC's own symbolic graph files (``ccv_nnc_symbolic_graph_write``)."""


def no_tensors_table(conn: sqlite3.Connection, path: str) -> TensorFileError:
    """The error for a file without a ``tensors`` table. A file with no tables at all is
    what a first write that failed or was killed leaves of a new file: it says so."""
    with translating(path, "list tables"):
        query = "SELECT name FROM sqlite_master WHERE type='table'"
        tables = {r[0] for r in conn.execute(query)}
        empty = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
    if empty:
        return TensorFileError(
            f"{path}: no tensors table: the file is empty (no tables at all): no tensors "
            "were written to it yet, or its first write failed or was interrupted; write "
            "the tensors (again), or check the path"
        )
    if set(NNC_GRAPH_TABLES) <= tables:
        return TensorFileError(
            f"{path}: no tensors table: it is an NNC symbolic graph file "
            f"(ccv_nnc_symbolic_graph_write: tables {', '.join(NNC_GRAPH_TABLES)}), whose "
            "format fnnc does not read; rebuild the graph with fnnc.graph.GraphBuilder and "
            "save it with fnnc.graph.save, and store tensors with ccv_nnc_tensor_write "
            "(tensors table), which fnnc reads"
        )
    return TensorFileError(
        f"{path}: no tensors table (not an NNC tensor file; NNC creates it on its first "
        "ccv_nnc_tensor_write)"
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
