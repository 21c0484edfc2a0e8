"""Columns read from files: rows of an NNC tensor file, slices of one big tensor, CSV.

Tensor files are NNC's SQLite files (:class:`fnnc.io.TensorFile`), always opened
read-only. Two layouts of a data set are common:

- one named tensor per sample (``x-0``, ``x-1``, ...): :class:`TensorRowsColumn` reads
  one row of the ``tensors`` table per access;
- one tensor holding every sample along its first axis (``images`` of shape
  ``[60000, 28, 28]``): :class:`TensorSliceColumn` reads the bytes of one sample (or a
  run of consecutive samples) out of the stored blob with SQLite's incremental blob I/O,
  so the tensor never has to fit in memory.

Each reading thread and worker process opens its own connection (SQLite connections
are not shared between threads); a column pickles as its path and names only.

CSV follows NNC's ``ccv_cnnp_dataframe_from_csv_new``: the file is parsed eagerly into
strings, RFC 4180 quoting with a doubled quote as the only escape, a chosen delimiter
and quote character, an optional header naming the columns, ``None`` for a missing
field.
"""

from __future__ import annotations

import csv
import os
import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from fnnc.data.errors import DataError, flag
from fnnc.data.sources import Column, SequenceColumn
from fnnc.io import TensorFile


class _Files(threading.local):
    """One read-only :class:`TensorFile` per thread, opened on first use."""

    def __init__(self, path: str):
        self.path, self.file, self.rowids = path, None, {}

    def get(self) -> TensorFile:
        if self.file is None:  # closed by SQLite when the thread's copy is collected
            self.file = TensorFile(self.path, readonly=True)
        return self.file

    def rowid(self, name: str) -> int:
        """The SQLite rowid of tensor ``name`` (for blob reads), looked up once."""
        if name not in self.rowids:
            query = "SELECT rowid FROM tensors WHERE name=?"
            got = self.get().connection.execute(query, (name,)).fetchone()
            if got is None:
                raise DataError(f"tensor {name!r} was removed from {self.path}")
            self.rowids[name] = got[0]
        return self.rowids[name]


class _FileColumn(Column):
    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        self._files = _Files(self.path)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_files"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._files = _Files(self.path)


class TensorRowsColumn(_FileColumn):
    """Row ``i`` is the tensor named ``names[i]`` in an NNC tensor file."""

    def __init__(self, path: str | os.PathLike[str], names: Sequence[str]):
        super().__init__(path)
        self.names = list(names)

    def __len__(self) -> int:
        return len(self.names)

    def read(self, row: int) -> np.ndarray:
        return self._files.get().read(self.names[row])

    def describe(self) -> str:
        return f"tensor file {self.path} ({len(self.names)} tensors)"


def tensor_names(path: str, spec: str | Sequence[str] | None) -> list[str]:
    """The tensor names ``spec`` stands for in the file at ``path``.

    ``None``: every tensor, sorted by name. A list: those names (each must exist). A
    string with ``{}``: the names it matches with a decimal number in place of ``{}``,
    ordered by that number (``"x-{}"`` -> ``x-0, x-1, ..., x-10``). Any other string:
    that one tensor.
    """
    with TensorFile(path, readonly=True) as f:
        every = f.names()
    if spec is None:
        return every
    if isinstance(spec, str) and "{}" in spec:
        head, _, tail = spec.partition("{}")
        pattern = re.compile(re.escape(head) + r"(\d+)" + re.escape(tail))
        found = sorted(
            (int(m.group(1)), n) for n in every if (m := pattern.fullmatch(n)) is not None
        )
        if not found:
            shown = ", ".join(repr(n) for n in every[:8]) + (", ..." if len(every) > 8 else "")
            raise DataError(
                f"no tensor in {path} matches {spec!r} ({len(every)} tensors: {shown or 'none'})"
            )
        return [n for _, n in found]
    names = [spec] if isinstance(spec, str) else list(spec)
    have = set(every)
    missing = [n for n in names if n not in have]
    if missing:
        raise DataError(
            f"{len(missing)} of {len(names)} tensors are not in {path}, e.g. {missing[0]!r}"
        )
    return names


class TensorSliceColumn(_FileColumn):
    """Row ``i`` is ``tensor[i]`` of one tensor in an NNC tensor file, read straight
    from the stored bytes (the tensor is never loaded whole).

    The tensor must be stored raw (no encoder), as :meth:`TensorFile.write` stores it
    unless given one.
    """

    def __init__(self, path: str | os.PathLike[str], name: str):
        super().__init__(path)
        self.name = name
        with TensorFile(self.path, readonly=True) as f:
            if name not in f:
                raise DataError(f"no tensor {name!r} in {self.path} (tensors: {f.names()[:8]})")
            info = f.info(name)
        where = f"tensor {name!r} in {self.path}"
        if info.dtype is None or info.encoder:
            why = "NNC's quantized QX" if info.dtype is None else f"encoded ({info.encoder:#x})"
            raise DataError(
                f"{where} is {why}; rows can only be sliced from raw data. Read it "
                "whole with TensorFile.read and use DataFrame.from_arrays"
            )
        if not info.shape:
            raise DataError(f"{where} is a scalar; it has no rows")
        self.dtype, self.row_shape, self.rows = info.dtype, info.shape[1:], info.shape[0]
        self.row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * info.dtype.itemsize
        if info.nbytes < self.rows * self.row_bytes:
            raise DataError(
                f"{where}: {info.nbytes} bytes stored for {info.dtype}{list(info.shape)}; "
                "the file is damaged"
            )

    def __len__(self) -> int:
        return self.rows

    def _blob(self) -> Any:
        conn = self._files.get().connection
        return conn.blobopen("tensors", "data", self._files.rowid(self.name), readonly=True)

    def read(self, row: int) -> np.ndarray:
        if not -self.rows <= row < self.rows:
            raise IndexError(f"row {row} of {self.rows}")
        with self._blob() as blob:
            blob.seek((row % self.rows) * self.row_bytes)
            return np.frombuffer(blob.read(self.row_bytes), self.dtype).reshape(self.row_shape)

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows``, read through one blob handle, in file order (a run of
        consecutive rows is one read), into a new writable array (as an array column's
        batch is: whatever the rows' order, a batch map may write into it)."""
        rows = np.asarray(rows, np.int64) % max(self.rows, 1)
        out = np.empty((rows.size, *self.row_shape), self.dtype)
        size = self.row_bytes
        flat = out.reshape(rows.size, -1).view(np.uint8)
        with self._blob() as blob:
            if rows.size and np.array_equal(rows, np.arange(rows[0], rows[0] + rows.size)):
                blob.seek(int(rows[0]) * size)
                flat[...] = np.frombuffer(blob.read(rows.size * size), np.uint8).reshape(flat.shape)
                return out
            for k in np.argsort(rows, kind="stable").tolist():
                blob.seek(int(rows[k]) * size)
                flat[k] = np.frombuffer(blob.read(size), np.uint8)
        return out

    def describe(self) -> str:
        return f"slices of {self.name!r}{[self.rows, *self.row_shape]} in {self.path}"


def read_csv(
    path: str | os.PathLike[str],
    *,
    delimiter: str,
    quote: str,
    header: bool,
    encoding: str = "utf-8",
) -> dict[str, Column]:
    """The columns of a CSV file, each a :class:`SequenceColumn` of strings (``None``
    where a line has fewer fields; a blank line is one empty field, ``""`` in the first
    column), named by the header or ``"0"``, ``"1"``, ... Fields may be of any length.
    There are as many columns as the first line (the header, if any) has fields: NNC's
    reader counts them there and leaves out fields past them on later lines."""
    for name, char in (("delimiter", delimiter), ("quote", quote)):
        if char is not None and (not isinstance(char, str) or len(char) != 1 or char in "\r\n"):
            raise DataError(
                f"from_csv: {name} must be one character (not a line break), got {char!r}"
            )
    header = flag(header, "from_csv", "header")
    if delimiter == quote:
        raise DataError(f"from_csv: delimiter and quote are both {quote!r}; give two characters")
    limit = csv.field_size_limit(2**31 - 1)  # Python's default refuses fields over 128 KiB
    try:
        with open(path, newline="", encoding=encoding) as f:
            lines = list(csv.reader(f, delimiter=delimiter, quotechar=quote, doublequote=True))
    except UnicodeDecodeError as e:
        raise DataError(
            f"from_csv: {os.fspath(path)} is not {encoding} text (it holds the byte "
            f"{e.object[e.start : e.start + 1]!r}); give the file's encoding, e.g. "
            "from_csv(path, encoding='latin-1')"
        ) from e
    except LookupError as e:
        raise DataError(f"from_csv: unknown encoding {encoding!r} ({e})") from None
    finally:
        csv.field_size_limit(limit)
    lines = [line or [""] for line in lines]  # a blank line: one empty field, as NNC reads it
    width = len(lines[0]) if lines else 0
    names: list[str] = lines.pop(0) if header and lines else []
    if width == 0:
        raise DataError(f"{os.fspath(path)}: no columns (an empty CSV file)")
    names = [n if n else str(i) for i, n in enumerate(names)]
    names += [str(i) for i in range(len(names), width)]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise DataError(f"{os.fspath(path)}: the header names column {dup!r} twice")
    return {
        name: SequenceColumn([line[i] if i < len(line) else None for line in lines])
        for i, name in enumerate(names)
    }
