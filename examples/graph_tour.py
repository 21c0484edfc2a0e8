"""A tour of fnnc's symbolic graph: build, trace, print, interpret, compile, measure.

Run: python examples/graph_tour.py
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from fnnc import ops
from fnnc.graph import GraphBuilder, compile, interpret, to_dot, trace


def by_hand() -> None:
    """NNC's autograd example, built one command at a time."""
    print("== a graph built by hand: z = x*x + log(1/x) ==")
    b = GraphBuilder()
    x = b.input((), name="x")
    w = b.exec(ops.ewprod(), x, x, name="w")
    u = b.exec(ops.ewdiv(), b.constant(np.float32(1.0)), x, name="u")
    z = b.exec(ops.ewsum(), w, b.exec(ops.ewlog(), u, name="v"), name="z")
    graph = b.build([z])
    print(graph)
    x0 = np.float32(0.84)
    print(f"interpret: {float(interpret(graph, x0)):.9f}")
    print(f"compile:   {float(compile(graph)(x0)):.9f}   (NNC: 0.879953387)")
    print(f"graphviz:  {len(to_dot(graph).splitlines())} lines of dot\n")


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(16, 32, rngs=rngs)
        self.fc2 = nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.softmax(self.fc2(jax.nn.relu(self.fc1(x))))


def traced() -> None:
    """A Flax NNX MLP traced into a graph, with its parameters as graph inputs."""
    print("== a Flax NNX MLP, traced ==")
    model = MLP(nnx.Rngs(0))
    graphdef, params = nnx.split(model)

    def forward(params, x):
        return nnx.merge(graphdef, params)(x)

    x = jax.random.normal(jax.random.key(1), (8, 16))
    graph = trace(forward, params, x)
    print(graph)
    program = compile(graph)
    want = forward(params, x)
    got_i, got_c = interpret(graph, params, x), program(params, x)
    print(f"max |interpret - flax| = {float(jnp.max(jnp.abs(got_i - want))):.2e}")
    print(f"max |compile - flax|   = {float(jnp.max(jnp.abs(got_c - want))):.2e}")
    print("backends:", sorted({b for _, _, b in program.backends}))
    print("memory report (bytes):")
    print(program.memory())


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    by_hand()
    traced()
