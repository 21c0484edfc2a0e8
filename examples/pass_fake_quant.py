"""Tutorial: fake-quant for int8 training, inserted around every gemm by a pass.

Quantization-aware training computes each gemm on int8-rounded operands while the
weights stay float: every gemm input goes through quantize-dequantize
``round(clip(x / s, -127, 127)) * s`` (``s = max|x| / 127``), and its gradient passes
straight through (``x + stop_gradient(qdq(x) - x)``, the straight-through estimator).

The pass uses :class:`fnnc.graph.Rewriter`, the editing API over the frozen graph:
``inserting_before(node)`` places new nodes, ``call(fn, ...)`` inserts a JAX function
(traced on the operand's shape), ``replace_node`` rewires the gemm, ``finish`` builds
one verified graph. ``Model.compile(passes=[fake_quant])`` applies it to the forward
graph before ``backward``, so training sees the quantized forward.

Run: python examples/pass_fake_quant.py
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fnnc.graph import Graph, Rewriter
from fnnc.models import Dense, Input, Model, ReLU


def fake_quant_int8(x):
    scale = jnp.max(jnp.abs(x)) / 127.0 + 1e-12
    q = jnp.clip(jnp.round(x / scale), -127, 127) * scale
    return x + jax.lax.stop_gradient(q - x)  # straight-through estimator


def fake_quant(graph: Graph) -> Graph:
    """Quantize-dequantize both operands of every gemm."""
    r = Rewriter(graph, name="fake_quant")
    for node in r.find("gemm"):
        with r.inserting_before(node):
            a, w = (r.call(fake_quant_int8, s) for s in node.inputs[:2])
        r.replace_node(node, node.cmd, a, w, *node.inputs[2:])
    return r.finish()


def qdq(x: np.ndarray) -> np.ndarray:
    """The same in NumPy, for checking."""
    s = np.abs(x).max() / 127.0 + 1e-12
    return np.clip(np.round(x / s), -127, 127) * s


def main(steps: int = 30) -> dict[str, float]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    y = (x[:, :2] * 0.5 - x[:, 2:4]).astype(np.float32)
    inp = Input()
    model = Model(inp, Dense(2, name="out")(ReLU()(Dense(16, name="hidden")(inp))))
    model.compile(x, loss="mse", minimizer=optax.adam(0.02), passes=[fake_quant])
    first = float(model.fit(x, y))
    for _ in range(steps - 1):
        loss = float(model.fit(x, y))
    print(f"fake-quant training: loss {first:.4f} -> {loss:.4f}")
    p = {k: np.asarray(v) for k, v in model.parameters().items()}
    h = np.maximum(qdq(x) @ qdq(p["t-hidden-0-0"]).T + p["t-hidden-0-1"], 0)
    want = qdq(h) @ qdq(p["t-out-0-0"]).T + p["t-out-0-1"]
    err = float(np.max(np.abs(np.asarray(model.evaluate(x)) - want)))
    print(f"evaluate vs quantized NumPy forward: {err:.1e}")
    return {"first_loss": first, "loss": loss, "error": err}


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    main()
