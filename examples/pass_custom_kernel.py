"""Tutorial: a pattern that hands a matched subgraph to a custom kernel.

``relu(gemm(x, w, b))`` (a dense layer with its activation) becomes one node of a new
command, ``dense_relu``, defined here with its reference forward (its backward comes
from ``jax.vjp`` of it). A custom kernel for it is registered as a backend
(:func:`fnnc.ops.register_backend`): compiled programs run the node with it, and
``Program.backends`` says so. In a real project the kernel is a Pallas kernel; here it
is a ``lax.dot_general`` with the bias and the relu fused in one function.

Run: python examples/pass_custom_kernel.py
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc import ops
from fnnc.graph import GraphBuilder, Pat, Rule, compile, graph_rewrite, interpret


def _shape(x, w, b):
    return jax.ShapeDtypeStruct((x.shape[0], w.shape[0]), x.dtype)


def _define() -> None:
    if "dense_relu" in ops.registry():  # the tutorial may run twice in one process
        return

    @ops.defcommand(family="blas", shape=_shape)
    def dense_relu(x, w, b):
        """``relu(x @ w.T + b)``."""
        return jnp.maximum(x @ w.T + b[None, :], 0)


def kernel(x, w, b):
    y = lax.dot_general(x, w, (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST)
    return jnp.maximum(y + b[None, :], 0)


_define()
ops.register_backend("dense_relu", ops.Backend("my_kernel", kernel, ("cpu", "gpu"), priority=5))

dense = Pat.op("gemm", Pat.var("x"), Pat.var("w"), Pat.var("b"), transpose_b=True, name="fc")
to_kernel = Rule(
    Pat.op("relu", dense),
    lambda m: m.exec(ops.Command("dense_relu"), m["x"], m["w"], m["b"], name=m.node("fc").name),
    name="dense_relu",
)


def main() -> dict[str, object]:
    b = GraphBuilder()
    x, w1, b1 = b.input((4, 3), name="x"), b.input((8, 3), name="w1"), b.input((8,), name="b1")
    w2, b2 = b.input((2, 8), name="w2"), b.input((2,), name="b2")
    h = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w1, b1, name="fc1"))
    graph = b.build([b.exec(ops.gemm(transpose_b=True), h, w2, b2, name="fc2")])
    new = graph_rewrite(graph, [to_kernel])
    print(new)
    program = compile(new)
    print("backends:", [(label, backend) for _, label, backend in program.backends])
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s.shape).astype(np.float32) for s in graph.input_specs]
    xs, w1v, b1v, w2v, b2v = args
    want = np.maximum(xs @ w1v.T + b1v, 0) @ w2v.T + b2v  # by hand, in NumPy
    err = float(np.max(np.abs(np.asarray(program(*args)) - want)))
    ref = float(np.max(np.abs(np.asarray(interpret(new, *args)) - want)))
    print(f"compiled (custom kernel) vs NumPy: {err:.1e}; reference forward: {ref:.1e}")
    backends = {label: backend for _, label, backend in program.backends}
    return {"error": err, "reference_error": ref, "nodes": [n.cmd.name for n in new.nodes],
            "backend": backends.get("fc1")}  # fmt: skip


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    main()
