"""Command attributes the passes read (issue 11), found missing by the audit12 issD
review: fill_if_less_than is elementwise (fused chains take it), cmul without
conjugate is commutative (cse merges cmul(a, b) with cmul(b, a)). Oracle: interpret of
the graph before the pass, and jax.grad through it."""

from __future__ import annotations

import jax
import numpy as np

from fnnc import ops
from fnnc.graph import GraphBuilder, compile, cse, fuse, interpret

RNG = np.random.default_rng(0)


def test_fill_if_less_than_joins_a_fused_chain_with_the_same_values_and_gradient():
    b = GraphBuilder()
    x, s, t = b.input((4, 8)), b.input((4, 8)), b.input((1, 8))
    y = b.exec(ops.ewexp(), b.exec(ops.fill_if_less_than(value=-1.0), b.exec(ops.relu(), x), s, t))
    graph = b.build([y])
    fused = fuse(graph)
    assert [n.cmd.name for n in fused.nodes] == ["fused_elementwise"]
    args = [RNG.standard_normal((4, 8)).astype(np.float32) for _ in range(2)]
    args.append(np.zeros((1, 8), np.float32))
    program = compile(fused)  # the Pallas kernel of such a chain: test_fused_elementwise
    np.testing.assert_allclose(program(*args), interpret(graph, *args), rtol=1e-6)
    got = jax.grad(lambda a: program(a, *args[1:]).sum())(args[0])
    want = jax.grad(lambda a: interpret(graph, a, *args[1:]).sum())(args[0])
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_cse_merges_cmul_in_either_order_but_not_the_conjugate():
    b = GraphBuilder()
    p, q = b.input((3, 4)), b.input((3, 4))
    outs = [
        b.exec(ops.cmul(), p, q),
        b.exec(ops.cmul(), q, p),
        b.exec(ops.cmul(conjugate=True), p, q),
        b.exec(ops.cmul(conjugate=True), q, p),
    ]
    graph = b.build(outs)
    merged = cse(graph)
    assert [n.cmd.name for n in merged.nodes].count("cmul") == 3
    args = [RNG.standard_normal((3, 4)).astype(np.float32) for _ in range(2)]
    for got, want in zip(interpret(merged, *args), interpret(graph, *args)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
