"""SQLite's errors as :class:`~fnnc.errors.TensorFileError`: the one translation point.

Everything :mod:`fnnc.io` does to a file goes through an *operation* (``read``,
``write``, ``list``, ``restore``, ``inspect``, ...) opened with :func:`translating`.
A raw :class:`sqlite3.Error` raised inside becomes a ``TensorFileError`` that names the
file, the operation and what to do, chosen by SQLite's error code (Python 3.11+ gives
it as ``sqlite_errorname``), so ``database disk image is malformed`` and ``database or
disk is full`` read as what they mean for a tensor file. The original error stays
attached as ``__cause__``.

>>> import sqlite3
>>> from fnnc.io.sqlite_errors import translate
>>> conn = sqlite3.connect(":memory:")  # no table: SQLite's "no such table"
>>> try:
...     conn.execute("SELECT data FROM tensors")
... except sqlite3.Error as e:
...     print(translate(e, "w.sqlite", "read"))  # doctest: +ELLIPSIS
w.sqlite: cannot read: no such table: tensors; the file's tables are not NNC's layout ...
>>> conn.close()
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from fnnc.errors import TensorFileError

NNC_COLUMNS = ("name", "type", "format", "datatype", "dim", "data")
"""The columns of NNC's ``tensors`` table, in order."""

_ADVICE: tuple[tuple[str, str], ...] = (
    (
        "SQLITE_CORRUPT",
        "the file is damaged; restore it from a copy (python -m fnnc inspect --verify "
        "FILE lists what is still readable)",
    ),
    (
        "SQLITE_NOTADB",
        "it is not an SQLite database (NNC tensor files, model files and fnnc checkpoints "
        "are); check the path",
    ),
    (
        "SQLITE_READONLY_ROLLBACK",
        "a writer was killed mid-transaction and its journal must be rolled back, which "
        "needs write access to the file and its folder; open it once with write access",
    ),
    (
        "SQLITE_READONLY",
        "the file or its folder is read-only; reading needs no write access, but this "
        "operation writes: copy the file somewhere writable or change its permissions",
    ),
    (
        "SQLITE_FULL",
        "the disk is full (or the file reached its size limit); nothing of this operation "
        "was kept: free space and retry",
    ),
    (
        "SQLITE_TOOBIG",
        "one value exceeds SQLite's size limit (about 1 GiB per blob by default); store "
        "the tensor in parts",
    ),
    (
        "SQLITE_BUSY",
        "another connection holds the file locked: a long write in another process, or an "
        "open transaction of another TensorFile, Checkpoints or Model on this file in "
        "this process (a call given the path opens its own connection, which waits for "
        "the first); in this process, pass the open TensorFile instead of the path; "
        "otherwise retry when the other write has finished",
    ),
    (
        "SQLITE_LOCKED",
        "another connection in this process holds the file locked; pass the open "
        "TensorFile instead of the path, or retry",
    ),
    (
        "SQLITE_CANTOPEN",
        "SQLite cannot open it; check that the path is a file and its folder exists",
    ),
    ("SQLITE_IOERR", "the operating system reported an I/O error; check the disk"),
    ("SQLITE_NOMEM", "SQLite ran out of memory"),
)


def advice(error: BaseException) -> str:
    """What to do about ``error``, chosen by its SQLite error code (or its message)."""
    code = getattr(error, "sqlite_errorname", None) or ""
    for prefix, text in _ADVICE:
        if code.startswith(prefix):
            return text
    message = str(error)
    if "no such column" in message or "no such table" in message or "has no column" in message:
        return (
            "the file's tables are not NNC's layout (tensors: "
            + ", ".join(NNC_COLUMNS)
            + "); it was not written by NNC or fnnc, or was edited"
        )
    if isinstance(error, (sqlite3.ProgrammingError, sqlite3.InterfaceError)):
        return "the file was closed or is used from another thread; open it again"
    return "the file may be damaged or not an NNC/fnnc file"


ERRORS = (sqlite3.Error, UnicodeDecodeError)
"""What :func:`translating` translates. Python's ``sqlite3`` raises
``UnicodeDecodeError`` when SQLite's own message quotes damaged, non-UTF-8 bytes of
the file (a damaged schema)."""


def translate(error: BaseException, path: str, operation: str) -> TensorFileError:
    """``error`` as a :class:`TensorFileError` naming ``path``, ``operation`` and the fix."""
    if isinstance(error, UnicodeDecodeError):
        return TensorFileError(
            f"{path}: cannot {operation}: SQLite reported text that is not UTF-8 ({error}); "
            + _ADVICE[0][1]
        )
    return TensorFileError(f"{path}: cannot {operation}: {error}; {_advice_for(error, path)}")


def _advice_for(error: BaseException, path: str) -> str:
    """:func:`advice`, or, for SQLite failing to open a file (its journal, or the new
    file itself) in a folder this process may not write, that folder."""
    code = getattr(error, "sqlite_errorname", None) or ""
    folder = os.path.dirname(os.path.abspath(path))
    unwritable = os.path.isdir(folder) and not os.access(folder, os.W_OK)
    if code.startswith("SQLITE_CANTOPEN") and unwritable:
        return (
            f"its folder {folder} is not writable: every write makes SQLite's journal "
            f"({os.path.basename(path)}-journal) there, and a new file is made there; "
            "write to a file in a writable folder, or change the folder's permissions"
        )
    return advice(error)


@contextlib.contextmanager
def translating(path: str, operation: str) -> Iterator[None]:
    """Raises any SQLite error (:data:`ERRORS`) from the block as :func:`translate` does."""
    try:
        yield
    except ERRORS as e:
        raise translate(e, path, operation) from e


_F = TypeVar("_F", bound=Callable[..., Any])


def operation_method(verb: str, *, named: bool = False) -> Callable[[_F], _F]:
    """Runs a method as one operation: SQLite errors inside name the file and ``verb``
    (through the object's ``operation(what)``, e.g. :meth:`fnnc.io.TensorFile.operation`;
    ``named``: ``verb`` followed by the method's first argument, the tensor's name)."""

    def wrap(method: _F) -> _F:
        @functools.wraps(method)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            what = f"{verb} tensor {args[0]!r:.80}" if named and args else verb
            with self.operation(what):
                return method(self, *args, **kwargs)

        return run  # type: ignore[return-value]

    return wrap
