"""The checks a loaded graph file's data passes before :mod:`fnnc.graph.serialize`
builds and verifies the graph: shapes and dtypes of symbols (:func:`_dims`,
:func:`_dtype`), symbol ids that name symbols (:func:`_check_ids`), and, when verify
fails, blaming a shape rule that cannot take the file's parameters
(:func:`_rule_failure`). Each raises or returns a :class:`GraphFormatError` message
that names the symbol or node and says how to fix the file. Moved out of
:mod:`fnnc.graph.serialize`, which calls them.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
import numpy as np

from fnnc.core.command import output_specs
from fnnc.core.ir import Graph
from fnnc.errors import FnncError, GraphFormatError, RuleError


def _dims(shape: Any, where: str) -> tuple[int, ...]:
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise GraphFormatError(
            f"load: {where}: shape {shape!r:.80} must be a list of non-negative ints"
        )
    return tuple(shape)


def _dtype(name: Any, where: str) -> np.dtype:
    try:
        dtype = jax.numpy.dtype(name) if isinstance(name, str) else None
    except TypeError:
        dtype = None
    if dtype is None or (dtype.kind not in "biufc" and dtype.name != "bfloat16"):
        raise GraphFormatError(
            f"load: {where}: dtype {name!r:.40} is not a tensor dtype (float32, int32, ...)"
        )
    return dtype


def _check_ids(graph: Graph) -> None:
    """Every symbol id the file names is one of its symbols (shape rules and verify
    would index past them, or, for a negative id, count from the end)."""
    n = len(graph.symbols)
    named = [(f"symbol %{s.id}: root", [s.root]) for s in graph.symbols if s.is_alias]
    for i, node in enumerate(graph.nodes):
        where = f"node {i} ({node.name or node.cmd.name})"
        named += [(f"{where}: input", node.inputs), (f"{where}: output", node.outputs)]
    named += [("graph input", graph.inputs), ("graph output", graph.outputs)]
    for where, ids in named:
        bad = [k for k in ids if not 0 <= k < n]
        if bad:
            raise GraphFormatError(
                f"load: {where} {bad[0]} is not a symbol id: the file has {n} symbols "
                f"(%0..%{n - 1}); fix the id in the file or save the graph again"
            )


def _rule_failure(graph: Graph) -> str | None:
    """The message for a file whose parameters a shape rule cannot take: the first
    node whose rule raises :class:`RuleError` or a raw error, else ``None`` (verify's
    own error, a real shape mismatch or an id that is not a symbol's, stands)."""
    for i, node in enumerate(graph.nodes):
        if not all(0 <= s < len(graph.symbols) for s in node.inputs):
            return None  # not the parameters' fault: no rule to blame
        specs = [graph.symbols[s].spec for s in node.inputs]
        try:
            output_specs(node.cmd, specs)
        except RuleError as e:
            cause = e.__cause__ or e
        except FnncError:
            return None
        except Exception as e:
            cause = e
        else:
            continue
        return (
            f"load: node {i} ({node.name or node.cmd.name}): {node.cmd.name} cannot "
            f"take the file's parameters {node.cmd.kwargs!r:.200} ({type(cause).__name__}: "
            f"{cause}); fix them to fit {node.cmd.name}"
            f"{inspect.signature(node.cmd.definition.forward)} or save the graph again"
        )
    return None
