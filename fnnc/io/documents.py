"""JSON documents stored beside tensors: graphs (and any registered format) in a tensor file.

``fnnc_graphs (name TEXT, data TEXT, PRIMARY KEY (name))`` in the same SQLite file as
NNC's ``tensors``, so a model's graph and its weights travel as one file. A document is
a JSON object whose ``"format"`` names its kind; a layer above :mod:`fnnc.io` registers
how to turn its objects into such data and back (:func:`register_format`), so this
module stores bytes and never imports that layer. :mod:`fnnc.graph` registers its
``Graph`` (the JSON of :func:`fnnc.graph.to_data`, the same as a ``.json`` graph file).

>>> import os, tempfile
>>> from fnnc import ops
>>> from fnnc.graph import GraphBuilder
>>> from fnnc.io import graph_names, load_from, save_to
>>> b = GraphBuilder()
>>> x = b.input((3,), name="x")
>>> g = b.build([b.exec(ops.relu(), x)])
>>> path = os.path.join(tempfile.mkdtemp(), "model.sqlite")
>>> save_to(path, g, "forward")
>>> graph_names(path), load_from(path, "forward") == g
(['forward'], True)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from fnnc.errors import FnncError, GraphFormatError, TensorFileError, located
from fnnc.io.parameters import Source, opened
from fnnc.io.tensor_file import TensorFile

_CREATE = "CREATE TABLE IF NOT EXISTS fnnc_graphs (name TEXT, data TEXT, PRIMARY KEY (name))"


@dataclasses.dataclass(frozen=True)
class Format:
    """How objects of one type become JSON documents and back.

    Attributes:
        name: the document's ``"format"`` field, e.g. ``"fnnc.graph"``.
        type: the Python type of the objects.
        to_data: ``obj -> dict`` (JSON-able, with ``"format": name``).
        from_data: ``dict -> obj``; raises :class:`GraphFormatError` on bad data.
    """

    name: str
    type: type
    to_data: Callable[[Any], dict[str, Any]]
    from_data: Callable[[Any], Any]


_FORMATS: dict[str, Format] = {}


def register_format(fmt: Format) -> None:
    """Lets :func:`save_to` / :func:`load_from` store objects of ``fmt.type``."""
    _FORMATS[fmt.name] = fmt


def _format_of(obj: Any) -> Format:
    for fmt in _FORMATS.values():
        if isinstance(obj, fmt.type):
            return fmt
    known = [f.type.__name__ for f in _FORMATS.values()] or ["none (import fnnc.graph)"]
    raise GraphFormatError(
        f"save_to: a {type(obj).__name__} cannot be stored as a document; "
        f"storable types: {', '.join(known)}"
    )


@contextlib.contextmanager
def _opened(source: Source, what: str, *, readonly: bool = False) -> Iterator[TensorFile]:
    """``source`` opened as an NNC SQLite tensor file, the only kind that holds graphs."""
    with opened(source, readonly=readonly) as f:
        if not isinstance(f, TensorFile):
            raise TensorFileError(
                f"{what}: {getattr(f, 'path', f)} is opened as a {type(f).__name__}; graphs "
                "are stored only in NNC SQLite tensor files (.sqlite or any other "
                "extension but .safetensors): give such a file, or save the graph alone "
                "as JSON (fnnc.graph.save(graph, 'g.json'))"
            )
        yield f


def save_to(target: Source, obj: Any, name: str) -> None:
    """Stores ``obj`` (e.g. a graph) under ``name`` (replacing one of that name), atomically.

    Raises:
        TensorFileError: ``target`` is not an NNC SQLite tensor file (e.g. ``.safetensors``).
    """
    text = json.dumps(_format_of(obj).to_data(obj), separators=(",", ":"))
    what = f"save graph {name!r}"
    with _opened(target, what) as f, f.operation(what), f.transaction():
        f.connection.execute(_CREATE)
        f.connection.execute("REPLACE INTO fnnc_graphs (name, data) VALUES (?, ?)", (name, text))


def graph_names(source: Source) -> list[str]:
    """The names of the documents (graphs) in the file, sorted (empty if it has none)."""
    with _opened(source, "list graphs", readonly=True) as f, f.operation("list graphs"):
        if not f.has_table("fnnc_graphs"):
            return []
        query = "SELECT name FROM fnnc_graphs ORDER BY name"
        return [r[0] for r in f.connection.execute(query)]


def load_from(source: Source, name: str) -> Any:
    """The object stored under ``name``; :class:`GraphFormatError` if absent or damaged."""
    what = f"load graph {name!r}"
    with _opened(source, what, readonly=True) as f, f.operation(what):
        row = None
        if f.has_table("fnnc_graphs"):
            query = "SELECT data FROM fnnc_graphs WHERE name=?"
            row = f.connection.execute(query, (name,)).fetchone()
        if row is None:
            raise GraphFormatError(
                f"load_from: no graph {name!r} in {f.path} (graphs: {graph_names(f) or 'none'})"
            )
        try:
            data = json.loads(row[0])
        except (TypeError, ValueError, RecursionError) as e:
            raise GraphFormatError(
                f"load_from: graph {name!r} in {f.path} is not JSON ({e})"
            ) from None
        kind = data.get("format") if isinstance(data, dict) else None
        fmt = _FORMATS.get(kind) if isinstance(kind, str) else None
        if fmt is None:
            raise GraphFormatError(
                f"load_from: not an fnnc graph or other registered document (format "
                f"{kind!r}; known: {sorted(_FORMATS) or 'none'}; import fnnc.graph to read "
                f"graphs) (graph {name!r} in {f.path})"
            )
        try:
            return fmt.from_data(data)
        except FnncError as e:  # unknown commands and verify's errors too, each of its kind
            raise located(e, f"graph {name!r} in {f.path}") from None
        except RecursionError:
            raise GraphFormatError(
                f"load_from: graph {name!r} in {f.path} is nested too deeply to be a graph"
            ) from None


def describe_document(path: str | os.PathLike[str]) -> list[str]:
    """What ``python -m fnnc inspect`` prints of a JSON document file (a graph saved with
    ``fnnc.graph.save(graph, "g.json")``): its format, version and, decoded by its
    registered format, its listing (a graph's nodes).

    Raises:
        TensorFileError: the file cannot be read.
        GraphFormatError: it is not JSON, has no ``"format"``, is of a format no module
            registered, or does not decode (what is damaged, as ``load`` says).
    """
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except OSError as e:
        raise TensorFileError(f"{path}: cannot read ({e.strerror or e}); check the path") from None
    except (ValueError, RecursionError) as e:
        raise GraphFormatError(f"{path}: starts as JSON but is not ({e})") from None
    kind = data.get("format") if isinstance(data, dict) else None
    if not isinstance(kind, str):
        raise GraphFormatError(
            f'{path}: a JSON file without a "format" field; fnnc reads JSON graph files '
            '({"format": "fnnc.graph", ...}, written by fnnc.graph.save)'
        )
    head = f"{path}: JSON document, format {kind!r}, version {data.get('version')!r}"
    fmt = _FORMATS.get(kind)
    if fmt is None:
        known = sorted(_FORMATS) or ["none (import fnnc.graph)"]
        raise GraphFormatError(f"{head}: not a format this fnnc reads (known: {', '.join(known)})")
    try:
        obj = fmt.from_data(data)
    except FnncError as e:
        raise located(e, str(path)) from None
    except RecursionError:
        raise GraphFormatError(f"{head}: nested too deeply to be a document") from None
    return [head, *str(obj).splitlines()]
