"""Audit 8 of the graph passes and the custom-pass API (Rewriter, rules)."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import GraphError
from fnnc.graph import GraphBuilder, Rewriter, interpret


def _relu_exp():
    b = GraphBuilder()
    x = b.input((3,), name="x")
    r = b.exec(ops.relu(), x, name="r")
    return b.build([b.exec(ops.ewexp(), r, name="e")]), x, r


def test_rewriter_refuses_a_cycle_of_replacements() -> None:
    # replace_all_uses(r, x) then (x, r) looped forever in finish (each read resolved
    # r -> x -> r ...); now the second edit is refused, naming the cycle.
    graph, x, r = _relu_exp()
    rw = Rewriter(graph)
    rw.replace_all_uses(r, x)
    with pytest.raises(GraphError, match=r"replace_all_uses\(%0 \(x\), %1 \(r\)\) closes a cycle"):
        rw.replace_all_uses(x, r)
    with pytest.raises(GraphError, match="cycle"):
        rw2 = Rewriter(graph)
        s = rw2.exec(ops.scalar_mul(a=2.0), r)
        rw2.replace_all_uses(r, s)
        t = rw2.exec(ops.scalar_mul(a=3.0), s)
        rw2.replace_all_uses(s, t)
        rw2.replace_all_uses(t, r)


def test_rewriter_chain_of_replacements_still_resolves() -> None:
    graph, _, r = _relu_exp()
    rw = Rewriter(graph)
    with rw.inserting_after(0):
        s = rw.exec(ops.scalar_mul(a=2.0), r)
        t = rw.exec(ops.scalar_mul(a=3.0), s)
    rw.replace_all_uses(r, s)
    rw.replace_all_uses(s, t)  # r -> s -> t: the exp reads 6 * relu(x)
    xv = np.float32([-1.0, 0.5, 2.0])
    want = np.exp(6.0 * np.maximum(xv.astype(np.float64), 0.0))
    np.testing.assert_allclose(interpret(rw.finish(), xv), want, rtol=1e-6)
