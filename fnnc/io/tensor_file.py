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
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from fnnc.errors import DTypeError, ShapeError, TensorFileError, TensorNotFoundError
from fnnc.io import format as fmt
from fnnc.io.codecs import Codec, get_codec
from fnnc.io.format import TensorInfo

Encoder = Codec | int | Callable[[bytes, np.dtype, tuple[int, ...]], tuple[int, bytes] | None]
Decoder = Codec | Callable[[int, bytes, np.dtype, tuple[int, ...]], bytes | None]

_CREATE = (
    "CREATE TABLE IF NOT EXISTS tensors "
    "(name TEXT, type INTEGER, format INTEGER, datatype INTEGER, "
    "dim BLOB, data BLOB, PRIMARY KEY (name))"
)
_PAGE_SIZE = 65536


class TensorFile:
    """An NNC tensor file: named arrays in SQLite, readable by NNC and by fnnc.

    Args:
        path: the file; created (with NNC's ``tensors`` table) unless ``readonly``.
        readonly: open without writing anything; the file must exist and hold a
            ``tensors`` table.

    >>> import os, tempfile
    >>> import numpy as np
    >>> from fnnc.io import TensorFile
    >>> path = os.path.join(tempfile.mkdtemp(), "weights.sqlite")
    >>> with TensorFile(path) as f:
    ...     f.write("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    ...     with f.transaction():  # all or nothing
    ...         f.write("b", np.zeros(3, np.float16))
    ...         f.write("step", np.int32(7))  # NNC has no scalars: stored as [1]
    ...     print(f.names(), f.info("w").shape, f.read("b", dtype=np.float32).dtype)
    ...     print(f.read("step"), f.read("step", shape=()))
    ['b', 'step', 'w'] (2, 3) float32
    [7] 7
    """

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False):
        self.path = os.fspath(path)
        self.readonly = readonly
        self._depth = 0
        if readonly and not os.path.isfile(self.path):
            raise TensorFileError(f"{self.path}: no such file")
        try:
            self._conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        except sqlite3.Error as e:
            raise TensorFileError(f"{self.path}: cannot open as SQLite ({e})") from None
        try:
            if readonly:
                # query_only, not mode=ro: SQLite may still roll back a hot journal left
                # by a killed writer, which a read-only connection could not do.
                self._conn.execute("PRAGMA query_only=1")
                if not self.has_table("tensors"):
                    raise TensorFileError(
                        f"{self.path}: no tensors table (not an NNC tensor file; "
                        "NNC creates it on its first ccv_nnc_tensor_write)"
                    )
            else:
                if self._conn.execute("PRAGMA page_count").fetchone()[0] == 0:
                    self._conn.execute(f"PRAGMA page_size={_PAGE_SIZE}")
                self._conn.execute("PRAGMA synchronous=FULL")
                self._conn.execute(_CREATE)
        except sqlite3.DatabaseError as e:
            self._conn.close()
            raise TensorFileError(f"{self.path}: not an SQLite database ({e})") from None
        except BaseException:
            self._conn.close()
            raise

    # -- plumbing ------------------------------------------------------------
    @property
    def connection(self) -> sqlite3.Connection:
        """The SQLite connection, for fnnc.io's own tables (use :meth:`transaction`)."""
        return self._conn

    def has_table(self, table: str) -> bool:
        """Whether the file has a table called ``table``."""
        query = "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?"
        return self._conn.execute(query, (table,)).fetchone() is not None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[TensorFile]:
        """Makes the writes inside the block one atomic batch: all of them or none.

        An exception inside the block rolls the batch back and propagates. Nested
        blocks are savepoints: an inner failure undoes only the inner writes.
        """
        depth = self._depth
        begin, commit, rollback = "BEGIN IMMEDIATE", ["COMMIT"], ["ROLLBACK"]
        if depth:
            sp = f"fnnc_{depth}"
            begin, commit = f"SAVEPOINT {sp}", [f"RELEASE {sp}"]
            rollback = [f"ROLLBACK TO {sp}", f"RELEASE {sp}"]
        self._conn.execute(begin)
        self._depth = depth + 1
        try:
            yield self
            for statement in commit:
                self._conn.execute(statement)
        except BaseException:
            if self._conn.in_transaction:
                for statement in rollback:
                    self._conn.execute(statement)
            raise
        finally:
            self._depth = depth

    def close(self) -> None:
        """Closes the file (an open transaction is rolled back)."""
        self._conn.close()

    def __enter__(self) -> TensorFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TensorFile({self.path!r}{', readonly=True' if self.readonly else ''})"

    # -- listing ---------------------------------------------------------------
    def names(self) -> list[str]:
        """Every tensor name in the file, sorted."""
        return [r[0] for r in self._conn.execute("SELECT name FROM tensors ORDER BY name")]

    def __contains__(self, name: object) -> bool:
        query = "SELECT 1 FROM tensors WHERE name=?"
        return isinstance(name, str) and self._conn.execute(query, (name,)).fetchone() is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return self._conn.execute("SELECT count(*) FROM tensors").fetchone()[0]

    def info(self, name: str) -> TensorInfo:
        """The row's metadata without reading its data.

        Raises:
            TensorNotFoundError: no such name.
            TensorFileError: the row is not in NNC's format.
        """
        query = "SELECT name, type, format, datatype, dim, length(data) FROM tensors WHERE name=?"
        row = self._conn.execute(query, (name,)).fetchone()
        if row is None:
            raise self._missing(name)
        return self._info(*row)

    def infos(self) -> list[TensorInfo]:
        """:meth:`info` of every row, sorted by name."""
        query = "SELECT name, type, format, datatype, dim, length(data) FROM tensors ORDER BY name"
        return [self._info(*row) for row in self._conn.execute(query)]

    # -- writing ---------------------------------------------------------------
    def write(
        self,
        name: str,
        array: Any,
        format: str | int = "NHWC",  # noqa: A002 (NNC's word)
        *,
        device: str = "CPU",
        encoder: Encoder | None = None,
    ) -> None:
        """Stores ``array`` under ``name`` as NNC does (replacing a row of that name).

        Args:
            name: the row's name.
            array: anything ``np.asarray`` takes (NumPy, JAX): float32, float16,
                bfloat16, float64, int32, int64 or uint8; up to 12 dimensions.
            format: the layout tag NNC keeps with the tensor.
            device: recorded in ``type``: ``"CPU"`` (NNC's any-CPU, 0xfff01),
                ``"GPU:0"``, ...
            encoder: a :class:`Codec`, a registered codec's identifier, or a
                function ``(data, dtype, shape) -> (identifier, bytes)``; ``None`` or a
                declining encoder (returning ``None``) stores raw bytes.
        """
        self._writable(name)
        if not isinstance(name, str):
            raise TypeError(f"tensor names are str, got {type(name).__name__}")
        where = f"tensor {name!r} in {self.path}"
        arr = fmt.storable(array, where)
        data: bytes | memoryview = memoryview(arr.reshape(-1).view(np.uint8))
        identifier = 0
        if encoder is not None:
            identifier, data = self._encode(encoder, bytes(data), arr.dtype, arr.shape, name)
        type_ = fmt.pack_type(device, identifier, where)
        row = (name, type_ - 2**64 if type_ >= 2**63 else type_, fmt.pack_format(format, where))
        row += (fmt.CODES[arr.dtype], fmt.pack_dim(arr.shape), data)
        query = "REPLACE INTO tensors (name, type, format, datatype, dim, data) VALUES "
        self._conn.execute(query + "(?, ?, ?, ?, ?, ?)", row)

    def delete(self, name: str) -> None:
        """Removes the row ``name``; :class:`TensorNotFoundError` if there is none."""
        self._writable(name)
        if self._conn.execute("DELETE FROM tensors WHERE name=?", (name,)).rowcount == 0:
            raise self._missing(name)

    # -- reading ---------------------------------------------------------------
    def read(
        self,
        name: str,
        *,
        shape: tuple[int, ...] | None = None,
        dtype: Any = None,
        decoder: Decoder | None = None,
    ) -> np.ndarray:
        """The array stored under ``name`` (a new, writable NumPy array).

        Args:
            name: the row's name.
            shape: read into this shape, as NNC reads into a given tensor
                (``ccv_nnc_tensor_read`` with a preallocated one): the stored values in
                order, or, for a shape with fewer elements, the first that many
                (NNC copies ``min(sizes)``); ``shape=()`` gets a scalar back from its
                ``[1]`` row. A larger shape raises :class:`ShapeError` (NNC would leave
                the rest of its tensor as it was; a new array has no "as it was").
            dtype: read as this dtype. Floating types convert into each other (NNC
                converts 16F <-> 32F); other changes raise :class:`DTypeError`.
            decoder: for rows written with an encoder: a :class:`Codec` or a function
                ``(identifier, data, dtype, shape) -> bytes``; defaults to the codec
                registered under the row's identifier.

        Raises:
            TensorNotFoundError: no such name.
            TensorFileError: the row is malformed (data blob too short or too long, wrong
                ``dim`` length, unknown datatype or format), or needs a missing decoder.
        """
        query = "SELECT name, type, format, datatype, dim, length(data), data FROM tensors "
        row = self._conn.execute(query + "WHERE name=?", (name,)).fetchone()
        if row is None:
            raise self._missing(name)
        info, data = self._info(*row[:6]), row[6]
        where = f"tensor {name!r} in {self.path}"
        if info.dtype is None:
            raise TensorFileError(
                f"{where} is NNC's quantized QX datatype; fnnc cannot read it "
                "(dequantize it with the tool that wrote it)"
            )
        if not isinstance(data, bytes):
            raise TensorFileError(f"{where}: data is {type(data).__name__}, expected a BLOB")
        if info.encoder:
            data = self._decode(decoder, info, data)
        count = int(np.prod(info.shape, dtype=np.int64))
        need = count * info.dtype.itemsize
        if not need <= len(data) <= fmt.padded(need, info.type):
            what = "truncated" if len(data) < need else "oversized"
            raise TensorFileError(
                f"{where}: {what} data: {len(data)} bytes for {info.dtype}{list(info.shape)} "
                f"({need} bytes); the file is damaged or was not written by NNC/fnnc"
            )
        arr = np.frombuffer(data, info.dtype, count).reshape(info.shape)
        if shape is not None and tuple(shape) != info.shape:
            wanted = int(np.prod(shape, dtype=np.int64))
            if wanted > count:
                raise ShapeError(
                    f"{where} is {info.dtype}{list(info.shape)} ({count} elements); cannot "
                    f"read it as shape {list(shape)} ({wanted} elements): a shape may hold "
                    "the stored elements or fewer (the first ones are read, as NNC does)"
                )
            arr = arr.reshape(-1)[:wanted].reshape(shape)
        want = info.dtype if dtype is None else np.dtype(dtype)
        if want != info.dtype and not {want, info.dtype} <= fmt.FLOATS:
            raise DTypeError(
                f"{where} is {info.dtype}; reading it as {want} is not a conversion NNC "
                "makes (only between floating types); read it and use .astype"
            )
        return arr.astype(want)  # always a copy: writable, owns its memory

    # -- internals -------------------------------------------------------------
    def _writable(self, name: str) -> None:
        if self.readonly:
            raise TensorFileError(
                f"cannot change tensor {name!r}: {self.path} is open with readonly=True"
            )

    def _missing(self, name: str) -> TensorNotFoundError:
        names = self.names()
        shown = ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
        return TensorNotFoundError(
            f"no tensor {name!r} in {self.path} ({len(names)} tensors: {shown or 'none'})"
        )

    def _info(
        self, name: str, type_: Any, format_: Any, datatype: Any, dim: Any, n: Any
    ) -> TensorInfo:
        where = f"tensor {name!r} in {self.path}"
        if not all(isinstance(v, int) for v in (type_, format_, datatype)):
            raise TensorFileError(f"{where}: type, format and datatype must be integers")
        shape = fmt.unpack_dim(dim)
        if shape is None:
            got = f"{len(dim)} bytes" if isinstance(dim, bytes) else type(dim).__name__
            raise TensorFileError(
                f"{where}: dim blob is {got}, expected {fmt.DIM_BYTES[0]} bytes (int32[12])"
            )
        if format_ not in fmt.FORMAT_NAMES:
            raise TensorFileError(
                f"{where}: unknown format {format_:#x} (NNC knows NCHW 1, NHWC 2, CHWN 4)"
            )
        if datatype not in fmt.DATATYPES and datatype != fmt.QX:
            known = ", ".join(f"{d}={c:#x}" for c, d in fmt.DATATYPES.items())
            raise TensorFileError(f"{where}: unknown datatype {datatype:#x} (known: {known})")
        return TensorInfo(
            name=name,
            dtype=fmt.DATATYPES.get(datatype),
            shape=shape,
            format=fmt.FORMAT_NAMES[format_],
            type=type_ & 0xFFFFFFFF,
            encoder=(type_ >> 32) & 0xFFFFFFFF,
            nbytes=n or 0,
        )

    def _encode(
        self, encoder: Encoder, data: bytes, dtype: np.dtype, shape: Any, name: str
    ) -> tuple[int, bytes]:
        if isinstance(encoder, int):
            codec = get_codec(encoder)
            if codec is None:
                raise TensorFileError(f"tensor {name!r}: no codec registered as {encoder:#x}")
            encoder = codec
        if isinstance(encoder, Codec):
            out = encoder.encode(data, dtype, tuple(shape))
            result = None if out is None else (encoder.identifier, out)
        else:
            result = encoder(data, dtype, tuple(shape))
        if result is None:
            return 0, data
        identifier, out = result
        if not 0 <= identifier < 2**32 or not isinstance(out, (bytes, bytearray)):
            raise TensorFileError(
                f"tensor {name!r}: the encoder must return (identifier in 0..2**32-1, bytes), "
                f"got ({identifier!r}, {type(out).__name__})"
            )
        return identifier, bytes(out)

    def _decode(self, decoder: Decoder | None, info: TensorInfo, data: bytes) -> bytes:
        assert info.dtype is not None
        codec = decoder if decoder is not None else get_codec(info.encoder)
        if codec is None:
            raise TensorFileError(
                f"tensor {info.name!r} in {self.path} was written with encoder "
                f"{info.encoder:#x}; register a Codec with that identifier or pass decoder="
            )
        if isinstance(codec, Codec):
            out = codec.decode(data, info.dtype, info.shape)
        else:
            out = codec(info.encoder, data, info.dtype, info.shape)
        return data if out is None else bytes(out)  # NNC keeps the raw bytes on a refusal
