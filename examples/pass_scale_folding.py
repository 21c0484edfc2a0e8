"""Tutorial: two rewrites in a few lines each, as a pattern and a replacement.

1. Fold a scale into the following gemm: ``gemm(c * x, w, [bias])`` with a scalar
   constant ``c`` becomes ``gemm(x, c * w, [bias])`` (the bias is not scaled, as
   before). On a model whose weights are constants, ``fold`` then turns ``c * w`` into
   a constant: the scale costs nothing at inference.
2. relu to leaky relu.

Each is a :class:`fnnc.graph.Rule`: a :class:`fnnc.graph.Pat` (``...`` lets the gemm
have a bias or not; ``m.rest`` holds it) and a replacement that builds the new nodes
with ``m.exec``. :func:`fnnc.graph.graph_rewrite` runs them to a fixpoint.

Run: python examples/pass_scale_folding.py
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from fnnc import ops
from fnnc.graph import Pat, Rule, check_pass, graph_rewrite, interpret, rewrite_pass, trace

# -- the two rewrites: all the user code ------------------------------------------------
scaled = Pat.op("mul", Pat.const(name="c", shape=()), Pat.var("x"))
fold_scale = Rule(
    Pat.op("gemm", scaled, Pat.var("w"), ...),
    lambda m: m.exec(
        m.root.cmd, m["x"], m.exec(ops.scalar_mul(a=float(m.value("c"))), m["w"]), *m.rest
    ),
)
relu_to_leaky = Rule(
    Pat.op("relu", Pat.var("x")), lambda m: m.exec(ops.leaky_relu(negative_slope=0.01), m["x"])
)
# ----------------------------------------------------------------------------------------


def layer(x, w, b):
    return jax.nn.relu((0.5 * x) @ w.T + b[None, :])


def main() -> dict[str, float]:
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (5, 3), (5,)))
    graph = trace(layer, x, w, b)
    print(graph)
    new = graph_rewrite(graph, [fold_scale, relu_to_leaky])
    print(new)
    z = x @ (0.5 * w).T + b  # by hand, in NumPy
    want = np.where(z > 0, z, 0.01 * z)
    got = np.asarray(interpret(new, x, w, b))
    err = float(np.max(np.abs(got - want)))
    print(f"max |rewritten - NumPy| = {err:.1e}")
    check = check_pass(rewrite_pass(fold_scale, name="fold_scale"), graph)
    print(f"check_pass(fold_scale): {check.dtype}, max difference {check.max_error:.1e}")
    names = [n.cmd.name for n in new.nodes]
    return {"error": err, "nodes": names, "check": check.max_error}


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    main()
