"""Reading a :class:`~fnnc.io.TensorFile` row back (a mixin): the row's bytes checked
against its format and checksum and decoded (``load_row``), and the array read from
them as NNC's ``ccv_nnc_tensor_read`` reads into a given tensor: a smaller shape takes
the first elements, floating types convert, float16 as NNC truncates (``read``)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from fnnc.errors import DTypeError, ShapeError, TensorFileError
from fnnc.io import format as fmt
from fnnc.io import integrity, qx
from fnnc.io.codecs import Decoder, decode_with
from fnnc.io.format import TensorInfo
from fnnc.io.palettize import float_to_half
from fnnc.io.sqlite_errors import operation_method as _operation

_ROW = "SELECT rowid, name, type, format, datatype, dim, length(data), data FROM tensors "


class RowReading:
    """:class:`~fnnc.io.TensorFile`'s ``read`` and ``load_row`` (see module doc)."""

    path: str
    _handle: Any
    _tensors: Any  # TensorFile's
    _missing: Any
    has_table: Any
    operation: Any

    @_operation("read", named=True)
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
                (NNC copies ``min(sizes)``); ``shape=()`` reads a one-element row
                as a scalar. Without it: the shape written, a rank-0 array as ``()``
                (NNC sees ``[1]``; see :class:`~fnnc.io.TensorFile`). A larger shape
                raises :class:`ShapeError` (NNC would leave the rest of its tensor as
                it was; a new array has no "as it was").
            dtype: read as this dtype. Floating types convert into each other (NNC
                converts 16F <-> 32F); other changes raise :class:`DTypeError`.
            decoder: for rows written with an encoder: a :class:`Codec` or a function
                ``(identifier, data, dtype, shape) -> bytes``; defaults to the codec
                registered under the row's identifier.

        Raises:
            TensorNotFoundError: no such name.
            TensorFileError: the row is malformed (data blob too short or too long, wrong
                ``dim`` length, unknown datatype or format), its bytes do not match the
                checksum fnnc wrote with it, or it needs a missing decoder.
        """
        where = f"tensor {name!r} in {self.path}"
        want_shape = None if shape is None else fmt.requested_shape(shape, where)
        want = None if dtype is None else fmt.requested_dtype(dtype, where)
        info, data, _ = self.load_row(name, decoder=decoder)
        assert info.dtype is not None
        count = math.prod(info.shape)
        arr = np.frombuffer(data, info.dtype, count).reshape(info.shape)
        if want_shape is not None and want_shape != info.shape:
            wanted = math.prod(want_shape)
            if wanted > count:
                raise ShapeError(
                    f"{where} is {info.dtype}{list(info.shape)} ({count} elements); cannot "
                    f"read it as shape {list(want_shape)} ({wanted} elements): a shape may hold "
                    "the stored elements or fewer (the first ones are read, as NNC does)"
                )
            arr = arr.reshape(-1)[:wanted].reshape(want_shape)
        want = info.dtype if want is None else want
        if want != info.dtype and not {want, info.dtype} <= fmt.FLOATS:
            raise DTypeError(
                f"{where} is {info.dtype}; reading it as {want} is not a conversion NNC "
                "makes (only between floating types); read it and use .astype"
            )
        if want == np.float16 and info.dtype != np.float16:
            # NNC's ccv_float_to_half_precision truncates (0.0001 -> 0x068D, not 0x068E)
            # and saturates to 65504 below 65536, where a rounding cast gives inf
            return float_to_half(arr.astype(np.float32))
        return arr.astype(want)  # always a copy: writable, owns its memory

    @_operation("read", named=True)
    def load_row(
        self, name: str, *, decode: bool = True, decoder: Decoder | None = None
    ) -> tuple[TensorInfo, bytes, str]:
        """One row as stored, checked: ``(info, bytes, checksum status)``.

        The bytes are the decoded elements (``decode=False``: as stored, for rows
        written with an encoder or NNC's palettized QX rows, whose ``info.dtype`` is
        then ``None``; decoded, a QX row is depalettized, :mod:`fnnc.io.qx`); the
        status is ``"checked"``, ``"unchecked"`` (no checksum) or ``"stale"``
        (rewritten by a writer that keeps none, e.g. NNC).
        Allocates no more than the row holds.
        """
        row = self._tensors().execute(_ROW + "WHERE name=?", (name,)).fetchone()
        if row is None:
            raise self._missing(name)
        rowid, fields, data = row[0], row[2:6], row[7]
        info = fmt.row_info(*row[1:7], path=self.path)
        where = f"tensor {name!r} in {self.path}"
        if data is None and not info.encoder and math.prod(info.shape) == 0:
            # NNC's empty tensor has a NULL data pointer, which ccv_nnc_tensor_write
            # binds as a NULL blob (sqlite3_bind_blob of NULL); NNC reads it as no bytes
            data = b""
        if not isinstance(data, bytes):
            raise TensorFileError(f"{where}: data is {type(data).__name__}, expected a BLOB")
        palettized = info.dtype is None  # NNC's QX row: decoded as NNC depalettizes
        if not info.encoder and not palettized:
            fmt.check_length(where, info, len(data))
        status, recorded = integrity.UNCHECKED, {}
        if self.has_table(integrity.TABLE):  # the checksum and the recorded shape
            reader = self._handle.reader()
            status, recorded = integrity.check(reader, where, name, rowid, fields, data)
        if palettized and decode:
            info, data = qx.decode(info, row[4], data, where)
        if info.encoder and decode:
            data = decode_with(decoder, info.encoder, data, info.dtype, info.shape, where)
            fmt.check_length(where, info, len(data))
        return self._as_written(info, rowid, recorded), data, status

    def _as_written(
        self, info: TensorInfo, rowid: int, recorded: dict[Any, Any] | None = None
    ) -> TensorInfo:
        """``info`` with the shape fnnc wrote the row from where NNC's ``dim`` cannot
        hold it (a rank-0 array, stored as ``[1]``), as fnnc's side table records it
        for this very row (``recorded``: :func:`fnnc.io.integrity.recorded_shapes` of
        the whole file, for listings; else looked up)."""
        if recorded is None:
            if not self.has_table(integrity.TABLE):
                return info
            recorded = integrity.recorded_shapes(self._handle.reader(), info.name)
        shape = integrity.written_shape(recorded.get(info.name), rowid, info.shape)
        return info if shape is None else dataclasses.replace(info, shape=shape)
