"""Graphs stored beside tensors: the JSON of :func:`fnnc.graph.to_data` in one table.

``fnnc_graphs (name TEXT, data TEXT, PRIMARY KEY (name))`` in the same SQLite file as
NNC's ``tensors``, so a model's graph and its weights travel as one file. The JSON is
exactly what :func:`fnnc.graph.save` writes to a ``.json`` file; loading verifies it.

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

import json
from typing import TYPE_CHECKING

from fnnc.errors import GraphFormatError
from fnnc.io.parameters import Source, opened

if TYPE_CHECKING:  # fnnc.graph is imported on first use: fnnc.io stays light to import
    from fnnc.graph.ir import Graph

_CREATE = "CREATE TABLE IF NOT EXISTS fnnc_graphs (name TEXT, data TEXT, PRIMARY KEY (name))"


def save_to(target: Source, graph: Graph, name: str) -> None:
    """Stores ``graph`` under ``name`` (replacing one of that name), atomically."""
    from fnnc.graph.serialize import to_data

    text = json.dumps(to_data(graph), separators=(",", ":"))
    with opened(target) as f, f.transaction():
        f.connection.execute(_CREATE)
        f.connection.execute("REPLACE INTO fnnc_graphs (name, data) VALUES (?, ?)", (name, text))


def graph_names(source: Source) -> list[str]:
    """The names of the graphs in the file, sorted (empty if it has none)."""
    with opened(source, readonly=True) as f:
        if not f.has_table("fnnc_graphs"):
            return []
        query = "SELECT name FROM fnnc_graphs ORDER BY name"
        return [r[0] for r in f.connection.execute(query)]


def load_from(source: Source, name: str) -> Graph:
    """The graph stored under ``name``; :class:`GraphFormatError` if absent or damaged."""
    from fnnc.graph.serialize import from_data

    with opened(source, readonly=True) as f:
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
        except (TypeError, json.JSONDecodeError) as e:
            raise GraphFormatError(
                f"load_from: graph {name!r} in {f.path} is not JSON ({e})"
            ) from None
        try:
            return from_data(data)
        except GraphFormatError as e:
            raise GraphFormatError(f"{e} (graph {name!r} in {f.path})") from None
