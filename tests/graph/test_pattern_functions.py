"""Patterns and replacements written as functions (traced): x * sigmoid(x) -> swish."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import GraphError
from fnnc.graph import GraphBuilder, interpret, pattern_of, replace_pattern, trace, traced_rule


def pattern(x):
    return x * jax.nn.sigmoid(x)


def replacement(x):
    return ops.swish()(x)


def test_silu_in_two_functions() -> None:
    def model(a, b):  # silu twice, once with the operands swapped, and a near miss
        return jnp.tanh(a * jax.nn.sigmoid(a)) + jax.nn.sigmoid(b) * b + a * jax.nn.sigmoid(b)

    graph = trace(model, jnp.ones((2, 3)), jnp.ones((2, 3)))
    new = replace_pattern(graph, pattern, replacement)
    names = [n.cmd.name for n in new.nodes]
    assert names.count("swish") == 2 and names.count("sigmoid") == 1
    a, b = np.random.default_rng(0).standard_normal((2, 2, 3)).astype(np.float32)

    def silu(v):  # by hand
        return v / (1 + np.exp(-v))

    want = np.tanh(silu(a)) + silu(b) + a / (1 + np.exp(-b))
    np.testing.assert_allclose(interpret(new, a, b), want, rtol=2e-6, atol=1e-6)
    assert replace_pattern(new, pattern, replacement) is new


def test_constants_and_shapes_follow_the_match() -> None:
    rule = traced_rule(lambda x: 2.0 * jnp.exp(x), lambda x: jnp.exp(x + np.log(2.0)))
    graph = trace(lambda v: 2.0 * jnp.exp(v) + 3.0 * jnp.exp(v), jnp.ones((5,)))
    from fnnc.graph import graph_rewrite

    new = graph_rewrite(graph, [rule])
    v = np.linspace(-1, 1, 5, dtype=np.float32)
    np.testing.assert_allclose(interpret(new, v), 5 * np.exp(v), rtol=1e-6)
    assert sum(n.cmd.name == "ewexp" for n in new.nodes) == 2  # one for 3*exp, one inlined
    assert "pattern" not in rule.label and "->" in rule.label


def test_pattern_errors() -> None:
    with pytest.raises(GraphError, match=r"arguments \['y'\] are not used"):
        pattern_of(lambda x, y: jnp.exp(x))
    with pytest.raises(GraphError, match="returns an argument unchanged"):
        pattern_of(lambda x: x)
    with pytest.raises(GraphError, match="returns one array"):
        pattern_of(lambda x: (jnp.exp(x), jnp.sin(x)))
    pat, names = pattern_of(pattern)
    assert names == ("x",) and pat.cmds == frozenset({"mul"})


def test_a_match_whose_constant_broadcasts_is_skipped() -> None:
    """``x * 2.0`` matches ``mul(x[1, 3], 2.0[2, 3])`` (scalar pattern constants match any
    shape) but ``x + x`` is ``[1, 3]``: that match is skipped, the fitting one replaced."""
    b = GraphBuilder()
    x = b.input((1, 3), name="x")
    wide = b.exec(ops.mul(), x, b.constant(np.full((2, 3), 2.0, np.float32)))
    same = b.exec(ops.mul(), x, b.constant(np.float32(2.0)))
    graph = b.build([wide, same])
    new = replace_pattern(graph, lambda v: v * 2.0, lambda v: v + v)
    assert [n.cmd.name for n in new.nodes if n.cmd.name != "constant"] == ["mul", "add"]
    xv = np.array([[1.0, -2.0, 3.0]], np.float32)
    got_wide, got_same = interpret(new, xv)
    np.testing.assert_array_equal(got_wide, np.broadcast_to(2 * xv, (2, 3)))  # by hand
    np.testing.assert_array_equal(got_same, 2 * xv)
    b = GraphBuilder()
    x = b.input((1, 3), name="x")
    only_wide = b.build([b.exec(ops.mul(), x, b.constant(np.full((2, 3), 2.0, np.float32)))])
    assert replace_pattern(only_wide, lambda v: v * 2.0, lambda v: v + v) is only_wide


def test_a_replacement_of_other_shapes_than_the_pattern_is_an_error() -> None:
    graph = trace(lambda v: jnp.exp(v) * 2.0, jnp.ones((2, 3)))
    with pytest.raises(GraphError, match=r"v: float32\[2, 3\] the replacement returns "):
        replace_pattern(graph, lambda v: v * 2.0, lambda v: jnp.sum(v, axis=0) * 2.0)
