"""Pat / match: structure, captures, commutative inputs, attributes, params, constraints."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import GraphError
from fnnc.graph import Graph, GraphBuilder, Pat
from fnnc.graph.matching import match, matches


def _silu_graph(swapped: bool) -> Graph:
    b = GraphBuilder()
    x, y = b.input((2, 3), name="x"), b.input((2, 3), name="y")
    s = b.exec(ops.sigmoid(), x)
    z = b.exec(ops.mul(), *((s, x) if swapped else (x, s)))
    other = b.exec(ops.mul(), y, b.exec(ops.sigmoid(), x))  # sigmoid of x, times y
    return b.build([z, other])


SILU = Pat.op("mul", Pat.var("x"), Pat.op("sigmoid", Pat.var("x"), name="s"))


@pytest.mark.parametrize("swapped", [False, True])
def test_captures_and_commutative_order(swapped: bool) -> None:
    g = _silu_graph(swapped)
    m = match(SILU, g, g.outputs[0])
    assert m is not None and m["x"].name == "x" and m.root.cmd.name == "mul"
    assert m.node("s").cmd.name == "sigmoid" and m["s"].id == m.node("s").outputs[0]
    # the same name twice must be the same symbol: y * sigmoid(x) is no silu
    assert match(SILU, g, g.outputs[1]) is None
    # ordered=True keeps the written order
    ordered = Pat.op("mul", Pat.var("x"), Pat.op("sigmoid", Pat.var("x")), ordered=True)
    assert (match(ordered, g, g.outputs[0]) is None) == swapped


def test_attributes_params_dtypes_shapes_and_predicates() -> None:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    i = b.input((3,), np.int32, name="i")
    t = b.exec(ops.transpose(perm=(1, 0)), x)
    e = b.exec(ops.ewexp(), x)
    g = b.build([t, e, i])
    assert match(Pat.op("transpose", Pat.var(), perm=(1, 0)), g, t.id) is not None
    assert match(Pat.op("transpose", Pat.var(), perm=lambda p: p == (0, 1)), g, t.id) is None
    assert match(Pat.op(None, Pat.var(), attrs=("elementwise",)), g, e.id) is not None
    assert match(Pat.op(None, Pat.var(), attrs=("elementwise",)), g, t.id) is None
    assert match(Pat.op("ewexp", Pat.var(shape=(2, None))), g, e.id) is not None
    assert match(Pat.op("ewexp", Pat.var(shape=(3, None))), g, e.id) is None
    assert match(Pat.op("ewexp", Pat.var(dtype="floating")), g, e.id) is not None
    b16 = GraphBuilder()
    h = b16.exec(ops.ewexp(), b16.input((2,), jnp.bfloat16, name="h"))
    assert match(Pat.op("ewexp", Pat.var(dtype="floating")), b16.build([h]), h.id) is not None
    assert match(Pat.op("ewexp", Pat.input(dtype=np.int32)), g, e.id) is None
    big = Pat.op("ewexp", Pat.var(where=lambda s: s.name == "x"))
    assert match(big, g, e.id) is not None
    with pytest.raises(GraphError, match="unknown attribute 'fast'"):
        Pat.op(None, attrs=("fast",))
    with pytest.raises(GraphError, match="inputs are patterns"):
        Pat.op("relu", "x")  # type: ignore[arg-type]


def test_constants_rest_each_any_of_and_every_match() -> None:
    b = GraphBuilder()
    x = b.input((3,), name="x")
    two = b.constant(np.float32(2))
    s = b.exec(ops.ewsum(), x, two, two)
    c = b.exec(ops.ewprod(), two, b.constant(np.full(3, 2, np.float32)))
    g = b.build([s, c])
    m = match(Pat.op("ewsum", Pat.var("x"), ...), g, s.id)
    assert m is not None and [r.id for r in m.rest] == [two.id, two.id]
    assert match(Pat.op("ewsum", Pat.var("x")), g, s.id) is None  # three inputs
    assert match(Pat.op("ewsum", Pat.var(), Pat.const(2), Pat.const(2.0)), g, s.id) is not None
    assert match(Pat.op("ewsum", Pat.var(), Pat.const(3), ...), g, s.id) is None
    assert match(Pat.op(None, each=Pat.const(2)), g, c.id) is not None
    assert match(Pat.op(None, each=Pat.const(2)), g, s.id) is None
    either = Pat.op("ewprod", Pat.any_of(Pat.input(), Pat.const(name="k")), ...)
    m = match(either, g, c.id)
    assert m is not None and float(m.value("k")) == 2.0
    # commutative ewsum(x, 2, 2): the input orders are tried once each (the two 2s are
    # one symbol), so x lands in the middle once
    found = list(matches(Pat.op("ewsum", Pat.const(), Pat.var("v"), Pat.const()), g, s.id))
    assert [m["v"].id for m in found] == [x.id]
    found = list(matches(Pat.op("ewsum", Pat.var("a"), Pat.var("b"), Pat.var("c")), g, s.id))
    assert len(found) == 3  # (x,2,2), (2,x,2), (2,2,x)
