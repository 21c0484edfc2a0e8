"""Tutorial: write your own graph pass and run it on a traced Flax model.

A pass is a pure function ``Graph -> Graph``. Graphs are frozen records (symbols,
nodes, inputs, outputs), so a pass reads the nodes, builds a new tuple of nodes with
``dataclasses.replace``, and returns a new graph, or the same object when nothing
changed, which lets pipelines detect a fixpoint with ``is``.

This pass finds the exact GELU that ``jax.nn.gelu(x, approximate=False)`` traces to,

    h = mul(0.5, x);  t = mul(scalar_mul[-1](x), 1/sqrt(2));  e = ewerfc(t);  y = mul(h, e)

and replaces the last node by ``gelu[approximate=True](x)``, writing the same output
symbol. The rest of the old chain is now dead; ``dce`` removes it.

Run: python examples/custom_pass.py
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from fnnc import ops
from fnnc.graph import Graph, Node, compile, dce, interpret, run_passes, simplify, trace, verify


def _constant(graph: Graph, sid: int) -> float | None:
    """The value of a scalar constant symbol, else None."""
    node = graph.nodes[graph.producers[sid]] if sid in graph.producers else None
    if node is None or node.cmd.name != "constant":
        return None
    value = node.cmd.param("value")
    return float(value.numpy().reshape(-1)[0]) if value.size == 1 else None


def _producer(graph: Graph, sid: int, name: str) -> Node | None:
    """The node writing ``sid`` if it runs the command ``name``."""
    index = graph.producers.get(sid)
    node = graph.nodes[index] if index is not None else None
    return node if node is not None and node.cmd.name == name else None


def _scaled(graph: Graph, sid: int, scale: float) -> int | None:
    """If ``sid`` is ``mul(c, x)`` or ``mul(x, c)`` with constant c == scale, return x."""
    node = _producer(graph, sid, "mul")
    if node is None:
        return None
    for const, other in (node.inputs, node.inputs[::-1]):
        value = _constant(graph, const)
        if value is not None and math.isclose(value, scale, rel_tol=1e-6):
            return other
    return None


def _exact_gelu_input(graph: Graph, node: Node) -> int | None:
    """If ``node`` is the final mul of an exact GELU, the symbol it applies GELU to."""
    if node.cmd.name != "mul":
        return None
    for half, erfc_out in (node.inputs, node.inputs[::-1]):
        x = _scaled(graph, half, 0.5)
        erfc = _producer(graph, erfc_out, "ewerfc")
        if x is None or erfc is None:
            continue
        neg = _scaled(graph, erfc.inputs[0], 1 / math.sqrt(2))
        neg_node = _producer(graph, neg, "scalar_mul") if neg is not None else None
        if neg_node is not None and neg_node.cmd.param("a") == -1.0 and neg_node.inputs[0] == x:
            return x
    return None


def approximate_gelu(graph: Graph) -> Graph:
    """Replaces every exact GELU (erf form) by its tanh approximation.

    Needs: nothing. Guarantees: output specs unchanged; values change by the
    approximation error (about 1e-3 at most).
    """
    nodes = list(graph.nodes)
    for index, node in enumerate(graph.nodes):
        x = _exact_gelu_input(graph, node)
        if x is not None:
            nodes[index] = dataclasses.replace(node, cmd=ops.gelu(approximate=True), inputs=(x,))
    if nodes == list(graph.nodes):
        return graph
    return dce(dataclasses.replace(graph, nodes=tuple(nodes)))


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(16, 64, rngs=rngs)
        self.l2 = nnx.Linear(64, 64, rngs=rngs)
        self.l3 = nnx.Linear(64, 4, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jax.nn.gelu(self.l1(x), approximate=False)
        x = jax.nn.gelu(self.l2(x), approximate=False)
        return self.l3(x)


def count(graph: Graph, name: str) -> int:
    return sum(n.cmd.name == name for n in graph.nodes)


def main() -> dict[str, float]:
    model = MLP(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (8, 16))
    graph = trace(model, x)
    print(
        f"traced: {len(graph.nodes)} nodes, {count(graph, 'ewerfc')} ewerfc, "
        f"{count(graph, 'gelu')} gelu"
    )
    # run_passes verifies after each pass (checks are on by default) and can print stages.
    rewritten = run_passes(graph, (approximate_gelu, simplify))
    verify(rewritten)
    print(
        f"after approximate_gelu + simplify: {len(rewritten.nodes)} nodes, "
        f"{count(rewritten, 'ewerfc')} ewerfc, {count(rewritten, 'gelu')} gelu"
    )
    print(rewritten)
    exact = model(x)
    approx = compile(rewritten)(x)
    err = float(jnp.max(jnp.abs(approx - exact)))
    print(f"max |approximate - exact| = {err:.2e}")
    same = float(jnp.max(jnp.abs(interpret(rewritten, x) - approx)))
    print(f"interpret vs compile of the rewritten graph: {same:.1e}")
    assert approximate_gelu(rewritten) is rewritten, "a pass returns its input when nothing changes"
    return {"error": err, "gelu": count(rewritten, "gelu"), "erfc": count(rewritten, "ewerfc")}


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    np.set_printoptions(precision=4)
    main()
