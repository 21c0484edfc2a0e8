"""cse: equal computations merge (commutative ones in any order); random, effectful
and view-writing nodes never do."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from fnnc import ops
from fnnc.graph import GraphBuilder, interpret
from fnnc.graph.passes import cse
from tests.graph.strategies import graphs
from tests.helpers import assert_pass_keeps_semantics, rand

SETTINGS = settings(max_examples=60)


def _nnc_square():
    """NNC's CSE test: (x + y) * (x + y) with the sum built twice."""
    b = GraphBuilder()
    x, y = b.input((), name="x"), b.input((), name="y")
    s1 = b.exec(ops.add(), x, y, name="s1")
    s2 = b.exec(ops.add(), y, x, name="s2")
    return b.build([b.exec(ops.mul(), s1, s2, name="z")])


def test_golden_nnc_square() -> None:
    graph = _nnc_square()
    xs = [np.float32(10), np.float32(8)]
    new = assert_pass_keeps_semantics(cse, graph, xs)
    assert str(new) == (
        "graph(%0:f32[] x, %1:f32[] y) {\n"
        "  %2:f32[] = add(%0, %1)  # s1\n"
        "  %3:f32[] = mul(%2, %2)  # z\n"
        "  return %3\n"
        "}"
    )
    assert float(interpret(new, *xs)) == 324.0


def test_merges_transitively_and_rewires_outputs() -> None:
    b = GraphBuilder()
    x = b.input((3,), name="x")
    c1, c2 = b.constant(np.float32(2)), b.constant(np.float32(2))
    a1 = b.exec(ops.ewprod(), x, c1)
    a2 = b.exec(ops.ewprod(), c2, x)  # equal constants merge first, then these two
    e1, e2 = b.exec(ops.ewexp(), a1), b.exec(ops.ewexp(), a2)
    graph = b.build([e1, e2, a2])
    new = assert_pass_keeps_semantics(cse, graph, [rand((3,))])
    assert [n.cmd.name for n in new.nodes] == ["constant", "ewprod", "ewexp"]
    assert new.outputs == (new.outputs[0], new.outputs[0], new.nodes[1].outputs[0])


def test_order_matters_unless_commutative() -> None:
    b = GraphBuilder()
    x, y = b.input((2,)), b.input((2,))
    pairs = [
        (ops.ewdiv(), True),
        (ops.add(p=1.0, q=-1.0), True),
        (ops.add(p=0.5, q=0.5), False),
        (ops.min(), False),
        (ops.max(), False),
        (ops.ewsum(), False),
    ]
    outs = [(b.exec(cmd, x, y), b.exec(cmd, y, x)) for cmd, _ in pairs]
    graph = b.build([s for pair in outs for s in pair])
    new = assert_pass_keeps_semantics(cse, graph, [rand((2,)), rand((2,), seed=1)])
    assert len(new.nodes) == len(pairs) + sum(ordered for _, ordered in pairs)


def test_equal_views_are_read_once_and_views_of_merged_tensors_follow() -> None:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    r1, r2 = b.exec(ops.relu(), x), b.exec(ops.relu(), x)
    v1 = b.alias(r1, (1, 3), offset=(1, 0))
    v2 = b.alias(r2, (1, 3), offset=(1, 0))  # a view of the duplicate
    graph = b.build([b.exec(ops.ewexp(), v1), b.exec(ops.ewexp(), v2)])
    new = assert_pass_keeps_semantics(cse, graph, [rand((2, 3))])
    assert [n.cmd.name for n in new.nodes] == ["relu", "ewexp"]


def test_random_effectful_and_view_writes_are_never_merged() -> None:
    from jax import lax

    from fnnc.ops.primitive import primitive_command

    b = GraphBuilder()
    key = b.input((2,), np.uint32, name="key")
    x = b.input((2,), name="x")
    u1 = b.exec(ops.random_uniform(shape=(2,)), key)
    u2 = b.exec(ops.random_uniform(shape=(2,)), key)
    effect = primitive_command(lax.erf_p, {}, [((2,), np.float32)], effects=True)
    e1, e2 = b.exec(effect, x), b.exec(effect, x)
    whole = b.tensor((4,))
    b.exec(ops.relu(), x, outputs=[b.alias(whole, (2,))])
    b.exec(ops.relu(), x, outputs=[b.alias(whole, (2,), offset=(2,))])
    graph = b.build([u1, u2, e1, e2, whole])
    assert cse(graph) is graph


def test_nothing_to_merge_returns_the_graph() -> None:
    b = GraphBuilder()
    x = b.input((2,))
    graph = b.build([b.exec(ops.relu(), b.exec(ops.ewexp(), x))])
    assert cse(graph) is graph


@SETTINGS
@given(graphs(max_nodes=8, duplicates=True))
def test_random_graphs(case) -> None:
    graph, arrays = case
    assert_pass_keeps_semantics(cse, graph, arrays)
