"""Readable SSA text of graphs and nodes, and Graphviz output.

One listing format serves errors, golden tests and debug dumps::

    graph(%0:f32[8,4] x, %1:f32[16,4] w) {
      %2:f32[8,16] = gemm[transpose_b=True](%0, %1)  # fc1
      return %2
    }
"""

from __future__ import annotations

import numpy as np

from fnnc.core.ir import AliasSymbol, Graph, Node, Symbol, require_graph

_SHORT = {
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "float64": "f64",
    "int32": "i32",
    "int64": "i64",
    "int8": "i8",
    "int16": "i16",
    "uint8": "u8",
    "uint32": "u32",
    "bool": "bool",
    "complex64": "c64",
}


def type_str(sym: Symbol) -> str:
    name = np.dtype(sym.dtype).name
    return f"{_SHORT.get(name, name)}[{','.join(map(str, sym.shape))}]"


def sym_str(sym: Symbol) -> str:
    return f"%{sym.id}:{type_str(sym)}"


def _sid_str(graph: Graph, sid: int) -> str:
    """``sym_str`` of a symbol id, tolerating ids a broken graph does not have."""
    return sym_str(graph.symbols[sid]) if 0 <= sid < len(graph.symbols) else f"%{sid}:?"


def format_node(graph: Graph, node: Node) -> str:
    outs = ", ".join(_sid_str(graph, o) for o in node.outputs)
    ins = ", ".join(f"%{i}" for i in node.inputs)
    comment = f"  # {node.name}" if node.name else ""
    return f"{outs} = {node.cmd}({ins}){comment}"


def format_alias(sym: AliasSymbol) -> str:
    name = f"  # {sym.name}" if sym.name else ""
    stride = ",".join(map(str, sym.stride)) + ("," if len(sym.stride) == 1 else "")
    return f"{sym_str(sym)} = alias %{sym.root}[base={sym.base}, stride=({stride})]{name}"


def _free_roots(graph: Graph) -> list[int]:
    """Symbols that are neither inputs nor node outputs (written through aliases)."""
    written = set(graph.inputs) | set(graph.producers)
    return [s.id for s in graph.symbols if not s.is_alias and s.id not in written]


def format_graph(graph: Graph, mark: int | None = None, window: int | None = None) -> str:
    """The SSA listing; ``mark`` flags one node index, ``window`` limits lines around it."""
    params = ", ".join(
        _sid_str(graph, i)
        + (
            f" {graph.symbols[i].name}"
            if 0 <= i < len(graph.symbols) and graph.symbols[i].name
            else ""
        )
        for i in graph.inputs
    )
    lines = [f"graph({params}) {{"]
    for sid in _free_roots(graph):
        sym = graph.symbols[sid]
        lines.append(f"  tensor {sym_str(sym)}" + (f"  # {sym.name}" if sym.name else ""))
    for sym in graph.symbols:
        if isinstance(sym, AliasSymbol):
            lines.append(f"  {format_alias(sym)}")
    first_node = len(lines)
    for i, node in enumerate(graph.nodes):
        prefix = ">>" if i == mark else "  "
        lines.append(f"{prefix}{format_node(graph, node)}")
    outs = ", ".join(f"%{o}" for o in graph.outputs)
    lines.append(f"  return {outs}")
    lines.append("}")
    if mark is not None and window is not None:
        at = first_node + mark
        lo, hi = max(first_node, at - window), min(len(lines) - 2, at + window + 1)
        body = (
            (["  ..."] if lo > first_node else [])
            + lines[lo:hi]
            + (["  ..."] if hi < len(lines) - 2 else [])
        )
        lines = lines[:1] + body + lines[-2:]
    return "\n".join(lines)


def to_dot(graph: Graph) -> str:
    """Graphviz ``dot`` text: tensors as ellipses, commands as boxes.

    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.input((2,), name="x")
    >>> print(to_dot(b.build([b.exec(ops.relu(), x)])).splitlines()[0])
    digraph fnnc {
    """
    require_graph(graph, "to_dot")
    lines = ["digraph fnnc {", "  rankdir=TB;", '  node [fontname="monospace"];']
    for sym in graph.symbols:
        label = "\\n".join(_esc(part) for part in (sym.name, sym_str(sym)) if part)
        lines.append(f'  t{sym.id} [shape=ellipse, label="{label}"];')
        if isinstance(sym, AliasSymbol):
            lines.append(f"  t{sym.root} -> t{sym.id} [style=dashed, arrowhead=none];")
    for i, node in enumerate(graph.nodes):
        label = "\\n".join(_esc(part) for part in (str(node.cmd), node.name) if part)
        lines.append(f'  n{i} [shape=box, label="{label}"];')
        for s in node.inputs:
            lines.append(f"  t{s} -> n{i};")
        for s in node.outputs:
            lines.append(f"  n{i} -> t{s};")
    lines.append("}")
    return "\n".join(lines)


def _esc(text: str) -> str:
    """``text`` inside a quoted DOT label: a backslash doubled (one ending a name would
    escape the closing quote), quotes escaped, line breaks as ``\\n``."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def first_few(items: list[str] | tuple[str, ...], most: int) -> str:
    """``items`` joined with commas, the first ``most`` of them and how many more, for
    error messages that list names.

    >>> first_few(["a", "b", "c"], 2)
    'a, b, ... (1 more)'
    """
    more = f", ... ({len(items) - most} more)" if len(items) > most else ""
    return ", ".join(items[:most]) + more
