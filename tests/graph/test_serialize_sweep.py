"""Every command of the registry sweep survives save/load as a one-node graph."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fnnc.core.ir import Graph, Node, TensorSymbol
from fnnc.graph import from_data, to_data
from tests.ops.test_registry import CASES

# primitives save as ``exported`` (tests/graph/test_save_traced.py); an Optax update holds
# Python functions, which a file never carries.
_SAVEABLE = [
    c for c in CASES if c.cmd.name not in ("primitive", "effectful_primitive", "optax_update")
]


def _one_node(case) -> Graph:
    ins = [np.asarray(x) for x in case.inputs]
    outs = case.cmd.shape(*[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in ins])
    symbols = [TensorSymbol(i, tuple(x.shape), x.dtype) for i, x in enumerate(ins)]
    symbols += [
        TensorSymbol(len(ins) + j, tuple(o.shape), np.dtype(o.dtype)) for j, o in enumerate(outs)
    ]
    node = Node(case.cmd, tuple(range(len(ins))), tuple(range(len(ins), len(symbols))))
    return Graph(tuple(symbols), (node,), node.inputs, node.outputs)


@pytest.mark.parametrize("case", _SAVEABLE, ids=[c.id for c in _SAVEABLE])
def test_command_round_trips(case):
    graph = _one_node(case)
    loaded = from_data(to_data(graph))
    if case.cmd.name != "exported":
        assert loaded == graph
