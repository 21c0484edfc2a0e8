"""safetensors files (the Hugging Face exchange format) with :class:`TensorFile`'s interface.

:class:`SafetensorsFile` reads and writes a ``.safetensors`` file through the
``safetensors`` library with the methods of :class:`fnnc.io.TensorFile` that parameter
reading and writing use (``names``, ``info``, ``read``, ``write``, ``transaction``), so
:func:`fnnc.io.read_parameters`, :func:`fnnc.io.write_parameters`,
:meth:`fnnc.models.Model.write` / ``read`` and :func:`fnnc.io.convert` take either
format. Bytes are kept exactly (bfloat16 and the float8 kinds included: what the
library's NumPy reader lacks is read from the file's bytes through ``ml_dtypes``); NNC's
facts that safetensors has no field for (each tensor's layout tag and device) are kept
in the header's metadata under ``"fnnc"`` as JSON, and files without it (written by
anything else) read as NHWC on the CPU.

A safetensors file is written whole: writes inside one :meth:`transaction` are
collected and the file is replaced once, atomically, at its end (a write outside one
rewrites the file).

>>> import os, tempfile
>>> import numpy as np
>>> from fnnc.io import SafetensorsFile
>>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
>>> with SafetensorsFile(path) as f, f.transaction():
...     f.write("conv", np.ones((2, 3, 3, 4), np.float32), "NCHW")
...     f.write("step", np.int64(3))
>>> from safetensors.numpy import load_file
>>> sorted(load_file(path)), SafetensorsFile(path).info("conv").format
(['conv', 'step'], 'NCHW')
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy
from safetensors import safe_open

from fnnc.core.files import atomic_write, locked
from fnnc.core.params import require_flag
from fnnc.errors import DTypeError, ShapeError, TensorFileError, TensorNotFoundError
from fnnc.io import format as fmt
from fnnc.io.format import TensorInfo

ML_DTYPES = {
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "F8_E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
}
"""safetensors dtype codes read through ml_dtypes (what the library writes for each)."""

_NUMPY_DTYPES = {
    code: np.dtype(name)
    for code, name in [
        ("F64", "float64"), ("F32", "float32"), ("F16", "float16"), ("I64", "int64"),
        ("U64", "uint64"), ("I32", "int32"), ("U32", "uint32"), ("I16", "int16"),
        ("U16", "uint16"), ("I8", "int8"), ("U8", "uint8"), ("BOOL", "bool"),
        ("C64", "complex64"),
    ]
}  # fmt: skip

METADATA_KEY = "fnnc"
"""Header metadata key holding ``{"tensors": {name: {"format", "device"}}}`` as JSON."""


class SafetensorsFile:
    """A ``.safetensors`` file read and written as a :class:`fnnc.io.TensorFile` is.

    Args:
        path: the file; created by the first write (reading a missing file raises).
        readonly: refuse writes.
        metadata: extra ``str -> str`` header metadata to write (kept from the file
            when it exists).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        readonly: bool = False,
        metadata: dict[str, str] | None = None,
    ):
        self.path = os.fspath(path)
        self.readonly = require_flag(readonly, "SafetensorsFile(readonly=...)", TensorFileError)
        self._pending: dict[str, tuple[np.ndarray, str, str]] | None = None
        self._depth = 0
        self._header: dict[str, str] = {}
        self._layout: dict[str, dict[str, str]] = {}
        self._keys: list[str] = []
        self._extra = dict(metadata or {})
        if os.path.exists(self.path):
            self._load_header()
        elif readonly:
            raise TensorFileError(f"{self.path}: no such safetensors file")
        self._header.update(metadata or {})

    # -- reading -------------------------------------------------------------------------
    def _open(self) -> Any:
        try:
            return safe_open(self.path, framework="numpy")
        except (safetensors.SafetensorError, OSError, ValueError) as e:
            raise TensorFileError(
                f"{self.path}: not a readable safetensors file ({type(e).__name__}: {e})"
            ) from None

    def _load_header(self) -> None:
        with self._open() as f:
            self._keys = sorted(f.keys())
            header = dict(f.metadata() or {})
        self._header = {k: v for k, v in header.items() if k != METADATA_KEY}
        try:
            layout = json.loads(header.get(METADATA_KEY, "{}")).get("tensors", {})
        except (ValueError, AttributeError):
            layout = {}  # another writer's "fnnc" key: the facts are not ours to read
        self._layout = layout if isinstance(layout, dict) else {}

    @property
    def metadata(self) -> dict[str, str]:
        """The header's metadata other than fnnc's own key."""
        return dict(self._header)

    def names(self) -> list[str]:
        """Every tensor name, sorted."""
        return sorted(set(self._keys) | set(self._pending or {}))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._keys or name in (self._pending or {}))

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def _raw(self, name: str) -> np.ndarray:
        if self._pending and name in self._pending:
            return self._pending[name][0]
        if name not in self._keys:
            if not self._pending and not os.path.exists(self.path):  # as TensorFile says it
                raise TensorFileError(
                    f"{self.path}: no such file; check the path (reading never creates it)"
                )
            shown = ", ".join(repr(n) for n in self._keys[:8])
            more = ", ..." if len(self._keys) > 8 else ""
            raise TensorNotFoundError(
                f"no tensor {name!r:.80} in {self.path} ({len(self._keys)} tensors: "
                f"{shown or 'none'}{more})"
            )
        with self._open() as f:
            try:
                return np.asarray(f.get_tensor(name))
            except Exception as e:  # the library's errors for dtypes NumPy cannot hold
                code = f.get_slice(name).get_dtype()
                if code in ML_DTYPES:
                    return self._stored(name, ML_DTYPES[code])
                raise TensorFileError(
                    f"tensor {name!r} in {self.path}: the safetensors library cannot read its "
                    f"{code} data into NumPy ({type(e).__name__}: {e})"
                ) from None

    def _stored(self, name: str, dtype: np.dtype) -> np.ndarray:
        """A tensor read from its bytes in the file, for dtypes that the library's NumPy
        reader lacks (bfloat16 before its ml_dtypes support, the float8 kinds)."""
        try:
            with open(self.path, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                entry = json.loads(f.read(length))[name]
                start, end = entry["data_offsets"]
                f.seek(8 + length + start)
                data = f.read(end - start)
            return np.frombuffer(data, dtype).reshape(entry["shape"]).copy()
        except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
            raise TensorFileError(
                f"tensor {name!r} in {self.path}: cannot read its {dtype.name} bytes "
                f"({type(e).__name__}: {e})"
            ) from None

    def _facts(self, name: str) -> tuple[str, str]:
        if self._pending and name in self._pending:
            return self._pending[name][1:]
        facts = self._layout.get(name)
        facts = facts if isinstance(facts, dict) else {}
        layout = facts.get("format", "NHWC")
        device = facts.get("device", "CPU")
        return (layout if layout in fmt.FORMATS else "NHWC"), str(device)

    def info(self, name: str) -> TensorInfo:
        """The tensor's dtype, shape, layout tag and device (as :meth:`TensorFile.info`),
        from the file's header (its data is not read)."""
        dtype, shape = self._declared(name)
        layout, device = self._facts(name)
        try:
            type_ = fmt.pack_type(device)
        except TensorFileError:  # metadata another writer put there: NNC's any CPU
            type_ = fmt.pack_type("CPU")
        return TensorInfo(name, dtype, shape, layout, type_, 0, math.prod(shape) * dtype.itemsize)

    def _declared(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        """The tensor's dtype and shape as the header declares them (read from the
        tensor itself where it is pending or of a dtype code NumPy has no name for)."""
        if name in self._keys and not (self._pending and name in self._pending):
            with self._open() as f:
                view = f.get_slice(name)
                code, shape = view.get_dtype(), tuple(int(n) for n in view.get_shape())
            dtype = ML_DTYPES.get(code) or _NUMPY_DTYPES.get(code)
            if dtype is not None:
                return dtype, shape
        arr = self._raw(name)
        return arr.dtype, arr.shape

    def infos(self) -> list[TensorInfo]:
        """:meth:`info` of every tensor, sorted by name."""
        return [self.info(n) for n in self.names()]

    def read(
        self, name: str, *, shape: tuple[int, ...] | None = None, dtype: Any = None
    ) -> np.ndarray:
        """The tensor ``name`` as a new NumPy array; ``shape`` and ``dtype`` as in
        :meth:`fnnc.io.TensorFile.read` (fewer elements read the first ones; floating
        types convert into each other)."""
        where = f"tensor {name!r} in {self.path}"
        arr = self._raw(name)
        if shape is not None:
            want_shape = fmt.requested_shape(shape, where)
            wanted = math.prod(want_shape)
            if wanted > arr.size:
                raise ShapeError(
                    f"{where} is {arr.dtype}{list(arr.shape)}; cannot read it as shape "
                    f"{list(want_shape)} ({wanted} elements, {arr.size} stored)"
                )
            arr = arr.reshape(-1)[:wanted].reshape(want_shape)
        if dtype is not None:
            want = fmt.requested_dtype(dtype, where)
            if want != arr.dtype and not {want, arr.dtype} <= fmt.FLOATS:
                raise DTypeError(
                    f"{where} is {arr.dtype}; reading it as {want} converts only between "
                    "floating types; read it and use .astype"
                )
            return arr.astype(want)
        return np.array(arr)

    # -- writing -------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[SafetensorsFile]:
        """Collects the writes inside the block and writes the file once at its end
        (nothing is written if the block raises)."""
        if self.readonly:
            raise TensorFileError(f"cannot change {self.path}: it is open with readonly=True")
        outer = self._pending is None
        if outer:
            self._pending = {}
        self._depth += 1
        try:
            yield self
            if outer:
                self._flush()
        finally:
            self._depth -= 1
            if outer:
                self._pending = None

    def write(
        self,
        name: str,
        array: Any,
        format: str | int = "NHWC",  # noqa: A002 (NNC's word)
        *,
        device: str = "CPU",
        encoder: Any = None,
    ) -> None:
        """Stores ``array`` under ``name`` (any dtype the ``safetensors`` library takes).

        Raises:
            TensorFileError: an ``encoder`` was given (safetensors stores raw bytes only),
                or the file cannot be written (a missing folder, a full disk); the file
                is then unchanged.
        """
        where = f"tensor {name!r} in {self.path}"
        if encoder is not None:
            raise TensorFileError(
                f"{where}: safetensors has no codecs; write NNC's codecs to an NNC tensor "
                "file (.sqlite) or drop encoder="
            )
        layout = fmt.FORMAT_NAMES[fmt.pack_format(format, where)]
        fmt.pack_type(device, 0, where)  # the same device strings as TensorFile
        arr = np.asarray(array)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        with self.transaction():
            assert self._pending is not None
            # ascontiguousarray makes a rank-0 array [1]; keep the shape (a scalar stays [])
            self._pending[name] = (
                np.ascontiguousarray(arr).reshape(arr.shape),
                layout,
                str(device).upper(),
            )

    def _unwritable(self, folder: str, error: OSError) -> TensorFileError:
        """The error for a write the file system refused (the file is unchanged)."""
        if not os.path.isdir(folder):
            why = f"the folder {folder} does not exist; create it first"
        else:
            why = f"{error.strerror or error}; check that {folder} is writable and has room"
        return TensorFileError(f"{self.path}: cannot write: {why} (nothing was written)")

    def _flush(self) -> None:
        """Writes the pending tensors into the file as it is now: under the file's lock,
        the tensors another writer (another object, thread or process) stored since this
        object read the header are read again and kept; this object's own tensors win
        over theirs. Merging with the names read at open had dropped theirs."""
        assert self._pending is not None
        folder = os.path.dirname(os.path.abspath(self.path))
        with locked(self.path):
            if os.path.exists(self.path):
                self._load_header()
                self._header.update(self._extra)
            else:
                self._keys, self._layout = [], {}
            tensors = {n: self._raw(n) for n in self._keys if n not in self._pending}
            tensors.update({n: v[0] for n, v in self._pending.items()})
            layout = {
                n: dict(zip(("format", "device"), self._facts(n), strict=True)) for n in tensors
            }
            header = {**self._header, METADATA_KEY: json.dumps({"version": 1, "tensors": layout})}

            def write(temporary: str) -> None:
                safetensors.numpy.save_file(tensors, temporary, metadata=header)

            try:  # readers see the old file or the new one
                atomic_write(self.path, write, suffix=".safetensors")
            except (safetensors.SafetensorError, ValueError, TypeError) as e:
                raise TensorFileError(f"{self.path}: cannot write ({e})") from None
            except OSError as e:
                raise self._unwritable(folder, e) from None
        self._pending = {}
        self._load_header()

    def close(self) -> None:
        """Nothing stays open between calls; kept for :class:`TensorFile`'s interface."""

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SafetensorsFile({self.path!r}{', readonly=True' if self.readonly else ''})"


def is_safetensors(path: Any) -> bool:
    """Whether ``path`` names a safetensors file (by its ``.safetensors`` extension)."""
    return isinstance(path, (str, os.PathLike)) and os.fspath(path).endswith(".safetensors")
