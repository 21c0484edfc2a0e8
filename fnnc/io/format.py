"""NNC's tensor row format: the codes in ``type``, ``format``, ``datatype`` and ``dim``.

One row of NNC's ``tensors`` table (``lib/nnc/ccv_nnc_tensor_io.c``)::

    name TEXT      the tensor's name (primary key)
    type INTEGER   memory (CPU 0x1, GPU 0x2) | device id << 8 | encoder id << 32
    format INTEGER NCHW 1, NHWC 2, CHWN 4
    datatype INT   8U 0x1000, 32S 0x2000, 32F 0x4000, 64S 0x8000, 64F 0x10000,
                   16F 0x20000, QX 0x40000, 16BF 0x80000 | reserved << 32 (NNC's
                   readers ignore the high 32 bits: a QX row keeps its block size there)
    dim BLOB       int32[12] little-endian; the shape ends at the first value <= 0
    data BLOB      the elements, contiguous, little-endian

NNC cannot express two shapes: a rank-0 tensor (its element count is 0 when ``dim[0]``
is 0) and a tensor with a zero-size axis. fnnc writes a scalar as ``[1]`` (what NNC
reads) and notes the rank 0 in its side table, so fnnc reads it back as ``()``
(:mod:`fnnc.io.integrity`; rows without the note, e.g. NNC's, read as ``[1]``); it
writes a zero-size tensor with an all-zero ``dim`` (NNC reads shape ``(0,)``) and notes
its shape there too, so fnnc reads ``(0, 4)`` back (``shape=`` of
:meth:`TensorFile.read` reads any other row so). Checkpoints record
shapes themselves, so they round-trip both exactly.

NNC pads ``data`` to its allocation size (16 or 64 bytes on CPU, 128 or 4096 on GPU),
so readers accept a blob up to that much longer than the elements need.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import struct
from typing import Any

import ml_dtypes
import numpy as np

from fnnc.errors import DTypeError, ShapeError, TensorFileError

MAX_DIM = 12
"""Entries in NNC's ``dim`` array (``CCV_NNC_MAX_DIM_ALLOC``)."""

DIM_BYTES = (4 * MAX_DIM, 4 * 8)
"""Accepted ``dim`` blob lengths: 12 entries, or 8 from NNC before it grew to 12."""

CPU_MEMORY, GPU_MEMORY = 0x1, 0x2
ANY_DEVICE = 0xFFF
"""Device id meaning "any device" (``CCV_COMPUTE_DEVICE_ANY >> 8``)."""

DATATYPES: dict[int, np.dtype] = {
    0x01000: np.dtype(np.uint8),
    0x02000: np.dtype(np.int32),
    0x04000: np.dtype(np.float32),
    0x08000: np.dtype(np.int64),
    0x10000: np.dtype(np.float64),
    0x20000: np.dtype(np.float16),
    0x80000: np.dtype(ml_dtypes.bfloat16),
}
QX = 0x40000
"""NNC's quantized (palettized) datatype; its rows read depalettized (:mod:`fnnc.io.qx`)."""

CODES: dict[np.dtype, int] = {dtype: code for code, dtype in DATATYPES.items()}
FORMATS: dict[str, int] = {"NCHW": 1, "NHWC": 2, "CHWN": 4}
FORMAT_NAMES: dict[int, str] = {code: name for name, code in FORMATS.items()}
FLOATS = frozenset(np.dtype(t) for t in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64))
"""Dtypes :meth:`TensorFile.read` converts between (NNC converts 16F <-> 32F)."""


@dataclasses.dataclass(frozen=True, slots=True)
class TensorInfo:
    """What one row of a tensor file holds, without its data.

    Attributes:
        name: the row's name.
        dtype: the element type; ``None`` for NNC's quantized ``QX`` rows.
        shape: the shape read from ``dim``; ``()`` for a row fnnc wrote from a rank-0
            array (``dim`` and NNC say ``[1]``; :class:`~fnnc.io.TensorFile`).
        format: ``"NHWC"``, ``"NCHW"`` or ``"CHWN"``.
        type: NNC's 32-bit tensor type: memory kind | device id << 8.
        encoder: the encoder identifier from the high 32 bits of ``type``; 0 = raw.
        nbytes: the length of the stored ``data`` blob (encoded, padded as stored).
        palettized: for NNC's QX rows, the element type they decode to (read returns
            that type, :mod:`fnnc.io.qx`); ``None`` for every other row.
    """

    name: str
    dtype: np.dtype | None
    shape: tuple[int, ...]
    format: str
    type: int
    encoder: int
    nbytes: int
    palettized: np.dtype | None = None

    @property
    def device(self) -> str:
        """``"CPU"``, ``"GPU:1"`` and so on, as :meth:`TensorFile.write` takes it."""
        memory = {CPU_MEMORY: "CPU", GPU_MEMORY: "GPU"}.get(self.type & 0x3, "?")
        device = (self.type >> 8) & ANY_DEVICE
        return memory if device == ANY_DEVICE else f"{memory}:{device}"


def pack_type(device: str, encoder: int = 0, where: str = "") -> int:
    """NNC's ``type`` column for ``device`` ("CPU", "GPU:0", ...) and an encoder id.

    ``"CPU"`` is NNC's any-device CPU tensor (0xfff01); ``"GPU"`` is ``"GPU:0"``: NNC
    has no any-device GPU tensor (``ccv_nnc_tensor_new`` asserts that a GPU tensor
    names its device, so ``ccv_nnc_tensor_read`` of such a row fails, and
    ``ccv_cnnp_model_read`` puts an any-device parameter on device 0)."""
    memory, _, index = str(device).upper().partition(":")
    kinds = {"CPU": CPU_MEMORY, "GPU": GPU_MEMORY}
    if memory not in kinds or not (index == "" or index.isdigit()) or len(index) > 3:
        raise TensorFileError(
            f'{where}: device {device!r}; expected "CPU", "CPU:<n>", "GPU" or "GPU:<n>"'
        )
    dev = int(index) if index else ANY_DEVICE if memory == "CPU" else 0
    return (encoder << 32) | (dev << 8) | kinds[memory]


def pack_format(fmt: str | int, where: str = "") -> int:
    """The ``format`` code for ``"NHWC"`` / ``"NCHW"`` / ``"CHWN"`` (or a code)."""
    if isinstance(fmt, bool):  # an int to Python, but no layout (True would be NCHW)
        code = None
    else:
        code = fmt if isinstance(fmt, int) else FORMATS.get(str(fmt).upper())
    if code not in FORMAT_NAMES:
        raise TensorFileError(f"{where}: format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return code


def pack_dim(shape: tuple[int, ...]) -> bytes:
    """The 48-byte ``dim`` blob for ``shape`` (``[1]`` for a scalar, zeros if empty)."""
    if len(shape) > MAX_DIM:
        raise ShapeError(f"shape {list(shape)}: NNC tensors have at most {MAX_DIM} dimensions")
    dims = [1] if not shape else ([] if 0 in shape else list(shape))
    if any(d >= 2**31 for d in dims):
        raise ShapeError(f"shape {list(shape)}: NNC stores dimensions as int32")
    return struct.pack(f"<{MAX_DIM}i", *dims, *([0] * (MAX_DIM - len(dims))))


def unpack_dim(blob: bytes) -> tuple[int, ...] | None:
    """The shape in a ``dim`` blob, ``None`` if the blob has the wrong length."""
    if not isinstance(blob, bytes) or len(blob) not in DIM_BYTES:
        return None
    shape = []
    for d in struct.unpack(f"<{len(blob) // 4}i", blob):
        if d <= 0:  # NNC stops here and does not clear what follows
            break
        shape.append(d)
    return tuple(shape) if shape else (0,)


def padded(nbytes: int, type_: int) -> int:
    """The largest blob NNC may write for ``nbytes`` of elements (allocation padding)."""
    align = 4096 if type_ & 0x3 == GPU_MEMORY else 64
    return (nbytes + align - 1) // align * align


def storable(array: object, where: str) -> np.ndarray:
    """``array`` as a C-contiguous little-endian NumPy array of an NNC datatype."""
    arr = np.asarray(array)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    if arr.dtype not in CODES:
        names = ", ".join(sorted(d.name for d in CODES))
        raise DTypeError(
            f"{where}: NNC has no datatype for {arr.dtype}; supported: {names}. "
            "Convert first, e.g. .astype(np.uint8) for bool or .astype(np.int32) for int16"
        )
    return np.ascontiguousarray(arr)


def is_quantized(datatype: int) -> bool:
    """Whether a datatype column is NNC's palettized ``QX``: ``reserved << 32 | QX |
    bits << 8 | palette datatype >> 12`` (``ccv_nnc_tensor_write`` of a palettized
    tensor), so the QX bits are read under a mask."""
    return (datatype & 0xFF000) == QX


_SQL_TYPES = {type(None): "NULL", bytes: "a BLOB", int: "an INTEGER", float: "a REAL"}


def label(name: Any) -> str:
    """How a listing shows a row's name: the name itself, or ``<NULL>`` / the ``repr`` of
    a name that is not TEXT."""
    return name if isinstance(name, str) else "<NULL>" if name is None else repr(name)


def untitled(name: Any, path: str) -> str | None:
    """Why the row named ``name`` cannot be read (its name is not TEXT: a foreign writer
    or damage left NULL, a BLOB, a number), or ``None`` for a TEXT name."""
    if isinstance(name, str):
        return None
    kind = _SQL_TYPES.get(type(name), type(name).__name__)
    return (
        f"a row in {path} has {kind} name ({label(name):.80}), not TEXT: NNC and fnnc read "
        "rows by their TEXT name, so no reader can ask for it; give it a name or delete it "
        "with sqlite3 (e.g. DELETE FROM tensors WHERE typeof(name) != 'text')"
    )


def row_info(
    name: Any, type_: Any, format_: Any, datatype: Any, dim: Any, nbytes: Any, *, path: str
) -> TensorInfo:
    """The :class:`TensorInfo` of a row's columns, checked (``nbytes``: the blob length).

    Raises:
        TensorFileError: a column is not what NNC writes, naming the row and ``path``.
    """
    where = f"tensor {name!r:.80} in {path}"
    if not all(isinstance(v, int) for v in (type_, format_, datatype)):
        raise TensorFileError(f"{where}: type, format and datatype must be integers")
    shape = unpack_dim(dim)
    if shape is None:
        got = f"{len(dim)} bytes" if isinstance(dim, bytes) else type(dim).__name__
        raise TensorFileError(
            f"{where}: dim blob is {got}, expected {DIM_BYTES[0]} bytes (int32[12])"
        )
    if format_ not in FORMAT_NAMES:
        raise TensorFileError(
            f"{where}: unknown format {format_:#x} (NNC knows NCHW 1, NHWC 2, CHWN 4)"
        )
    # NNC's reader takes the low 32 bits (``datatype_mix & 0xffffffff``); the high ones
    # hold the tensor's ``reserved`` field (a QX row's block size), whatever the type
    code = datatype & 0xFFFFFFFF
    if code not in DATATYPES and not is_quantized(code):
        known = ", ".join(f"{d}={c:#x}" for c, d in DATATYPES.items())
        raise TensorFileError(f"{where}: unknown datatype {code:#x} (known: {known})")
    return TensorInfo(
        name=name,
        dtype=DATATYPES.get(code),
        shape=shape,
        format=FORMAT_NAMES[format_],
        type=type_ & 0xFFFFFFFF,
        encoder=(type_ >> 32) & 0xFFFFFFFF,
        nbytes=nbytes if isinstance(nbytes, int) else 0,
        palettized=DATATYPES.get((code & 0xFF) << 12) if is_quantized(code) else None,
    )


def check_length(where: str, info: TensorInfo, n: int) -> None:
    """The blob of ``n`` bytes holds the row's elements (up to NNC's allocation padding
    more). Counted in Python ints: ``65536**4`` elements do not wrap around to 0."""
    assert info.dtype is not None
    need = math.prod(info.shape) * info.dtype.itemsize
    if not need <= n <= padded(need, info.type):
        what = "truncated" if n < need else "oversized"
        raise TensorFileError(
            f"{where}: {what} data: {n} bytes for {info.dtype}{list(info.shape)} "
            f"({need} bytes); the file is damaged or was not written by NNC/fnnc"
        )


def requested_shape(shape: Any, where: str) -> tuple[int, ...]:
    """A ``shape=`` argument as a tuple of non-negative ints (else :class:`ShapeError`)."""
    try:
        dims = tuple(operator.index(d) for d in shape)
    except TypeError:
        dims = (-1,)
    if any(d < 0 for d in dims):
        raise ShapeError(f"{where}: shape={shape!r:.60} must be a tuple of non-negative ints")
    return dims


def requested_dtype(dtype: Any, where: str) -> np.dtype:
    """A ``dtype=`` argument as a NumPy dtype (else :class:`DTypeError`)."""
    try:
        return np.dtype(dtype)
    except TypeError as e:
        raise DTypeError(f"{where}: dtype={dtype!r:.60} is not a NumPy dtype ({e})") from None
