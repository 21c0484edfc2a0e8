"""What kind of file a path holds, by its first bytes: the command line's ``inspect``
opens a file by what it is, whatever its name.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
>>> with open(path, "wb") as f:
...     _ = f.write(b"SQLite format 3\\0" + bytes(84))
>>> looks_sqlite(path), looks_safetensors(path), looks_exported(path), looks_json(path)
(True, False, False, False)
"""

from __future__ import annotations

import os
import struct

SQLITE_MAGIC = b"SQLite format 3\0"


def _head(path: str | os.PathLike[str], n: int) -> tuple[bytes, int] | None:
    """The first ``n`` bytes of the file at ``path`` and its size; None if unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read(n), os.fstat(f.fileno()).st_size
    except OSError:
        return None


def looks_sqlite(path: str | os.PathLike[str]) -> bool:
    """Whether the file at ``path`` holds an SQLite database (an NNC tensor file), by its
    header; False when it is missing or unreadable."""
    found = _head(path, len(SQLITE_MAGIC))
    return found is not None and found[0] == SQLITE_MAGIC


def looks_safetensors(path: str | os.PathLike[str]) -> bool:
    """Whether the file at ``path`` starts as a safetensors file does, whatever its
    name: a little-endian uint64 header length that fits the file, then ``{``."""
    found = _head(path, 9)
    if found is None or len(found[0]) < 9 or found[0][8:9] != b"{":
        return False
    (length,) = struct.unpack_from("<Q", found[0])
    return 2 <= length <= found[1] - 8


def looks_exported(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` may be a serialized ``jax.export.Exported`` (a flatbuffer whose
    root offset points inside the file; SQLite files and empty ones are not)."""
    found = _head(path, 16)
    if found is None or len(found[0]) < 8 or found[0] == SQLITE_MAGIC:
        return False
    (root,) = struct.unpack_from("<I", found[0])
    return 8 <= root < found[1]


def looks_json(path: str | os.PathLike[str]) -> bool:
    """Whether the file at ``path`` starts (after white space) with ``{``: a JSON
    document such as a graph file (``fnnc.graph.save(graph, "g.json")``)."""
    found = _head(path, 64)
    return found is not None and found[0].lstrip()[:1] == b"{"
