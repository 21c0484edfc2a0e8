"""Rule / graph_rewrite: the two short rewrites against hand-computed oracles, the
fixpoint, errors, and semantics on random graphs against ``interpret``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from fnnc import ops
from fnnc.errors import GraphError
from fnnc.graph import (
    GraphBuilder,
    Pat,
    Rule,
    graph_rewrite,
    interpret,
    rewrite_pass,
    run_passes,
    verify,
)
from tests.graph.strategies import graphs
from tests.helpers import assert_pass_keeps_semantics

# -- the rewrites of the issue, each at most 10 lines of user code -------------------------
scaled = Pat.op("mul", Pat.const(name="c", shape=()), Pat.var("x"))
fold_scale = Rule(
    Pat.op("gemm", scaled, Pat.var("w"), ...),
    lambda m: m.exec(
        m.root.cmd, m["x"], m.exec(ops.scalar_mul(a=float(m.value("c"))), m["w"]), *m.rest
    ),
)
relu_to_leaky = Rule(
    Pat.op("relu", Pat.var("x")), lambda m: m.exec(ops.leaky_relu(negative_slope=0.2), m["x"])
)
# ------------------------------------------------------------------------------------------


def test_fold_scale_into_the_following_gemm_by_hand() -> None:
    b = GraphBuilder()
    x, w, bias = b.input((2, 3), name="x"), b.input((4, 3), name="w"), b.input((4,), name="b")
    sx = b.exec(ops.mul(), x, b.constant(np.float32(3.0)))  # the constant second: commutes
    graph = b.build([b.exec(ops.gemm(transpose_b=True), sx, w, bias, name="fc")])
    new = graph_rewrite(graph, [fold_scale])
    assert [n.cmd.name for n in new.nodes] == ["scalar_mul", "gemm"]
    assert new.nodes[1].inputs[0] == 0 and new.nodes[1].name == "fc"
    xv = np.array([[1, 2, 3], [-1, 0, 2]], np.float32)
    wv = np.arange(12, dtype=np.float32).reshape(4, 3) / 4
    bv = np.array([1, -1, 0.5, 0], np.float32)
    # by hand: row 0 of x @ (3w)^T is 3 * (1*w[j,0] + 2*w[j,1] + 3*w[j,2])
    want = np.array(
        [[3 * (0 + 0.5 + 1.5) + 1, 3 * (0.75 + 2 + 3.75) - 1, 3 * (1.5 + 3.5 + 6) + 0.5,
          3 * (2.25 + 5 + 8.25)],
         [3 * (0 + 0 + 1) + 1, 3 * (-0.75 + 0 + 2.5) - 1, 3 * (-1.5 + 0 + 4) + 0.5,
          3 * (-2.25 + 0 + 5.5)]], np.float32)  # fmt: skip
    np.testing.assert_allclose(interpret(new, xv, wv, bv), want, rtol=1e-6)
    assert graph_rewrite(new, [fold_scale]) is new


def test_relu_to_leaky_relu_by_hand() -> None:
    b = GraphBuilder()
    x = b.input((4,), name="x")
    graph = b.build([b.exec(ops.relu(), b.exec(ops.relu(), x, name="a"), name="b")])
    new = graph_rewrite(graph, [relu_to_leaky])
    assert [str(n.cmd) for n in new.nodes] == ["leaky_relu[negative_slope=0.2]"] * 2
    assert [n.name for n in new.nodes] == ["a", "b"]
    got = interpret(new, np.array([-5.0, -1.0, 0.0, 2.0], np.float32))
    np.testing.assert_allclose(got, [-0.2, -0.04, 0.0, 2.0], rtol=1e-6)  # 0.2 * 0.2 * -1


def test_replacements_are_rewritten_again_to_a_fixpoint() -> None:
    # scalar_mul(a) -> mul by a constant, and mul by a constant 1 -> x: the first rule's
    # result meets the second in the same walk
    to_mul = Rule(
        Pat.op("scalar_mul", Pat.var("x")),
        lambda m: m.exec(ops.mul(), m["x"], m.constant(np.float32(m.root.cmd.param("a")))),
    )
    drop_one = Rule(Pat.op("mul", Pat.var("x"), Pat.const(1)), lambda m: m["x"])
    b = GraphBuilder()
    x = b.input((2,), name="x")
    one = b.exec(ops.scalar_mul(a=1.0), x)
    graph = b.build([b.exec(ops.ewexp(), b.exec(ops.scalar_mul(a=2.0), one))])
    new = graph_rewrite(graph, [to_mul, drop_one])
    assert [n.cmd.name for n in new.nodes] == ["constant", "mul", "ewexp"]
    np.testing.assert_allclose(interpret(new, np.float32([0, 1])), np.exp([0, 2]), rtol=1e-6)
    assert graph_rewrite(new, [to_mul, drop_one]) is new


def test_bad_replacements_are_named() -> None:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    graph = b.build([b.exec(ops.relu(), x)])
    wrong = Rule(
        Pat.op("relu", Pat.var("x")),
        lambda m: m.exec(ops.reduce_sum(axes=(0,)), m["x"]),
        name="sums",
    )
    with pytest.raises(GraphError, match=r"rule sums: the replacement of node relu .*\[1, 3\]"):
        graph_rewrite(graph, [wrong])
    cyclic = Rule(Pat.op("relu", Pat.var("x")), lambda m: m.exec(ops.relu(), m["x"]), name="cyc")
    with pytest.raises(GraphError, match="rule cyc: its replacements keep matching"):
        graph_rewrite(graph, [cyclic])
    with pytest.raises(GraphError, match="must be an op pattern"):
        Rule(Pat.var("x"), lambda m: m["x"])


def test_a_rewrite_pass_is_blamed_by_name() -> None:
    b = GraphBuilder()
    x = b.input((2,), name="x")
    graph = b.build([b.exec(ops.ewexp(), b.exec(ops.relu(), x))])
    # reads the root's own output: a cycle the pass cannot see, verify can
    loops = rewrite_pass(
        Rule(Pat.op("relu", Pat.var("x")), lambda m: m.exec(ops.ewsum(), m["x"], m["x"])),
        name="loops",
    )
    assert run_passes(graph, (loops,)).nodes[0].cmd.name == "ewsum"

    def breaks(g):
        new = loops(g)
        import dataclasses

        return dataclasses.replace(new, nodes=new.nodes[::-1])

    breaks.__name__ = "breaks"
    with pytest.raises(GraphError, match=r"pass breaks \(round 1\) produced an invalid graph"):
        run_passes(graph, (breaks,))


# -- semantics on random graphs -------------------------------------------------------------
SEMANTIC = [
    Rule(  # relu(x) = max(x, 0)
        Pat.op("relu", Pat.var("x")),
        lambda m: m.exec(ops.max(), m["x"], m.constant(np.zeros((), m["x"].dtype))),
    ),
    Rule(  # scalar_mul[a](x) = mul(x, a)
        Pat.op("scalar_mul", Pat.var("x")),
        lambda m: m.exec(ops.mul(), m["x"], m.constant(np.asarray(m.root.cmd.param("a"), "f4"))),
    ),
    Rule(  # a two-operand ewsum of equal shapes = add
        Pat.op("ewsum", Pat.var("a"), Pat.var("b")),
        lambda m: m.exec(ops.add(), m["a"], m["b"]) if m["a"].shape == m["b"].shape else None,
    ),
    Rule(  # |x| = max(x, -x)
        Pat.op("ewabs", Pat.var("x")),
        lambda m: m.exec(ops.max(), m["x"], m.exec(ops.scalar_mul(a=-1.0), m["x"])),
    ),
    Rule(  # x * sigmoid(x) = swish(x)
        Pat.op("mul", Pat.var("x"), Pat.op("sigmoid", Pat.var("x"))),
        lambda m: m.exec(ops.swish(), m["x"]),
    ),
]


@settings(max_examples=40, deadline=None)
@given(graphs(max_nodes=8, activations=True, duplicates=True))
def test_rewrites_keep_semantics_on_random_graphs(case) -> None:
    graph, arrays = case
    assert_pass_keeps_semantics(lambda g: graph_rewrite(g, SEMANTIC), graph, arrays)


def test_random_graphs_give_the_rules_work() -> None:
    fired = []

    @settings(max_examples=40, deadline=None)
    @given(graphs(max_nodes=8, activations=True))
    def collect(case) -> None:
        graph, _ = case
        fired.append(graph_rewrite(graph, SEMANTIC) is not graph)

    collect()
    assert sum(fired) >= 20, f"{sum(fired)} of {len(fired)}"


@pytest.mark.parametrize("read_later", [False, True])
def test_one_fresh_symbol_for_two_outputs_of_the_root(read_later) -> None:
    """A replacement may give the same new symbol for two outputs of the matched node
    (here both statistics of a layer_norm become mean(x)): every reader and graph output
    of either reads it."""
    b = GraphBuilder()
    x = b.input((2, 4), name="x")
    y, mean, inv = b.exec(ops.layer_norm(axes=(1,)), x, name="ln")
    graph = b.build([b.exec(ops.ewsum(), mean, inv)] if read_later else [y, mean, inv])

    def replace(m):
        z = m.exec(ops.reduce_mean(axes=(1,)), m["x"])
        return m.exec(ops.relu(), m["x"]), z, z

    new = graph_rewrite(graph, [Rule(Pat.op("layer_norm", Pat.var("x")), replace)])
    verify(new)
    xv = np.arange(-3, 5, dtype=np.float32).reshape(2, 4)
    m = xv.mean(axis=1, keepdims=True)  # by hand
    want = [2 * m] if read_later else [np.maximum(xv, 0), m, m]
    got = interpret(new, xv)
    for g, w in zip(got if isinstance(got, tuple) else [got], want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)
