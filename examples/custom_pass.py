"""Tutorial: write your own graph pass and run it on a traced Flax model.

A pass is a pure function ``Graph -> Graph``. fnnc writes one as data: a pattern and a
replacement, run to a fixpoint by :func:`fnnc.graph.graph_rewrite`. The pattern and the
replacement can be ordinary functions, traced (the torch.fx way):

    exact GELU  ``jax.nn.gelu(x, approximate=False)``
    ->  tanh GELU  ``ops.gelu(approximate=True)(x)``  (one fnnc ``gelu`` node)

``traced_rule`` traces the first function into a pattern over fnnc's commands (it is
five nodes: ``mul(0.5, x)``, ``scalar_mul[-1]``, ``mul(.., 1/sqrt 2)``, ``ewerfc``,
``mul``, and the two constants they read), and the second, traced on each match's
shapes, replaces it. The matched nodes left without readers are dropped: the MLP's two
GELUs go from 7 nodes each to one ``gelu``, 29 nodes to 17.

Then :func:`fnnc.graph.check_pass` runs the graph before and after the pass on random
inputs (float64) and reports the largest difference: the approximation's, here.

Run: python examples/custom_pass.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from fnnc import ops
from fnnc.graph import Graph, check_pass, compile, interpret, rewrite_pass, trace, traced_rule


def exact_gelu(x):
    return jax.nn.gelu(x, approximate=False)


def tanh_gelu(x):
    return ops.gelu(approximate=True)(x)


approximate_gelu = rewrite_pass(traced_rule(exact_gelu, tanh_gelu), name="approximate_gelu")


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
    # compile(passes=) runs the pass (verified, blamed by name if it breaks the graph,
    # its diff shown with FNNC_DEBUG=1) and compiles the result.
    program = compile(graph, passes=[approximate_gelu])
    rewritten = program.graph
    print(
        f"after approximate_gelu: {len(rewritten.nodes)} nodes, "
        f"{count(rewritten, 'ewerfc')} ewerfc, {count(rewritten, 'gelu')} gelu"
    )
    print(rewritten)
    exact = model(x)
    approx = program(x)
    err = float(jnp.max(jnp.abs(approx - exact)))
    print(f"max |approximate - exact| = {err:.2e}")
    same = float(jnp.max(jnp.abs(interpret(rewritten, x) - approx)))
    print(f"interpret vs compile of the rewritten graph: {same:.1e}")
    check = check_pass(approximate_gelu, graph, atol=5e-3, rtol=0, grads=False)
    print(f"check_pass ({check.dtype}): max difference {check.max_error:.1e}")
    assert approximate_gelu(rewritten) is rewritten, "a pass returns its input when nothing changes"
    return {"error": err, "gelu": count(rewritten, "gelu"), "erfc": count(rewritten, "ewerfc")}


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    np.set_printoptions(precision=4)
    main()
