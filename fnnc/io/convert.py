"""Conversion between NNC tensor files and safetensors, names kept or mapped.

:func:`convert` copies every tensor of one file into another (NNC SQLite <->
safetensors, by extension or ``source_format`` / ``target_format``) in one
transaction, decoding NNC's codec rows (optionally encoding the target's rows with a
codec), with each tensor's dtype, shape, layout tag and device. ``rename`` maps names:
a dict (names it does not hold are kept), a JSON file of one, or a function returning
the new name or ``None`` to leave the tensor out, e.g. from a Hugging Face
checkpoint's names to fnnc's parameter ids. ``python -m fnnc convert A B [--map
FILE]`` runs it.

:func:`open_tensors` opens either kind by its extension, and :class:`Renamed` shows a
file's tensors under mapped names (what :meth:`fnnc.models.Model.read` uses for
``rename=``).

>>> import os, tempfile
>>> import numpy as np
>>> from fnnc.io import TensorFile, convert
>>> folder = tempfile.mkdtemp()
>>> with TensorFile(os.path.join(folder, "a.sqlite")) as f:
...     f.write("w", np.eye(2, dtype=np.float32), "NCHW")
>>> convert(os.path.join(folder, "a.sqlite"), os.path.join(folder, "b.safetensors"),
...         rename={"w": "fc.weight"})
['fc.weight']
>>> from safetensors.numpy import load_file
>>> load_file(os.path.join(folder, "b.safetensors"))["fc.weight"].tolist()
[[1.0, 0.0], [0.0, 1.0]]
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from fnnc.errors import TensorFileError, TensorNotFoundError
from fnnc.io.format import TensorInfo
from fnnc.io.safetensors_io import SafetensorsFile, is_safetensors
from fnnc.io.sniff import looks_safetensors
from fnnc.io.tensor_file import TensorFile

Rename = Mapping[str, str] | Callable[[str], str | None] | str | os.PathLike[str]
"""A name map: ``{old: new}``, a JSON file of one, or ``old -> new | None``."""
FORMATS = ("nnc", "safetensors")


def open_tensors(
    path: str | os.PathLike[str],
    *,
    readonly: bool = False,
    format: str | None = None,  # noqa: A002 (the file format)
) -> TensorFile | SafetensorsFile:
    """``path`` as a :class:`TensorFile` or, for ``.safetensors`` (or
    ``format="safetensors"``), a :class:`SafetensorsFile`."""
    kind = format or ("safetensors" if is_safetensors(path) else "nnc")
    if kind not in FORMATS:
        raise TensorFileError(
            f"{os.fspath(path)}: format {kind!r}; expected 'nnc' or 'safetensors'"
        )
    if kind == "safetensors":
        return SafetensorsFile(path, readonly=readonly)
    try:
        return TensorFile(path, readonly=readonly)
    except TensorFileError as e:
        if format is None and looks_safetensors(path):  # say what it is and what to pass
            raise TensorFileError(
                f"{e}. It holds a safetensors file, which is read by its extension "
                "(.safetensors) or with format='safetensors' (python -m fnnc convert: "
                "--from or --to safetensors)"
            ) from None
        raise


def name_map(rename: Rename | None) -> Callable[[str], str | None]:
    """``rename`` as a function ``old -> new`` (``None``: leave the tensor out).

    Raises:
        TensorFileError: a mapping file that is missing or not a JSON object of strings.
    """
    if rename is None:
        return lambda name: name
    if isinstance(rename, (str, os.PathLike)):
        try:
            with open(rename, encoding="utf-8") as f:
                loaded = json.load(f)
        except (OSError, ValueError) as e:
            raise TensorFileError(f"name map {os.fspath(rename)}: cannot read it ({e})") from None
        if not isinstance(loaded, dict) or not all(
            isinstance(k, str) and isinstance(v, (str, type(None))) for k, v in loaded.items()
        ):
            raise TensorFileError(
                f"name map {os.fspath(rename)}: expected a JSON object of "
                '{"old name": "new name" or null}'
            )
        rename = loaded
    if isinstance(rename, Mapping):
        table = dict(rename)
        return lambda name: table.get(name, name)
    return rename


class Renamed:
    """The tensors of ``source`` under the names ``rename`` gives them, read-only.

    Raises:
        TensorFileError: two tensors map to one name, or a name maps to something that
            is neither a str nor ``None``.
    """

    def __init__(self, source: Any, rename: Rename):
        self.source, self.path = source, source.path
        mapping = name_map(rename)
        self._old: dict[str, str] = {}
        for old in source.names():
            new = mapping(old)
            if new is None:
                continue
            if not isinstance(new, str):
                raise TensorFileError(
                    f"{self.path}: the name map gives {new!r:.80} ({type(new).__name__}) for "
                    f"tensor {old!r}; expected a str (the new name) or None (leave it out)"
                )
            if new in self._old:
                raise TensorFileError(
                    f"{self.path}: tensors {self._old[new]!r} and {old!r} both map to {new!r}"
                )
            self._old[new] = old

    def names(self) -> list[str]:
        return sorted(self._old)

    def __contains__(self, name: object) -> bool:
        return name in self._old

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def _stored(self, name: str) -> str:
        if name not in self._old:
            raise TensorNotFoundError(
                f"no tensor maps to {name!r:.80} in {self.path} ({len(self._old)} mapped)"
            )
        return self._old[name]

    def info(self, name: str) -> TensorInfo:
        return self.source.info(self._stored(name))

    def read(self, name: str, **options: Any) -> np.ndarray:
        return self.source.read(self._stored(name), **options)


def convert(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    rename: Rename | None = None,
    encoder: Any = None,
    source_format: str | None = None,
    target_format: str | None = None,
) -> list[str]:
    """Copies every tensor of ``source`` into ``target`` in one transaction.

    Args:
        source: an NNC tensor file or a ``.safetensors`` file.
        target: the file to write (created; tensors of the same name are replaced).
            If the conversion fails, an existing target is left exactly as it was and
            a new one empty (see :meth:`TensorFile.transaction`).
        rename: a name map (see :data:`Rename`); tensors it maps to ``None`` stay out.
        encoder: a codec for the target's rows (NNC tensor files only), e.g. ``"q8p"``.
        source_format: ``"nnc"`` or ``"safetensors"`` where the extension does not say.
        target_format: the same for ``target``.

    Returns:
        The target's names of the tensors written, sorted.

    Raises:
        TensorFileError: a file cannot be read or written, a row cannot be decoded
            (naming it), or two tensors map to one name.
        DTypeError: a safetensors dtype that NNC tensor files cannot hold (naming it).
    """
    if os.path.abspath(source) == os.path.abspath(target):
        raise TensorFileError(f"convert: {os.fspath(source)} is both source and target")
    with open_tensors(source, readonly=True, format=source_format) as src:
        view = Renamed(src, rename) if rename is not None else src
        with open_tensors(target, format=target_format) as out, out.transaction():
            for name in view.names():
                info = view.info(name)
                value = view.read(name)
                out.write(name, value, info.format, device=info.device, encoder=encoder)
        return view.names()
