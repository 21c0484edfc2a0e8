"""NNC's tensor codecs, registered by default: files NNC's Swift front end (s4nnc) wrote
with ``codec: [.q8p, .ezm7]`` and the like read without setup, and fnnc writes them.

=========  ============  ==========================================================
name       identifier    what the row's blob holds (``nnc/Store.swift``)
=========  ============  ==========================================================
``q4p``    ``0x8a1e4b``  uint32 block size, then :func:`fnnc.io.palettize.palettize`
``q5p``    ``0x8a1e5b``  with 5 bits (blocks of 1024 when s4nnc writes)
``q6p``    ``0x8a1e6b``  6 bits (blocks of 4096)
``q7p``    ``0x8a1e7b``  7 bits (blocks of 8192)
``q8p``    ``0x8a1e8b``  8 bits (blocks of 16384); ``q4p`` uses blocks of 512
``ezm7``   ``0x511``     float16 only: int32 size, raw-deflated exponents, then one
                         byte per value: sign and the mantissa rounded to 7 bits
``zip``    ``0x217``     the raw bytes, raw-deflated
``fpzip``  ``0xf7217``   LLNL fpzip (needs the ``fpzip`` package from PyPI)
=========  ============  ==========================================================

Palettized codecs take float16, bfloat16, float32 and float64 rows, ``ezm7`` float16
rows; like NNC's encoders, each declines (the row is stored raw) for other dtypes and
when its output would be larger than the raw bytes plus 4. Palettization and ``ezm7``
are lossy: what reads back is what NNC would read back.

The palettized codecs also decline a row holding a NaN or an infinity. NNC's
``ccv_nnc_palettize`` clusters such blocks as they are (its k-means sums the sorted
values, so after one NaN about half the block reads back as NaN, and an infinity
makes one entry infinite); the format has no per-block escape, so fnnc stores the
whole row raw, which NNC reads as any raw row. :func:`fnnc.io.palettize.palettize`
itself stays bit for bit NNC's, non-finite values included.

>>> import os, tempfile
>>> import numpy as np
>>> from fnnc.io import TensorFile
>>> path = os.path.join(tempfile.mkdtemp(), "w.sqlite")
>>> x = np.linspace(-1, 1, 1024, dtype=np.float16)
>>> with TensorFile(path) as f:
...     f.write("w", x, encoder="ezm7")
...     print(hex(f.info("w").encoder), float(np.abs(f.read("w") - x).max()) < 4e-3)
0x511 True
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

import numpy as np

from fnnc.errors import TensorFileError
from fnnc.io import palettize as pal
from fnnc.io.codecs import Codec, register_codec

PALETTIZED = {4: 0x8A1E4B, 5: 0x8A1E5B, 6: 0x8A1E6B, 7: 0x8A1E7B, 8: 0x8A1E8B}
"""Bits -> the identifier s4nnc stores for ``q<bits>p``."""
BLOCK_SIZES = {4: 512, 5: 1024, 6: 4096, 7: 8192, 8: 16384}
"""Bits -> the block size s4nnc palettizes with."""
EZM7, ZIP, FPZIP = 0x511, 0x217, 0xF7217


def _count(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def _palettize_codec(bits: int) -> Codec:
    def encode(data: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> bytes | None:
        if dtype not in pal.FLOATS or not data:
            return None
        values = np.frombuffer(data, dtype)
        block = BLOCK_SIZES[bits]
        if pal.encoded_size(dtype, values.size, bits, block) + 4 > len(data) + 4:
            return None  # NNC's encoders have len(data) + 4 bytes of room
        if not np.isfinite(values).all():
            return None  # NNC's k-means spreads one NaN over about half its block
        return struct.pack("<I", block) + pal.palettize(values, bits, block)

    def decode(data: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
        if len(data) < 4:
            raise ValueError(f"{len(data)} bytes: too short for the block size header")
        (block,) = struct.unpack_from("<I", data)
        return pal.depalettize(data[4:], dtype, _count(shape), bits, block).tobytes()

    return Codec(PALETTIZED[bits], encode=encode, decode=decode, name=f"q{bits}p")


def _deflate(data: bytes) -> bytes:
    """Raw deflate as s4nnc's zlib path makes it (default level, memLevel 9, no header)."""
    packer = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -zlib.MAX_WBITS, 9)
    return packer.compress(data) + packer.flush()


def _inflate(data: bytes, size: int) -> bytes:
    """Exactly ``size`` bytes inflated from raw-deflate ``data`` (else ``ValueError``)."""
    unpacker = zlib.decompressobj(-zlib.MAX_WBITS)
    out = unpacker.decompress(data, size + 1)  # bounded: a damaged blob cannot balloon
    if len(out) != size:
        raise ValueError(
            f"inflated to {len(out)}{'+' if len(out) > size else ''} bytes, not {size}"
        )
    return out


def _truncated_mantissa(mantissa: np.ndarray) -> np.ndarray:
    """s4nnc's ``truncatedBits(m, 3)``: round half to even, and round down where rounding
    up would carry out of 7 bits."""
    shifted = mantissa >> 3
    discard = mantissa & 7
    up = (discard > 4) | ((discard == 4) & ((shifted & 1) == 1))
    rounded = shifted + up
    return np.where(rounded & 0x80, shifted, rounded)


def _ezm7_encode(data: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> bytes | None:
    if dtype != np.float16 or not data:
        return None
    bits = np.frombuffer(data, np.uint16)
    exponents = ((bits >> 10) & 0x1F).astype(np.uint8)
    sign = (bits >> 15).astype(np.uint8)
    rest = (sign << 7) | _truncated_mantissa(bits & 0x3FF).astype(np.uint8)
    zipped = _deflate(exponents.tobytes())
    if len(zipped) > len(data) or 4 + len(zipped) + bits.size > len(data) + 4:
        return None
    return struct.pack("<i", len(zipped)) + zipped + rest.tobytes()


def _ezm7_decode(data: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> bytes | None:
    if dtype != np.float16:
        return None  # NNC's decoder declines: the stored bytes are used as they are
    count = _count(shape)
    if len(data) < 4:
        raise ValueError(f"{len(data)} bytes: too short for the exponent size header")
    (size,) = struct.unpack_from("<i", data)
    if size < 0 or len(data) < 4 + size + count:
        raise ValueError(
            f"{len(data)} bytes cannot hold {size} bytes of exponents and {count} values"
        )
    exponents = np.frombuffer(_inflate(data[4 : 4 + size], count), np.uint8).astype(np.uint16)
    rest = np.frombuffer(data, np.uint8, count, 4 + size).astype(np.uint16)
    return (((rest >> 7) << 15) | (exponents << 10) | ((rest & 0x7F) << 3)).tobytes()


def _zip_encode(data: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> bytes | None:
    zipped = _deflate(data)
    return zipped if data and len(zipped) <= len(data) + 4 else None


def _zip_decode(data: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    return _inflate(data, _count(shape) * dtype.itemsize)


def _fpzip() -> object:
    try:
        import fpzip
    except ImportError:
        raise TensorFileError(
            "the fpzip codec (0xf7217) needs LLNL fpzip's Python binding, which fnnc does not "
            "install: pip install fpzip (or fnnc[codecs])"
        ) from None
    return fpzip


def _fpzip_dims(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """s4nnc's ``(nf, nz, ny, nx)``: the last three axes, the rest folded into ``nf``."""
    dims = [int(d) for d in shape] or [1]
    nx = dims[-1]
    ny = dims[-2] if len(dims) >= 2 else 1
    nz = dims[-3] if len(dims) >= 3 else 1
    nf = int(np.prod(dims[:-3], dtype=np.int64)) if len(dims) > 3 else 1
    return nf, nz, ny, nx


def _fpzip_encode(data: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> bytes | None:
    if dtype not in (np.float16, np.float32, np.float64) or not data:
        return None
    fpzip = _fpzip()
    values = np.frombuffer(data, dtype).reshape(_fpzip_dims(shape))
    precision = {2: 19, 4: 32, 8: 64}[dtype.itemsize]  # 19 keeps float16's exponents
    wide = pal.half_to_float(values) if dtype == np.float16 else values.copy()  # writable
    out = fpzip.compress(wide, precision=precision, order="C")  # type: ignore[attr-defined]
    return out if len(out) <= len(data) else None


def _fpzip_decode(data: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> bytes | None:
    if dtype not in (np.float16, np.float32, np.float64):
        return None
    fpzip = _fpzip()
    values = np.asarray(fpzip.decompress(data, order="C")).reshape(-1)  # type: ignore[attr-defined]
    want = np.float64 if dtype == np.float64 else np.float32
    if values.dtype != want:
        raise ValueError(f"fpzip stream holds {values.dtype}, the row is {dtype}")
    count = _count(shape)
    if values.size < count:
        raise ValueError(f"fpzip stream holds {values.size} values, the row {count}")
    values = values[:count]
    return (pal.float_to_half(values) if dtype == np.float16 else values).tobytes()


def _codec(identifier: int, name: str, encode: Callable, decode: Callable) -> Codec:
    return Codec(identifier, encode=encode, decode=decode, name=name)


CODECS: dict[str, Codec] = {
    **{f"q{bits}p": _palettize_codec(bits) for bits in PALETTIZED},
    "ezm7": _codec(EZM7, "ezm7", _ezm7_encode, _ezm7_decode),
    "zip": _codec(ZIP, "zip", _zip_encode, _zip_decode),
    "fpzip": _codec(FPZIP, "fpzip", _fpzip_encode, _fpzip_decode),
}
"""NNC's codecs by name (``TensorFile.write(..., encoder="q8p")`` takes the name)."""


def register_nnc_codecs() -> None:
    """Registers :data:`CODECS` (done when :mod:`fnnc.io` is imported); a codec the user
    registered under one of NNC's identifiers stays."""
    from fnnc.io.codecs import get_codec

    for codec in CODECS.values():
        if get_codec(codec.identifier) is None:
            register_codec(codec)
