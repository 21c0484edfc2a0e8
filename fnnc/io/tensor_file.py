"""TensorFile: NNC's SQLite tensor file (``ccv_nnc_tensor_write`` / ``ccv_nnc_tensor_read``).

Journal: SQLite's rollback journal (``journal_mode=DELETE``, what NNC itself gets from
``sqlite3_open``) with ``synchronous=FULL``. A committed file is one self-contained file
that NNC, the ``sqlite3`` shell or a copy tool can take at any moment; WAL would leave
recent commits in a ``-wal`` side file, needs write access to the directory even to
read, and (measured) writes large blobs several times slower, since each page is
written to the log and again to the database. A transaction killed half-way leaves a
hot journal that the next opener rolls back, so readers never see part of a batch.
New files get 64 KiB pages, which roughly halves the cost of writing large blobs; any
SQLite, NNC's included, reads any page size.

Reads never create or change a file: it is read-only (:mod:`fnnc.io.connections`)
until the first write creates it. Each SQLite error becomes a ``TensorFileError``
naming file and operation (:mod:`fnnc.io.sqlite_errors`); rows carry checksums in a
side table, checked on read (:mod:`fnnc.io.integrity`); reading a row back:
:mod:`fnnc.io.tensor_reading`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from fnnc.core.params import require_flag
from fnnc.errors import TensorFileError, TensorNotFoundError
from fnnc.io import connections, integrity
from fnnc.io import format as fmt
from fnnc.io.codecs import Decoder, Encoder, encode_with
from fnnc.io.format import TensorInfo
from fnnc.io.integrity import IntegrityReport
from fnnc.io.sqlite_errors import operation_method as _operation
from fnnc.io.sqlite_errors import translating
from fnnc.io.tensor_reading import RowReading

__all__ = ["Decoder", "Encoder", "TensorFile"]

_CREATE = (
    "CREATE TABLE IF NOT EXISTS tensors "
    "(name TEXT, type INTEGER, format INTEGER, datatype INTEGER, "
    "dim BLOB, data BLOB, PRIMARY KEY (name))"
)


class _PathTypeError(TensorFileError, TypeError):
    """A path (or a row name) that is no path: a :class:`TensorFileError` that ``except
    TypeError`` (what ``os.fspath`` raised before) still catches."""


class TensorFile(RowReading):
    """An NNC tensor file: named arrays in SQLite, readable by NNC and by fnnc.

    Args:
        path: the file. It is created (with NNC's ``tensors`` table) by the first
            write, never by opening or reading: reading a missing file is an error, and
            so is reading a file left empty by a first write that failed.
        readonly: refuse writes; the file must exist and hold a ``tensors`` table.

    NNC has no rank 0: a scalar (a rank-0 array) is stored as NNC's ``[1]``, which is
    what NNC and the ``tensors`` table hold, and fnnc notes it in its side table
    (:mod:`fnnc.io.integrity`), so :meth:`read` and :meth:`info` give it back as
    ``()``. Rows NNC wrote, or rewrote since, and scalars in files written by fnnc
    before it kept that note read as ``[1]``; ``read(name, shape=())`` reads any
    one-element row as a scalar. A zero-size array (``(0, 4)``), whose ``dim`` NNC reads
    as ``(0,)``, is noted the same way and read back in its own shape.

    >>> import os, tempfile
    >>> import numpy as np
    >>> from fnnc.io import TensorFile
    >>> path = os.path.join(tempfile.mkdtemp(), "weights.sqlite")
    >>> with TensorFile(path) as f:
    ...     f.write("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    ...     with f.transaction():  # all or nothing
    ...         f.write("b", np.zeros(3, np.float16))
    ...         f.write("step", np.int32(7))  # NNC sees [1]; fnnc reads ()
    ...     print(f.names(), f.info("w").shape, f.read("b", dtype=np.float32).dtype)
    ...     print(repr(f.read("step")), f.info("step").shape, f.read("step", shape=(1,)))
    ['b', 'step', 'w'] (2, 3) float32
    array(7, dtype=int32) () [7]
    """

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False):
        try:
            self.path = os.fspath(path)
        except TypeError:
            raise _PathTypeError(
                f"TensorFile: the path is {type(path).__name__} {path!r:.40}; give the "
                "file's path as a str or os.PathLike, e.g. TensorFile('weights.sqlite')"
            ) from None
        self.readonly = readonly = require_flag(
            readonly, "TensorFile(readonly=...)", TensorFileError
        )
        self._depth = 0
        self._snapshots = 0
        self._op: str | None = None
        self._handle = connections.Handle(
            self.path, setup=(_CREATE, integrity.CREATE, *integrity.TRIGGERS)
        )
        if readonly or os.path.exists(self.path):
            self._handle.reader()  # a missing, non-SQLite or damaged file fails here
            if readonly and not self.has_table("tensors"):
                error = connections.no_tensors_table(self._handle.reader(), self.path)
                self.close()
                raise error

    # -- plumbing ------------------------------------------------------------
    @property
    def connection(self) -> sqlite3.Connection:
        """The SQLite connection, for fnnc.io's own tables: read-only until the first
        write; write only inside :meth:`transaction` (which opens it for writing)."""
        return self._handle.reader()

    def exists(self) -> bool:
        """Whether the file exists (reading a missing file raises)."""
        return self._handle.exists()

    @contextlib.contextmanager
    def operation(self, what: str) -> Iterator[None]:
        """Names the work in the block (``"restore step 3"``) in the errors it raises:
        SQLite errors become :class:`TensorFileError` naming the file and ``what``. The
        outermost operation names the error; methods of this class are operations."""
        outer = self._op
        self._op = what if outer is None else outer
        try:
            with translating(self.path, self._op):
                yield
        finally:
            self._op = outer

    def has_table(self, table: str) -> bool:
        """Whether the file has a table called ``table``."""
        with self.operation("list tables"):
            return self._handle.has_table(table)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[TensorFile]:
        """Makes the writes inside the block one atomic batch: all of them or none.

        An exception inside the block, or while the batch starts (making fnnc's tables
        on a full disk), rolls the batch back, releases the file's write lock and
        propagates; the TensorFile stays usable, so a retry can succeed. Nested
        blocks are savepoints: an inner failure undoes only the inner writes. The file
        is created here if it does not exist, and fnnc's tables are made inside the
        batch: a failed first batch leaves an existing file exactly as it was, and a
        file it created empty (0 bytes, no tables; it reads as "empty: no tensors
        written yet"). That file is not removed: another process may have opened it
        by then and be writing to it.
        """
        depth = self._depth
        if self._snapshots and not depth:
            raise TensorFileError(
                f"{self.path}: cannot write inside snapshot(), a read-only view of one "
                "commit; write after the block, or read and write inside transaction(), "
                "whose reads also see one state"
            )
        begin, commit, rollback = "BEGIN IMMEDIATE", ["COMMIT"], ["ROLLBACK"]
        if depth:
            sp = f"fnnc_{depth}"
            begin, commit = f"SAVEPOINT {sp}", [f"RELEASE {sp}"]
            rollback = [f"ROLLBACK TO {sp}", f"RELEASE {sp}"]
        with self.operation("write"):
            conn = self._writer()
            conn.execute(begin)
            try:
                if not depth:
                    self._handle.create_tables()
                    integrity.add_shape_column(conn)  # a file written by an older fnnc
            except BaseException:
                # e.g. a full disk, or a `tensors` view: undone here, as a failure in the
                # block is, so the write lock is released and a retry starts afresh
                self._undo(conn, rollback)
                raise
        self._depth = depth + 1
        try:
            yield self
            with self.operation("write (commit)"):
                for statement in commit:
                    conn.execute(statement)
        except BaseException:
            self._undo(conn, rollback)
            raise
        finally:
            self._depth = depth

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[TensorFile]:
        """Makes the reads inside the block see one committed state of the file: a read
        transaction holds SQLite's shared lock, so another process's commit (a
        checkpoint save whose retention drops the step being read) waits for the block
        to end instead of changing rows between two reads. A no-op inside
        :meth:`transaction` or another snapshot, and for a file that does not exist.
        Writing inside it raises :class:`TensorFileError` (read and write inside
        :meth:`transaction` instead)."""
        if self._depth or not self.exists():
            yield self
            return
        with self.operation("read"):
            conn = self.connection
            began = not conn.in_transaction
            if began:
                conn.execute("BEGIN")
        self._snapshots += 1
        try:
            yield self
        finally:
            self._snapshots -= 1
            if began and conn is self._handle.conn and conn.in_transaction:  # not closed
                with contextlib.suppress(sqlite3.Error):  # a read has nothing to commit
                    conn.execute("COMMIT")

    def _undo(self, conn: sqlite3.Connection, rollback: list[str]) -> None:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # the first error is the one to see
                for statement in rollback:
                    conn.execute(statement)
        self._handle.tables = set()  # tables made in the batch are gone again

    def close(self) -> None:
        """Closes the file (an open transaction is rolled back)."""
        self._handle.close()

    def __enter__(self) -> TensorFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TensorFile({self.path!r}{', readonly=True' if self.readonly else ''})"

    def _tensors(self) -> sqlite3.Connection:
        conn = self._handle.reader()
        if not self._depth and not self.has_table("tensors"):  # a batch makes it
            raise connections.no_tensors_table(conn, self.path)
        return conn

    # -- listing ---------------------------------------------------------------
    @_operation("list")
    def names(self) -> list[str]:
        """Every tensor name in the file, sorted."""
        return [r[0] for r in self._tensors().execute("SELECT name FROM tensors ORDER BY name")]

    @_operation("list")
    def __contains__(self, name: object) -> bool:
        query = "SELECT 1 FROM tensors WHERE name=?"
        return isinstance(name, str) and bool(self._tensors().execute(query, (name,)).fetchall())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    @_operation("list")
    def __len__(self) -> int:
        return self._tensors().execute("SELECT count(*) FROM tensors").fetchone()[0]

    @_operation("read", named=True)
    def info(self, name: str) -> TensorInfo:
        """The row's metadata without reading its data.

        Raises:
            TensorNotFoundError: no such name.
            TensorFileError: the row is not in NNC's format.
        """
        query = "SELECT rowid, name, type, format, datatype, dim, length(data) FROM tensors "
        row = self._tensors().execute(query + "WHERE name=?", (name,)).fetchone()
        if row is None:
            raise self._missing(name)
        return self._as_written(fmt.row_info(*row[1:], path=self.path), row[0])

    @_operation("list")
    def infos(self) -> list[TensorInfo]:
        """:meth:`info` of every row, sorted by name."""
        query = "SELECT rowid, name, type, format, datatype, dim, length(data) FROM tensors "
        conn = self._tensors()
        rows = conn.execute(query + "ORDER BY name").fetchall()
        shapes = integrity.recorded_shapes(conn) if self.has_table(integrity.TABLE) else {}
        return [self._as_written(fmt.row_info(*r[1:], path=self.path), r[0], shapes) for r in rows]

    @_operation("verify")
    def verify(self) -> IntegrityReport:
        """Checks every row: SQLite's ``integrity_check`` of the file's structure, each
        row's format and length, and its checksum where fnnc wrote one; and each
        checkpoint step's manifest against its checksum (reported as
        ``<manifest of checkpoint step S>``).

        Returns:
            an :class:`~fnnc.io.integrity.IntegrityReport` listing every damaged row
            (``.ok``, ``.damaged``; ``.raise_if_damaged()`` raises
            :class:`TensorFileError` with the list).
        """
        return integrity.verify(self)

    # -- writing ---------------------------------------------------------------
    @_operation("write", named=True)
    def write(
        self,
        name: str,
        array: Any,
        format: str | int = "NHWC",  # noqa: A002 (NNC's word)
        *,
        device: str = "CPU",
        encoder: Encoder | None = None,
    ) -> None:
        """Stores ``array`` under ``name`` as NNC does (replacing a row of that name),
        with its checksum, in one transaction.

        Args:
            name: the row's name.
            array: anything ``np.asarray`` takes (NumPy, JAX): float32, float16,
                bfloat16, float64, int32, int64 or uint8; up to 12 dimensions.
            format: the layout tag NNC keeps with the tensor.
            device: recorded in ``type``: ``"CPU"`` (NNC's any-CPU, 0xfff01),
                ``"GPU:0"``, ... (``"GPU"`` is ``"GPU:0"``: NNC's GPU tensors name
                their device)
            encoder: a :class:`Codec`, a registered codec's identifier or name (NNC's
                ``"q4p"`` .. ``"q8p"``, ``"ezm7"``, ``"zip"``, ``"fpzip"``), or a
                function ``(data, dtype, shape) -> (identifier, bytes)``; ``None`` or a
                declining encoder (returning ``None``) stores raw bytes.
        """
        self._writable(f"tensor {name!r}")
        if not isinstance(name, str):
            raise _PathTypeError(
                f"{self.path}: tensor names are str, got {type(name).__name__} {name!r:.40}; "
                "name the row, e.g. f.write('t-fc-0-0', array)"
            )
        where = f"tensor {name!r} in {self.path}"
        if "\x00" in name:
            raise TensorFileError(
                f"{where}: NNC passes names as C strings, so it cannot read a name holding "
                f"NUL ('\\x00'): it would look up {name.partition(chr(0))[0]!r}; choose a "
                "name without it"
            )
        arr = fmt.storable(array, where)  # NNC's view: a rank-0 array is [1]
        # fnnc's shape, in its side table, where NNC's dim cannot hold it: rank 0 (NNC's
        # [1]) and zero-size arrays (a dim read up to its first 0 loses the other axes)
        shape = tuple(np.shape(array)) if np.ndim(array) == 0 or np.size(array) == 0 else None
        data: bytes | memoryview = memoryview(arr.reshape(-1).view(np.uint8))
        identifier = 0
        if encoder is not None:
            identifier, data = encode_with(encoder, bytes(data), arr.dtype, arr.shape, where)
        type_ = fmt.pack_type(device, identifier, where)
        type_ = type_ - 2**64 if type_ >= 2**63 else type_
        format_, datatype = fmt.pack_format(format, where), fmt.CODES[arr.dtype]
        fields = (type_, format_, datatype, fmt.pack_dim(arr.shape))
        query = "REPLACE INTO tensors (name, type, format, datatype, dim, data) VALUES "
        with self.transaction():
            conn = self._writer()
            cursor = conn.execute(query + "(?, ?, ?, ?, ?, ?)", (name, *fields, data))
            rowid = cursor.lastrowid
            assert rowid is not None
            integrity.record(conn, name, rowid, integrity.digest(fields, data) or "", shape)

    @_operation("write", named=True)
    def delete(self, name: str) -> None:
        """Removes the row ``name``; :class:`TensorNotFoundError` if there is none."""
        self._writable(f"tensor {name!r}")
        if not self.exists() or self.discard([name]) == 0:
            raise self._missing(name)

    @_operation("write")
    def discard(self, names: Iterable[str]) -> int:
        """Removes the rows among ``names`` that exist (and their checksums) in one
        transaction; returns how many were removed."""
        self._writable("tensors")
        names = list(names)
        with self.transaction():
            conn = self._writer()
            removed = conn.executemany("DELETE FROM tensors WHERE name=?", [(n,) for n in names])
            integrity.forget(conn, names)
        return removed.rowcount

    # -- internals -------------------------------------------------------------
    def _writer(self) -> sqlite3.Connection:
        self._writable("the file")
        return self._handle.writer()

    def _writable(self, what: str) -> None:
        if self.readonly:
            raise TensorFileError(f"cannot change {what}: {self.path} is open with readonly=True")

    def _missing(self, name: Any) -> TensorNotFoundError:
        names = self.names() if self.exists() else []
        shown = ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
        return TensorNotFoundError(
            f"no tensor {name!r:.80} in {self.path} ({len(names)} tensors: {shown or 'none'})"
        )
