"""Encoder / decoder hooks: NNC's ``ccv_nnc_tensor_io_option_t`` encode and decode.

NNC lets a writer transform a tensor's bytes (compress, quantize) and store an integer
identifier in the high 32 bits of the row's ``type``; a reader hands the blob and that
identifier to its decoder. A decoder that declines (returns ``None``) makes the reader
use the stored bytes as they are, as NNC does when ``decode`` returns 0.

Codecs registered here are found by identifier when a row is read, so files written
with a codec read back without naming it again:

>>> import zlib
>>> import numpy as np
>>> from fnnc.io import Codec, register_codec, unregister_codec
>>> codec = Codec(
...     0x5A1,
...     encode=lambda data, dtype, shape: zlib.compress(data),
...     decode=lambda data, dtype, shape: zlib.decompress(data),
...     name="zlib",
... )
>>> _ = register_codec(codec)
>>> codec.decode(codec.encode(b"abc", np.dtype(np.uint8), (3,)), np.dtype(np.uint8), (3,))
b'abc'
>>> unregister_codec(0x5A1)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from fnnc.core.params import require_flag
from fnnc.errors import TensorFileError

Transform = Callable[[bytes, np.dtype, tuple[int, ...]], bytes | None]
"""``(data, dtype, shape) -> bytes``, or ``None`` to decline (raw bytes are used)."""


@dataclasses.dataclass(frozen=True)
class Codec:
    """A pair of byte transforms under one identifier (1 to 2**32 - 1; 0 means raw).

    Attributes:
        identifier: stored in the high 32 bits of the row's ``type``.
        encode: ``(data, dtype, shape) -> bytes | None`` when writing.
        decode: ``(data, dtype, shape) -> bytes | None`` when reading; ``dtype`` and
            ``shape`` are the row's, and the result must hold those elements.
        name: for messages.
    """

    identifier: int
    encode: Transform
    decode: Transform
    name: str = ""

    def __post_init__(self) -> None:
        if not 0 < self.identifier < 2**32:
            raise TensorFileError(
                f"codec {self.name or '?'}: identifier {self.identifier} is not in "
                "1..2**32-1 (NNC stores it in 32 bits; 0 means no encoder)"
            )


_registry: dict[int, Codec] = {}


def register_codec(codec: Codec, *, replace: bool = False) -> Codec:
    """Makes ``codec`` the decoder for rows written with its identifier.

    Raises:
        TensorFileError: another codec holds the identifier and ``replace`` is false.
    """
    replace = require_flag(replace, "register_codec(replace=...)", TensorFileError)
    held = _registry.get(codec.identifier)
    if held is not None and held != codec and not replace:
        raise TensorFileError(
            f"codec identifier {codec.identifier:#x} is taken by {held.name or held!r}; "
            "pass replace=True or choose another identifier"
        )
    _registry[codec.identifier] = codec
    return codec


def unregister_codec(identifier: int) -> None:
    """Forgets the codec registered under ``identifier`` (no error if none is)."""
    _registry.pop(identifier, None)


def get_codec(identifier: int) -> Codec | None:
    """The codec registered under ``identifier``, or ``None``."""
    return _registry.get(identifier)


def codec_named(name: str, where: str = "") -> Codec:
    """The registered codec called ``name`` (``"q8p"``, ``"ezm7"``, ...).

    Raises:
        TensorFileError: no registered codec has that name.
    """
    for codec in _registry.values():
        if codec.name == name:
            return codec
    known = ", ".join(sorted(c.name for c in _registry.values() if c.name)) or "none"
    raise TensorFileError(
        f"{where + ': ' if where else ''}no codec named {name!r} is registered "
        f"(registered: {known}); register a Codec with that name or pass one"
    )


def registered_codecs() -> dict[int, Codec]:
    """A copy of the registry: identifier -> codec."""
    return dict(_registry)


Encoder = Codec | int | str | Callable[[bytes, np.dtype, tuple[int, ...]], tuple[int, bytes] | None]
"""What :meth:`fnnc.io.TensorFile.write` takes as ``encoder=``."""
Decoder = Codec | Callable[[int, bytes, np.dtype, tuple[int, ...]], bytes | None]
"""What :meth:`fnnc.io.TensorFile.read` takes as ``decoder=``."""


def encode_with(
    encoder: Encoder, data: bytes, dtype: np.dtype, shape: tuple[int, ...], where: str
) -> tuple[int, bytes]:
    """``(identifier, bytes)`` to store for ``data``; ``(0, data)`` when it declines."""
    if isinstance(encoder, str):
        encoder = codec_named(encoder, where)
    if isinstance(encoder, int):
        codec = get_codec(encoder)
        if codec is None:
            raise TensorFileError(f"{where}: no codec registered as {encoder:#x}")
        encoder = codec
    if isinstance(encoder, Codec):
        out = encoder.encode(data, dtype, shape)
        result = None if out is None else (encoder.identifier, out)
    else:
        result = encoder(data, dtype, shape)
    if result is None:
        return 0, data
    identifier, out = result
    if not 0 <= identifier < 2**32 or not isinstance(out, (bytes, bytearray)):
        raise TensorFileError(
            f"{where}: the encoder must return (identifier in 0..2**32-1, bytes), "
            f"got ({identifier!r}, {type(out).__name__})"
        )
    return identifier, bytes(out)


def decode_with(
    decoder: Decoder | None,
    identifier: int,
    data: bytes,
    dtype: np.dtype,
    shape: tuple[int, ...],
    where: str,
) -> bytes:
    """The raw bytes of a row stored with encoder ``identifier``.

    A decoder that raises is reported as damaged data (:class:`TensorFileError` naming
    the row, the original error attached); one that declines keeps the stored bytes,
    as NNC does.
    """
    codec = decoder if decoder is not None else get_codec(identifier)
    if codec is None:
        raise TensorFileError(
            f"{where} was written with encoder {identifier:#x}; register a Codec with "
            "that identifier or pass decoder="
        )
    name = codec.name if isinstance(codec, Codec) and codec.name else f"{identifier:#x}"
    try:
        if isinstance(codec, Codec):
            out = codec.decode(data, dtype, shape)
        else:
            out = codec(identifier, data, dtype, shape)
        return data if out is None else bytes(out)
    except Exception as e:  # a decoder fails on damaged bytes in its own way
        raise TensorFileError(
            f"{where}: decoder {name} failed ({type(e).__name__}: {e}); the stored bytes "
            "are damaged or were written by another encoder"
        ) from e
