"""cast_precision keeps a graph's meaning within bfloat16/float16 tolerance."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import GraphError
from fnnc.graph import GraphBuilder, interpret
from fnnc.graph.passes.precision import cast_precision


def _mlp():
    b = GraphBuilder()
    x, w, y = b.input((8, 5), name="x"), b.input((3, 5), name="w"), b.input((8,), np.int32)
    logits = b.exec(ops.tanh(), b.exec(ops.gemm(transpose_b=True), x, w))
    loss = b.exec(ops.softmax_crossentropy(), logits, y)
    loss = loss[0] if isinstance(loss, tuple) else loss
    return b.build([b.exec(ops.reduce_mean(axes=(0,)), loss), logits])


@pytest.mark.parametrize("dtype,tol", [("bfloat16", 2e-2), ("float16", 2e-3)])
def test_semantics_within_low_precision_tolerance(dtype, tol):
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(8, 5)), rng.normal(size=(3, 5))
    args = (x.astype(np.float32), w.astype(np.float32), rng.integers(0, 3, 8).astype(np.int32))
    graph = _mlp()
    low = cast_precision(graph, dtype)
    want, got = interpret(graph, *args), interpret(low, *args)
    for a, b in zip(got, want):
        assert a.dtype == np.float32  # outputs keep their types
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)
    names = {low.symbols[n.outputs[0]].dtype.name: n.cmd.name for n in low.nodes}
    gemm = next(n for n in low.nodes if n.cmd.name == "gemm")
    assert low.symbols[gemm.outputs[0]].dtype.name == dtype, names
    ce = next(n for n in low.nodes if n.cmd.name == "softmax_crossentropy")
    assert all(low.symbols[s].dtype.name in ("float32", "int32") for s in ce.inputs)
    assert low.inputs == graph.inputs


def test_unknown_dtype_says_what_is_accepted():
    with pytest.raises(GraphError, match="expected one of"):
        cast_precision(_mlp(), "float8")
