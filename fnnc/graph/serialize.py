"""save / load: graphs as plain JSON data (never pickle).

A file holds ``{"format": "fnnc.graph", "version": 1, ...}`` with symbols, nodes
(command name + hyper-parameters), inputs, outputs and the output tree. Values that
JSON lacks are tagged: ``{"$tuple": [...]}``, ``{"$dtype": "float32"}``,
``{"$literal": base64, ...}`` (constants), ``{"$command": ...}``, ``{"$graph": ...}``
(sub-graphs), ``{"$float": "inf"}``. Loading rebuilds the graph and verifies it.

Generic ``primitive`` nodes (JAX primitives carried by ``trace``) are saved through
``jax.export``: the node becomes an ``exported`` node whose module is stored as
``{"$stablehlo": base64, "sha256": ...}`` (StableHLO bytes, versioned by JAX, with its
first-order VJP, lowered for CPU, CUDA, ROCm and TPU where the primitive lowers on each,
so a file saved on one machine runs on another), so any traced graph saves, loads and
runs with the same outputs. A
gradient node of a primitive is saved as ``gradient[of=exported]``, its module keeping
one more VJP order per gradient level, so every graph ``backward`` makes saves too. A
module loaded from a file holds only the orders its file had: ``backward`` of a graph
that needs more raises :class:`~fnnc.errors.CommandError` saying so. The checksum is
verified before the bytes are parsed; a file never names Python code.

This module holds the value and graph codecs and the files; two helper modules hold
what they call: :mod:`fnnc.graph._serialize_exported` (the ``jax.export`` modules of
primitive nodes: which command a node is saved as, the module's bytes and their
checksum) and :mod:`fnnc.graph._serialize_checks` (what a loaded file's data is
checked against: shapes, dtypes, symbol ids, and the shape rule to blame).
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import json
import math
import os
import warnings
from typing import Any

import jax
import jax.export
import numpy as np

from fnnc.core.command import Command, OpDef, freeze, lookup
from fnnc.core.files import atomic_write
from fnnc.core.ir import AliasSymbol, Graph, Node, TensorSymbol, require_graph
from fnnc.core.params import expected_kind, param_fits
from fnnc.errors import CheckpointError, FnncError, GraphFormatError, located
from fnnc.graph._serialize_checks import _check_ids, _dims, _dtype, _rule_failure
from fnnc.graph._serialize_exported import _file_command, _module, _stablehlo
from fnnc.graph.verify import verify
from fnnc.io import documents, tree
from fnnc.io.exported import artifact_hint
from fnnc.io.sniff import looks_safetensors, looks_sqlite
from fnnc.ops import Literal
from fnnc.ops.primitive import Opaque

FORMAT, VERSION = "fnnc.graph", 1


# -- values ------------------------------------------------------------------
def _enc(value: Any, where: str, order: int = 1) -> Any:
    """``value``'s file form; ``order``: VJP orders a StableHLO module keeps (see _stablehlo)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, tuple):
        return {"$tuple": [_enc(v, where, order) for v in value]}
    if isinstance(value, np.dtype):
        return {"$dtype": value.name}
    if isinstance(value, np.generic):
        return _enc(value.item(), where)
    if isinstance(value, Literal):
        return {
            "$literal": base64.b64encode(value.data).decode("ascii"),
            "shape": list(value.shape),
            "dtype": value.dtype.name,
        }
    if isinstance(value, Command):
        return {"$command": _enc_command(value, where, order)}
    if isinstance(value, Graph):
        return {"$graph": _graph_data(value, order)}
    if isinstance(value, Opaque) and isinstance(value.value, jax.export.Exported):
        blob = _stablehlo(value.value, order, where)
        return {
            "$stablehlo": base64.b64encode(blob).decode("ascii"),
            "sha256": hashlib.sha256(blob).hexdigest(),
        }
    raise GraphFormatError(
        f"save: {where} holds a {type(value).__name__} ({value!r:.80}), which has no file "
        "form (values holding Python code, such as an Optax transformation, cannot be "
        "saved); such graphs can be compiled but not saved"
    )


def _dec(value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        if isinstance(value, list):
            raise GraphFormatError(f"load: {where}: bare list (expected a tagged value)")
        return value
    if "$tuple" in value:
        return tuple(_dec(v, where) for v in value["$tuple"])
    if "$dtype" in value:
        return _dtype(value["$dtype"], where)
    if "$float" in value:
        return float(value["$float"])
    if "$literal" in value:
        data = base64.b64decode(value["$literal"], validate=True)
        shape, dtype = _dims(value["shape"], where), _dtype(value["dtype"], where)
        if len(data) != math.prod(shape) * dtype.itemsize:  # Python ints: no overflow
            raise GraphFormatError(
                f"load: {where}: constant of {dtype}{list(shape)} has {len(data)} bytes"
            )
        return Literal(data, shape, dtype)
    if "$command" in value:
        return _dec_command(value["$command"], where)
    if "$graph" in value:  # its errors count its own nodes: say whose sub-graph it is
        try:
            return from_data(value["$graph"])
        except FnncError as e:
            raise located(e, f"in the sub-graph of {where}") from None
    if "$stablehlo" in value:
        return _module(value, where)
    raise GraphFormatError(f"load: {where}: unknown tagged value with keys {sorted(value)}")


def _enc_command(cmd: Command, where: str, order: int = 1) -> dict[str, Any]:
    if cmd.definition.backward_node is not None:
        order += 1  # the command it differentiates runs its VJP: one order more to keep
    params = [[k, _enc(v, f"{where} param {k}", order)] for k, v in cmd.params]
    return {"name": cmd.name, "params": params}


def _dec_command(data: dict[str, Any], where: str) -> Command:
    """The command of a node, its parameters checked against the command's definition."""
    name = data["name"]
    opdef = lookup(name)  # UnknownCommandError names it
    given = {}
    for k, v in data["params"]:
        if not isinstance(k, str) or k not in opdef.param_defaults:
            raise GraphFormatError(
                f"load: {where}: {name} has no parameter {k!r}; its parameters are "
                f"{sorted(opdef.param_defaults)}"
            )
        given[k] = _dec(v, f"{where} param {k}")
    params = []
    for key, default in opdef.param_defaults.items():
        if key in given:
            _check_type(opdef, key, given[key], where)
        elif default is inspect.Parameter.empty:
            raise GraphFormatError(
                f"load: {where}: {name} needs parameter {key!r}, which the file lacks"
            )
        params.append((key, freeze(given[key]) if key in given else default))
    return Command(name, tuple(params))


def _check_type(opdef: OpDef, key: str, value: Any, where: str) -> None:
    """A loaded parameter is of a kind the command takes (:func:`param_fits`: a bool for
    a bool, an int for an int, ...); a parameter the command requires is never null."""
    required = opdef.param_defaults[key] is inspect.Parameter.empty
    if required and value is None:
        expected = f"a value ({opdef.name}{inspect.signature(opdef.forward)} requires one)"
    elif not param_fits(opdef, key, value):
        default = json.dumps([key, _enc(opdef.param_defaults[key], key)])
        expected = f"{expected_kind(opdef, key)}, e.g. {default}"
    else:
        return
    raise GraphFormatError(
        f"load: {where}: {opdef.name} parameter {key!r} is {value!r:.60} "
        f"({type(value).__name__}); expected {expected}. Fix the value in the file or "
        "save the graph again"
    )


# -- graphs ------------------------------------------------------------------
def to_data(graph: Graph) -> dict[str, Any]:
    """The graph as JSON-able data."""
    return _graph_data(require_graph(graph, "to_data"), 1)


def _graph_data(graph: Graph, order: int) -> dict[str, Any]:
    symbols = []
    for s in graph.symbols:
        entry: dict[str, Any] = {
            "shape": list(s.shape),
            "dtype": np.dtype(s.dtype).name,
            "name": s.name,
        }
        if isinstance(s, AliasSymbol):
            entry.update(root=s.root, base=s.base, stride=list(s.stride))
        symbols.append(entry)
    nodes = [
        {
            "cmd": _enc_command(
                _file_command(n.cmd, [graph.spec(s) for s in n.inputs], f"node {i}"),
                f"node {i} ({n.name or n.cmd.name})",
                order,
            ),
            "inputs": list(n.inputs),
            "outputs": list(n.outputs),
            "name": n.name,
        }
        for i, n in enumerate(graph.nodes)
    ]
    data = {
        "format": FORMAT,
        "version": VERSION,
        "symbols": symbols,
        "nodes": nodes,
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "out_tree": _enc_tree(graph),
    }
    if graph.in_paths is not None:  # traced graphs: the arguments' key paths
        data["in_paths"] = list(graph.in_paths)
    return data


def from_data(data: Any) -> Graph:
    """A graph from :func:`to_data` output; raises :class:`GraphFormatError` if it is not one."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise GraphFormatError(
            'load: not an fnnc graph (expected a JSON object with "format": '
            f'"{FORMAT}"; got {type(data).__name__}'
            + (f" with format {data.get('format')!r})" if isinstance(data, dict) else ")")
        )
    if type(data.get("version")) is not int or data["version"] != VERSION:  # true == 1
        raise GraphFormatError(
            f"load: graph format version {data.get('version')!r}; this fnnc reads version {VERSION}"
        )
    try:
        symbols = []
        for i, s in enumerate(data["symbols"]):
            where = f"symbol %{i}"
            shape, dtype = _dims(s["shape"], where), _dtype(s["dtype"], where)
            if "root" in s:
                symbols.append(
                    AliasSymbol(
                        i,
                        int(s["root"]),
                        shape,
                        dtype,
                        int(s["base"]),
                        tuple(int(n) for n in s["stride"]),
                        s["name"],
                    )
                )
            else:
                symbols.append(TensorSymbol(i, shape, dtype, s["name"]))
        nodes = tuple(
            Node(
                _dec_command(n["cmd"], f"node {i}"),
                tuple(map(int, n["inputs"])),
                tuple(map(int, n["outputs"])),
                n["name"],
            )
            for i, n in enumerate(data["nodes"])
        )
        graph = Graph(
            tuple(symbols),
            nodes,
            tuple(map(int, data["inputs"])),
            tuple(map(int, data["outputs"])),
            _dec_tree(data.get("out_tree"), len(data["outputs"])),
            _dec_paths(data.get("in_paths"), len(data["inputs"])),
        )
        _check_ids(graph)
    except FnncError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise GraphFormatError(f"load: malformed graph data ({type(e).__name__}: {e})") from e
    try:
        return verify(graph)
    except GraphFormatError:
        raise
    except FnncError:
        failure = _rule_failure(graph)
        if failure is None:
            raise
        raise GraphFormatError(failure) from None
    except Exception as e:  # a shape rule choking on a hand-edited parameter
        raise GraphFormatError(
            _rule_failure(graph) or f"load: the graph does not verify ({type(e).__name__}: {e})"
        ) from None


def _enc_tree(graph: Graph) -> Any:
    """The output structure in the pytree codec checkpoints use (:mod:`fnnc.io.tree`)."""
    if graph.out_tree is None:
        return None
    example = jax.tree.unflatten(graph.out_tree, list(range(len(graph.outputs))))
    try:
        data, rows = tree.encode(example, "", str)
    except CheckpointError as e:
        warnings.warn(
            f"save: the output structure is not saved ({e}); the loaded graph returns a flat tuple",
            stacklevel=3,
        )
        return None
    assert not rows  # the leaves are ints, stored inline
    return data


def _dec_paths(data: Any, n: int) -> tuple[str, ...] | None:
    """The inputs' key paths (absent in files from before they were saved: ``None``)."""
    if data is None:
        return None
    if not (isinstance(data, list) and len(data) == n and all(isinstance(p, str) for p in data)):
        raise ValueError(f"in_paths must be a list of {n} strings, one per input")
    return tuple(data)


def _dec_tree(data: Any, n: int) -> Any:
    if data is None:
        return None
    try:
        example = tree.decode(data, _no_arrays, loose=True)
    except CheckpointError as e:
        raise GraphFormatError(f"load: output structure: {e}") from None
    structure = jax.tree.structure(example)
    if structure.num_leaves != n:
        raise GraphFormatError(
            f"load: output structure has {structure.num_leaves} leaves, graph {n}"
        )
    return structure


def _no_arrays(row: str, shape: Any, dtype: Any) -> Any:
    raise GraphFormatError("load: an output structure holds no arrays")


# -- files -------------------------------------------------------------------
def save(graph: Graph, path: Any, *, name: str | None = None) -> None:
    """Writes ``graph`` to ``path`` as JSON, atomically (temp file, then rename).

    With ``name=`` (or a :class:`fnnc.io.TensorFile` as ``path``, then under the name
    ``"graph"`` unless ``name=`` says otherwise), the graph is stored under that name
    in an NNC SQLite tensor file instead, beside its tensors (e.g. a model's
    parameters), in one transaction. Without ``name=``, an existing SQLite or
    safetensors file at ``path`` is refused (:class:`GraphFormatError`), not replaced
    with JSON: its tensors would be lost.

    >>> import os, tempfile
    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder, save, load
    >>> b = GraphBuilder()
    >>> x = b.input((3,), name="x")
    >>> g = b.build([b.exec(ops.relu(), x)])
    >>> path = os.path.join(tempfile.mkdtemp(), "g.json")
    >>> save(g, path)
    >>> load(path) == g
    True
    """
    require_graph(graph, "save")
    if name is not None or not isinstance(path, (str, os.PathLike)):
        documents.save_to(path, graph, name or "graph")
        return
    if looks_sqlite(path):
        raise GraphFormatError(
            f"save: {os.fspath(path)} is an NNC SQLite tensor file; saving JSON over it "
            "would lose its tensors. Pass name= to store the graph in it beside them "
            "(save(graph, path, name='graph'); load(path, name='graph') reads it back), "
            "or give another path (delete the file first to replace it)"
        )
    if looks_safetensors(path):
        raise GraphFormatError(
            f"save: {os.fspath(path)} is a safetensors file; saving JSON over it would lose "
            "its tensors, and safetensors files hold no graphs. Give another path (a .json "
            "file, or an NNC SQLite tensor file with name=), or delete the file first to "
            "replace it"
        )
    text = json.dumps(to_data(graph), separators=(",", ":"))
    atomic_write(path, text)  # a full disk leaves the old file and no temporary one


def load(path: Any, *, name: str | None = None) -> Graph:
    """Reads a graph written by :func:`save`; :class:`GraphFormatError` if it is not one.

    With ``name=`` (or a :class:`fnnc.io.TensorFile`, then the graph named ``"graph"``
    unless ``name=`` says otherwise), reads the graph of that name from an NNC SQLite
    tensor file; a path to such a file without ``name=`` is a
    :class:`GraphFormatError` naming the graphs it holds.
    """
    if name is not None or not isinstance(path, (str, os.PathLike)):
        return documents.load_from(path, name or "graph")
    if looks_sqlite(path):
        raise GraphFormatError(
            f"load: {os.fspath(path)} is an NNC SQLite tensor file, not a JSON graph file; "
            f"graphs stored in it are read by name: load(path, name=...) "
            f"(graphs in it: {_stored_names(path)})"
        )
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:  # reading never creates: a missing file is an error naming it
        raise GraphFormatError(
            f"load: cannot read {os.fspath(path)} ({e.strerror or e}); check the path"
        ) from None
    except (ValueError, RecursionError) as e:  # bad UTF-8 and JSON are ValueErrors
        why = "nested too deeply" if isinstance(e, RecursionError) else f"not JSON: {e}"
        raise GraphFormatError(
            f"load: {os.fspath(path)} is not an fnnc graph file ({why}){artifact_hint(path)}"
        ) from None
    try:
        return from_data(data)
    except FnncError as e:  # unknown commands and verify's errors too, each of its kind
        raise located(e, f"file {os.fspath(path)}") from None


def _stored_names(path: Any) -> str:
    """The graphs an SQLite file holds, for a message ("none", or why they are unknown)."""
    try:
        return ", ".join(map(repr, documents.graph_names(path))) or "none"
    except FnncError as e:
        return f"unknown: {e}"


documents.register_format(documents.Format(FORMAT, Graph, to_data, from_data))
