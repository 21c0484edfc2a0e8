"""Foundation benchmark: does lowering through the fnnc graph cost anything?

1. Forward step of ``compile(trace(f))`` vs ``jax.jit(f)`` in the same run, for the MLP
   (784-256-256-10, batch 128) and a Flax NNX CNN with BatchNorm and pooling.
   Target: ratio of medians <= 1.02.
2. Host time of trace, verify and compile for graphs of 1k, 5k and 20k nodes.
   Target: 5k under 2 s, linear in node count.

Run: python benchmarks/graph_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
from flax import nnx

from benchmarks._timing import interleaved
from fnnc import config
from fnnc.graph import compile, trace, verify


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(784, 256, rngs=rngs)
        self.l2 = nnx.Linear(256, 256, rngs=rngs)
        self.l3 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x):
        return self.l3(jax.nn.relu(self.l2(jax.nn.relu(self.l1(x)))))


class CNN(nnx.Module):
    def __init__(self, rngs):
        self.c1 = nnx.Conv(1, 32, (3, 3), rngs=rngs)
        self.b1 = nnx.BatchNorm(32, use_running_average=True, rngs=rngs)
        self.c2 = nnx.Conv(32, 64, (3, 3), rngs=rngs)
        self.b2 = nnx.BatchNorm(64, use_running_average=True, rngs=rngs)
        self.fc = nnx.Linear(7 * 7 * 64, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.max_pool(jax.nn.relu(self.b1(self.c1(x))), (2, 2), (2, 2))
        x = nnx.avg_pool(jax.nn.relu(self.b2(self.c2(x))), (2, 2), (2, 2))
        return self.fc(x.reshape(x.shape[0], -1))


def forward_ratio(name, model, x, rounds):
    graphdef, state = nnx.split(model)

    def f(state, x):
        return nnx.merge(graphdef, state)(x)

    jitted = jax.jit(f)
    program = compile(trace(f, state, x))
    leaves = jax.tree.leaves(state)
    flat = lambda: program(*leaves, x)
    err = float(jnp.max(jnp.abs(flat() - jitted(state, x))))
    t = interleaved({"jit": lambda: jitted(state, x), "fnnc": flat}, rounds=rounds, inner=20)
    print(
        f"{name:<4} forward: jax.jit {t['jit'] * 1e6:8.1f} us   fnnc {t['fnnc'] * 1e6:8.1f} us   "
        f"ratio {t['fnnc'] / t['jit']:.3f}   (max abs diff {err:.1e})"
    )


def chain(n_nodes):
    def f(x, y):
        for _ in range(n_nodes // 4):
            x = jnp.tanh(x * y + 0.5) - y * 0.25
        return x

    return f


def host_times(sizes):
    """Host seconds to trace, verify and compile; jax.jit's lower + compile of the same fn."""
    x = jnp.ones((4, 4))
    for n in sizes:
        f = chain(n)
        t0 = time.perf_counter()
        lowered = jax.jit(f).lower(x, x)
        t1 = time.perf_counter()
        lowered.compile()
        t2 = time.perf_counter()
        with config.override(checks=False):
            graph = trace(f, x, x)
        t3 = time.perf_counter()
        verify(graph)
        t4 = time.perf_counter()
        program = compile(graph)
        t5 = time.perf_counter()
        jax.block_until_ready(program(x, x))
        ours, theirs = t5 - t2, t2 - t0
        per_node = 1e6 * (t4 - t2) / len(graph.nodes)
        print(
            f"{len(graph.nodes):>6} nodes: trace {t3 - t2:5.2f} s  verify {t4 - t3:5.2f} s  "
            f"compile {t5 - t4:5.2f} s  total {ours:5.2f} s | jax.jit lower {t1 - t0:5.2f} s  "
            f"compile {t2 - t1:5.2f} s  total {theirs:5.2f} s | ratio {ours / theirs:4.2f}  "
            f"(trace+verify {per_node:.0f} us/node)"
        )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer rounds, smaller graphs")
    args = parser.parse_args()
    rounds = 3 if args.quick else 9
    print(f"platform {jax.default_backend()}, {jax.device_count()} device(s)")
    forward_ratio("MLP", MLP(nnx.Rngs(0)), jnp.ones((128, 784)), rounds)
    forward_ratio("CNN", CNN(nnx.Rngs(0)), jnp.ones((32, 28, 28, 1)), rounds)
    host_times([1000, 5000] if args.quick else [1000, 5000, 20000])


if __name__ == "__main__":
    main()
