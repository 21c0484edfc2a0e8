"""check_pass: a right rewrite passes in float64 with gradients; a wrong one is caught at
its first differing node; a broken one is blamed by name."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import GraphError
from fnnc.graph import GraphBuilder, PassCheckError, Pat, Rule, check_pass, rewrite_pass, trace


def _layer():
    def layer(x, w):
        return jnp.tanh(jax.nn.relu((0.5 * x) @ w))

    return trace(layer, jnp.ones((2, 4)), jnp.ones((4, 3)))


def _fold_scale(factor: float, name: str):
    scaled = Pat.op("mul", Pat.const(name="c", shape=()), Pat.var("x"))
    return rewrite_pass(
        Rule(
            Pat.op("gemm", scaled, Pat.var("w"), ...),
            lambda m: m.exec(
                m.root.cmd,
                m["x"],
                m.exec(ops.scalar_mul(a=float(m.value("c")) * factor), m["w"]),
                *m.rest,
            ),
        ),
        name=name,
    )


def test_a_right_rewrite_passes_in_float64_with_gradients() -> None:
    check = check_pass(_fold_scale(1.0, "fold_scale"), _layer())
    assert check.dtype == "float64" and check.gradients
    assert check.max_error < 1e-12
    assert [n.cmd.name for n in check.graph.nodes] == ["scalar_mul", "gemm", "relu", "tanh"]


def test_a_wrong_rewrite_is_caught_at_its_first_differing_node() -> None:
    with pytest.raises(PassCheckError) as info:
        check_pass(_fold_scale(1.001, "fold_scale_wrong"), _layer())
    msg = str(info.value)
    # the gemm is where it shows: the scaled weight stands for nothing in the original
    assert "pass fold_scale_wrong changed the values: node 1 (gemm)" in msg
    assert ">>%2:f32[2,3] = gemm(%0, %" in msg and "scalar_mul[a=0.5005]" in msg


def test_a_wrong_gradient_is_caught() -> None:
    # relu(x) -> x + stop_gradient(max(x, 0) - x): the same values, gradient 1 everywhere
    sneaky = rewrite_pass(
        Rule(
            Pat.op("relu", Pat.var("x")),
            lambda m: m.call(lambda x: x + jax.lax.stop_gradient(jnp.maximum(x, 0) - x), m["x"]),
        ),
        name="straight_through",
    )
    with pytest.raises(PassCheckError, match="gradients: pass straight_through changed"):
        check_pass(sneaky, _layer())
    check_pass(sneaky, _layer(), grads=False)  # the forward alone agrees


def test_a_broken_graph_is_blamed_by_name() -> None:
    def reorders(g):
        return dataclasses.replace(g, nodes=g.nodes[::-1])

    with pytest.raises(GraphError, match=r"pass reorders \(round 1\) produced an invalid graph"):
        check_pass(reorders, _layer())

    def drops_output(g):
        return dataclasses.replace(g, outputs=())

    with pytest.raises(PassCheckError, match="changed the graph's signature"):
        check_pass(drops_output, _layer())
    with pytest.raises(GraphError, match=r"expected a pass then a Graph, got a Graph then a"):
        check_pass(_layer(), drops_output)  # the arguments swapped


def test_float32_when_a_command_has_no_float64() -> None:
    # given inputs keep their dtype: float32, with float32 tolerances
    graph = _layer()
    args = [np.ones((2, 4), np.float32), np.full((4, 3), 0.25, np.float32)]
    check = check_pass(_fold_scale(1.0, "fold_scale"), graph, args=args)
    assert check.dtype == "float32"


def _swap(old: str, new):
    """A pass that swaps every ``old`` command for ``new`` (a wrong rewrite)."""

    def swap(graph):
        nodes = tuple(
            dataclasses.replace(n, cmd=new) if n.cmd.name == old else n for n in graph.nodes
        )
        return dataclasses.replace(graph, nodes=nodes)

    swap.__name__ = f"{old}_to_{new.name}"
    return swap


def test_outputs_that_are_views_are_compared():
    """A graph output that is a view of a node's result is checked too, with no
    gradients to catch it (grads=False, and an integer graph)."""
    b = GraphBuilder()
    x = b.input((8,), name="x")
    e = b.exec(ops.ewexp(), x, name="e")
    g = b.build([b.alias(e, (4,), offset=(4,), name="v")])
    with pytest.raises(PassCheckError, match=r"ewexp_to_ewabs changed output 0"):
        check_pass(_swap("ewexp", ops.ewabs()), g, grads=False)
    b = GraphBuilder()
    x = b.input((8,), np.int32, name="x")
    t = b.exec(ops.add(), x, x, name="twice")
    g = b.build([b.alias(t, (4,), name="head")])
    with pytest.raises(PassCheckError, match=r"add_to_mul changed output 0"):
        check_pass(_swap("add", ops.mul()), g, args=[np.arange(8, dtype=np.int32)])


def test_zero_tolerances_mean_an_exact_check():
    """rtol=0, atol=0 are tolerances, not "use the defaults": a change of 5e-8 fails."""
    b = GraphBuilder()
    x = b.input((4,), name="x")
    g = b.build([b.exec(ops.scalar_mul(a=2.0), x, name="s")])

    def nudge(graph):
        nodes = tuple(dataclasses.replace(n, cmd=n.cmd.replace(a=2.0000001)) for n in graph.nodes)
        return dataclasses.replace(graph, nodes=nodes)

    assert check_pass(nudge, g).max_error > 0  # within the default tolerances
    with pytest.raises(PassCheckError, match=r"rtol 0, atol 0"):
        check_pass(nudge, g, rtol=0.0, atol=0.0)
