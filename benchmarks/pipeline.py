"""Training-step time of a residual MLP stack as a GPipe pipeline on 4 virtual CPU devices.

One SGD step (forward, backward, update) of ``--blocks`` residual MLP blocks over a batch
of ``--batch`` rows, on a ``("stage": S, "data": 4 / S)`` mesh for S = 1, 2, 4, each with
``--microbatches`` microbatches, beside the same blocks as one ``scan`` on a 4-way data
mesh (the baseline, measured in the same run), and one stage with one microbatch (the
schedule's own cost beside the scan). Each stage count also prints the bubble share
``(S - 1) / (M + S - 1)`` of its schedule. Every figure is the median of several timed
blocks of steps (:func:`benchmarks._timing.median_time`).

Virtual CPU devices share the host's cores, so these numbers show the schedule's
overheads (the bubble, the loop over small microbatches, the permutes), not a speed-up:
that needs devices that run in parallel.

    python benchmarks/pipeline.py [--blocks 8] [--width 128] [--batch 64] [--microbatches 8]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __name__ == "__main__":  # JAX fixes the device count when it starts
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from benchmarks._timing import median_time
from fnnc import ops
from fnnc.graph import GraphBuilder, Shardings, compile, minimize, pipeline, scan


def _block(rows: int, width: int):
    b = GraphBuilder()
    h = b.input((rows, width), name="h")
    w1, w2 = b.input((2 * width, width), name="w1"), b.input((width, 2 * width), name="w2")
    up = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), h, w1))
    return b.build([b.exec(ops.ewsum(), h, b.exec(ops.gemm(transpose_b=True), up, w2))])


def step_graph(args: argparse.Namespace, stages: int | None, micro: int = 1):
    """An SGD step of the stack: as a scan (``stages=None``) or a pipeline of ``stages``."""
    n, width, batch = args.blocks, args.width, args.batch
    b = GraphBuilder()
    x, y = b.input((batch, width), name="x"), b.input((batch, width), name="y")
    stacked = [b.input((n, 2 * width, width), name="w1"), b.input((n, width, 2 * width), name="w2")]
    if stages is None:
        (h,) = scan(b, _block(batch, width), [x], stacked, name="blocks")
    else:
        body = _block(batch // micro, width)
        (h,) = pipeline(b, body, [x], stacked, stages=stages, microbatches=micro)
    diff = b.exec(ops.add(q=-1.0), h, y)
    loss = b.exec(ops.reduce_mean(axes=(0, 1)), b.exec(ops.ewprod(), diff, diff))
    return minimize(b.build([loss]), loss, stacked, optax.sgd(1e-3))


def step_time(args: argparse.Namespace, stages: int | None, micro: int = 1) -> float:
    step, layout = step_graph(args, stages, micro)
    s = stages or 1
    mesh = jax.make_mesh((s, 4 // s), ("stage", "data"))
    params = (P("stage"),) * 2 if stages else (P(),) * 2
    ins = params + (P(),) * layout.n_state + (P("data"), P("data"))
    program = compile(step, shardings=Shardings(mesh, ins, (*ins[:-2], P())))
    rng = np.random.default_rng(0)
    w = [rng.normal(scale=0.05, size=tuple(step.spec(i).shape)) for i in step.inputs[:2]]
    w = [a.astype(np.float32) for a in w]
    data = [rng.normal(size=(args.batch, args.width)).astype(np.float32) for _ in range(2)]
    state = layout.init(w)
    return median_time(lambda: program(*w, *state, *data), repeats=args.repeats, inner=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if jax.device_count() < 4:
        sys.exit(f"needs 4 devices, JAX sees {jax.device_count()}: run it as a script")
    base = step_time(args, None)
    m = args.microbatches
    print(f"{args.blocks} blocks, width {args.width}, batch {args.batch}, {m} microbatches")
    print(f"{'scan, data 4':<34} {base * 1e3:8.2f} ms/step  1.00x")
    for stages, micro in ((1, 1), (1, m), (2, m), (4, m)):
        t = step_time(args, stages, micro)
        bubble = (stages - 1) / (micro + stages - 1)
        name = f"pipeline, stage {stages} x data {4 // stages}, {micro} mb"
        print(f"{name:<34} {t * 1e3:8.2f} ms/step  {t / base:.2f}x  bubble {bubble:.0%}")


if __name__ == "__main__":
    main()
