"""Step time of the digits CNN: 1 vs 4 virtual CPU devices, bfloat16 and float16 vs float32.

float16 runs with dynamic loss scaling (the default for ``precision="float16"``: the
scaled backward, the finiteness check and the skip-or-apply select inside the step).

Each device count runs in its own subprocess (JAX fixes the count at start-up), in
the same run, so the ratio compares like with like; every figure is the median of
``--repeats`` timings of ``--steps`` fused steps after a warm-up (compile) step.

    python benchmarks/scale.py [--batch 64] [--steps 20] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(devices: int, precision: str, batch: int, steps: int, repeats: int) -> float:
    """Median seconds per step in this process."""
    sys.path.insert(0, str(ROOT / "examples"))
    import jax
    from digits import load, make_model

    from fnnc.models import minimizers

    (xs, ys), _ = load()
    model = make_model()
    if devices > 1:
        model.set_data_parallel(devices)
    model.compile([xs[:batch]], loss="softmax_crossentropy", minimizer=minimizers.adam(3e-3),
                  precision=precision)  # fmt: skip
    x, y = xs[:batch], ys[:batch]
    jax.block_until_ready(model.fit(x, y))  # compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            loss = model.fit(x, y)
        jax.block_until_ready(loss)
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times)


def child(devices: int, precision: str, args: argparse.Namespace) -> float:
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")  # fmt: skip
    sizes = ["--batch", str(args.batch), "--steps", str(args.steps), "--repeats", str(args.repeats)]
    cmd = [sys.executable, __file__, "--child", str(devices), "--precision", precision, *sizes]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["step_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="float32", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        step = measure(args.child, args.precision, args.batch, args.steps, args.repeats)
        print(json.dumps({"step_s": step}))
        return
    rows = {
        "1 device, float32": child(1, "float32", args),
        "4 devices, float32": child(4, "float32", args),
        "1 device, bfloat16": child(1, "bfloat16", args),
        "1 device, float16+scaling": child(1, "float16", args),
    }
    for name, s in rows.items():
        print(f"{name:>26}: {s * 1e3:8.2f} ms/step (median of {args.repeats})")
    one = rows["1 device, float32"]
    print(f"4 devices / 1 device: {rows['4 devices, float32'] / one:.2f}x step time")
    print(f"bfloat16 / float32:   {rows['1 device, bfloat16'] / one:.2f}x step time")
    print(f"float16+scaling / float32: {rows['1 device, float16+scaling'] / one:.2f}x step time")


if __name__ == "__main__":
    main()
