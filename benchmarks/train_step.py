"""Passes benchmark: is a training step built by the graph passes as fast as hand-written JAX?

1. ``compile(minimize(trace(loss)))`` vs a hand-written
   ``jax.jit(value_and_grad + optax update)`` in the same run, for the MLP
   (784-256-256-10, batch 128; SGD and Adam), a CNN with BatchNorm and a transformer
   block. Target: ratio of medians <= 1.05 on CPU.
2. Host time of ``backward`` + ``simplify`` on graphs of about 1k, 5k and 20k nodes.
   Target: linear, 20k under 5 s.

Run: python benchmarks/train_step.py [--quick]

``--check [--limit 1.10]`` (seconds): only the MLP step with SGD, the median of
same-round ratios over interleaved rounds; exits 1 above the limit. A timing, so it
stays out of the test suite.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from benchmarks._timing import check_ratio, round_ratios, samples_of
from benchmarks.graph_overhead import CNN, MLP, chain
from fnnc import config
from fnnc.graph import compile, trace
from fnnc.graph.passes import simplify
from fnnc.graph.passes.backward import backward
from fnnc.graph.passes.minimize import minimize


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=4)(h, h)
        h = nn.LayerNorm()(x)
        return x + nn.Dense(128)(jax.nn.gelu(nn.Dense(512)(h)))


def _xent(logits, labels):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))


def compare(name, loss, params, batch, optimizer, rounds):
    """Median step times of the fnnc step and the hand-written step, same run; returns
    the same-round ratios."""
    graph = trace(loss, params, *batch)
    n = len(jax.tree.leaves(params))
    wrt = [graph.symbols[i] for i in graph.inputs[:n]]
    step_graph, layout = minimize(graph, graph.outputs[0], wrt, optimizer)
    step_graph = simplify(step_graph)
    program = compile(step_graph)

    @jax.jit
    def reference(params, state, *batch):
        value, grads = jax.value_and_grad(loss)(params, *batch)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    leaves = jax.tree.leaves(params)
    state_leaves = layout.init(leaves)
    ref_state = optimizer.init(params)
    ours = program(*leaves, *state_leaves, *batch)
    theirs = reference(params, ref_state, *batch)
    diff = abs(float(ours[-1]) - float(theirs[-1]))
    samples = samples_of(
        {
            "jit": lambda: reference(params, ref_state, *batch),
            "fnnc": lambda: program(*leaves, *state_leaves, *batch),
        },
        rounds=rounds,
        inner=10,
    )
    t = {k: statistics.median(v) for k, v in samples.items()}
    print(
        f"{name:<22} jax.jit {t['jit'] * 1e3:8.3f} ms   fnnc {t['fnnc'] * 1e3:8.3f} ms   "
        f"ratio {t['fnnc'] / t['jit']:.3f}   (|loss diff| {diff:.1e}, "
        f"{len(step_graph.nodes)} nodes)"
    )
    return round_ratios(samples, "fnnc", "jit")


def nnx_loss(model):
    graphdef, state = nnx.split(model)

    def loss(state, x, y):
        return _xent(nnx.merge(graphdef, state)(x), y)

    return loss, state


def host_times(sizes):
    x = jnp.ones((4, 4))
    for n in sizes:
        f = chain(n)
        with config.override(checks=False):
            graph = trace(lambda a, b, f=f: jnp.sum(f(a, b)), x, x)
            t0 = time.perf_counter()
            grad_graph, _ = backward(graph, graph.outputs[0], [graph.symbols[graph.inputs[0]]])
            t1 = time.perf_counter()
            simple = simplify(grad_graph)
            t2 = time.perf_counter()
        print(
            f"{len(graph.nodes):>6} forward nodes -> {len(grad_graph.nodes):>6} with backward -> "
            f"{len(simple.nodes):>6} simplified: backward {t1 - t0:5.2f} s  simplify "
            f"{t2 - t1:5.2f} s  ({1e6 * (t2 - t0) / len(grad_graph.nodes):.0f} us/node)"
        )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--check", action="store_true", help="MLP sgd ratio only; exit 1 above")
    parser.add_argument("--limit", type=float, default=1.10, help="--check's limit (1.10)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (9; 3 quick; 15 check)")
    args = parser.parse_args()
    rounds = args.rounds or (15 if args.check else 3 if args.quick else 9)
    print(f"platform {jax.default_backend()}")
    key = jax.random.key(0)
    x, y = jax.random.normal(key, (128, 784)), jax.random.randint(key, (128,), 0, 10)
    loss, state = nnx_loss(MLP(nnx.Rngs(0)))
    ratios = compare("MLP sgd", loss, state, (x, y), optax.sgd(0.01), rounds)
    if args.check:
        sys.exit(0 if check_ratio("train_step.py MLP sgd", ratios, args.limit) else 1)
    compare("MLP adam", loss, state, (x, y), optax.adam(1e-3), rounds)
    loss, state = nnx_loss(CNN(nnx.Rngs(0)))
    compare("CNN adam", loss, state, (jnp.ones((32, 28, 28, 1)), y[:32]), optax.adam(1e-3), rounds)
    block = Block()
    xb = jax.random.normal(key, (8, 64, 128))
    params = block.init(key, xb)
    compare(
        "transformer block adam",
        lambda p, x: jnp.mean(block.apply(p, x) ** 2),
        params,
        (xb,),
        optax.adam(1e-3),
        rounds,
    )
    host_times([1000, 5000] if args.quick else [1000, 5000, 20000])


if __name__ == "__main__":
    main()
