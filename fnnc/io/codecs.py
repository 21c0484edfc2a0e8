"""Encoder / decoder hooks: NNC's ``ccv_nnc_tensor_io_option_t`` encode and decode.

NNC lets a writer transform a tensor's bytes (compress, quantize) and store an integer
identifier in the high 32 bits of the row's ``type``; a reader hands the blob and that
identifier to its decoder. A decoder that declines (returns ``None``) makes the reader
use the stored bytes as they are, as NNC does when ``decode`` returns 0.

Codecs registered here are found by identifier when a row is read, so files written
with a codec read back without naming it again:

>>> import zlib
>>> import numpy as np

from fnnc.errors import TensorFileError
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


def registered_codecs() -> dict[int, Codec]:
    """A copy of the registry: identifier -> codec."""
    return dict(_registry)
