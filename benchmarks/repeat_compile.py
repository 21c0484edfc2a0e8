"""Compile time of deep transformers: ``Repeat`` (one ``scan``) against unrolled blocks.

Issue 28's must-hold: a 48-block ``Repeat`` transformer compiles in at most 1.5x the
time of a 4-block one; an unrolled 48-block model's time is reported beside it.

The model: a dense input projection, ``depth`` pre-LayerNorm transformer blocks
(``x + attn(ln(x))``, then ``x + W2 relu(W1 ln(x))`` with ``W1`` 4x wide; multi-head
self-attention with q/k/v/out projections), a dense head, a mean-squared-error loss and
Adam. The blocks are either ``Repeat(block, depth)`` or ``Sequential`` of ``depth``
fresh blocks (the unrolled model, the same parameter ids per block).

What is timed, per model: a fresh model object's ``Model.compile`` (graph build,
parameter initialisation) plus its first ``Model.fit`` (graph build in training mode,
``backward`` and ``minimize`` passes, the scan bodies' derivation, JAX trace and XLA
compile, one step run), blocked on the loss. Before each timing JAX's in-memory caches
(``jax.clear_caches``) and fnnc's caches of scan bodies are cleared, so no run reuses
another's work. Reported: the median of ``--runs`` timings per model (the runs of the
four models interleave, so a slow spell of a shared machine hits all alike), after one
untimed warm-up compile of each 4-block model.

Run: python benchmarks/repeat_compile.py [--runs 3] [--width 32] [--no-unrolled-48]
[--check] (``--check`` exits 1 when Repeat 48 / Repeat 4 > 1.5).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fnnc.models import (
    Add,
    Dense,
    Input,
    LayerNorm,
    Model,
    MultiHeadAttention,
    ReLU,
    Repeat,
    Sequential,
)

LIMIT = 1.5
"""Largest Repeat 48 / Repeat 4 compile-time ratio the must-hold allows."""


def block(width: int, heads: int) -> Model:
    """One pre-LN transformer block ``[B, S, width] -> [B, S, width]``."""
    x = Input()
    h = Add()(x, MultiHeadAttention(heads, name="attn")(LayerNorm(name="ln1")(x)))
    m = Dense(width, name="fc2")(ReLU()(Dense(4 * width, name="fc1")(LayerNorm(name="ln2")(h))))
    return Model(x, Add()(h, m), name="block")


def transformer(depth: int, *, repeat: bool, width: int = 32, heads: int = 4) -> Model:
    """The benchmark model with ``depth`` blocks, scanned (``repeat``) or unrolled."""
    if repeat:
        blocks = Repeat(lambda: block(width, heads), depth, name="blocks")
    else:
        blocks = Sequential([block(width, heads) for _ in range(depth)], name="blocks")
    x = Input()
    return Model(x, Dense(width, name="head")(blocks(Dense(width, name="embed")(x))))


def _loss(ys, ts):
    return jnp.mean((ys[0] - ts[0]) ** 2)


def _clear_caches() -> None:
    """Forgets fnnc's compiled programs and scan bodies: an equal graph compiles anew."""
    from fnnc.graph.compile import _compile_cached
    from fnnc.graph.scan import scan_bodies
    from fnnc.ops.scan import _check_scan

    _compile_cached.cache_clear()
    scan_bodies.cache_clear()
    _check_scan.cache_clear()


def compiled(make: Callable[[], Model], x: np.ndarray) -> tuple[float, Model]:
    """Seconds of ``compile`` + first ``fit`` of a fresh ``make()`` (module doc), and the
    fitted model (its ``engine._last_fit.program`` is the compiled training step)."""
    _clear_caches()
    model = make()
    start = time.perf_counter()
    model.compile(x, loss=_loss, minimizer=optax.adam(1e-3))
    jax.block_until_ready(model.fit(x, x))
    return time.perf_counter() - start, model


def compile_seconds(make: Callable[[], Model], x: np.ndarray) -> float:
    """Seconds of ``compile`` + first ``fit`` of a fresh ``make()`` (module doc)."""
    return compiled(make, x)[0]


def measure(makers: dict[str, Callable[[], Model]], x: np.ndarray, runs: int) -> dict[str, float]:
    """Median compile seconds per model, the runs interleaved across models, after one
    untimed compile of the 4-block and the Repeat models (JAX's one-time costs:
    utilities, and the initialisers of each parameter shape, which a Repeat's
    ``[n, ...]`` stacks have per depth; the unrolled 48 is too slow to warm)."""
    for name, make in makers.items():
        if name.endswith("-4") or name.startswith("repeat"):
            compile_seconds(make, x)
    samples: dict[str, list[float]] = {k: [] for k in makers}
    for _ in range(runs):
        for name, make in makers.items():
            samples[name].append(compile_seconds(make, x))
    return {k: statistics.median(v) for k, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=8)
    p.add_argument("--no-unrolled-48", action="store_true", help="skip the slowest model")
    p.add_argument("--check", action="store_true", help=f"exit 1 if the ratio > {LIMIT}")
    args = p.parse_args(argv)
    x = np.random.default_rng(0).normal(size=(args.batch, args.seq, args.width))
    x = x.astype(np.float32)
    w = args.width
    makers = {
        "repeat-4": lambda: transformer(4, repeat=True, width=w),
        "repeat-48": lambda: transformer(48, repeat=True, width=w),
        "unrolled-4": lambda: transformer(4, repeat=False, width=w),
    }
    if not args.no_unrolled_48:
        makers["unrolled-48"] = lambda: transformer(48, repeat=False, width=w)
    times = measure(makers, x, args.runs)
    print(f"compile + first fit, median of {args.runs} ({jax.default_backend()}, width {w}):")
    for name, seconds in times.items():
        print(f"  {name:12s} {seconds:8.2f} s")
    ratio = times["repeat-48"] / times["repeat-4"]
    print(f"  repeat-48 / repeat-4     {ratio:.2f}  (must be <= {LIMIT})")
    print(f"  unrolled-4 / repeat-4    {times['unrolled-4'] / times['repeat-4']:.2f}")
    if "unrolled-48" in times:
        print(f"  unrolled-48 / unrolled-4 {times['unrolled-48'] / times['unrolled-4']:.2f}")
        print(f"  unrolled-48 / repeat-48  {times['unrolled-48'] / times['repeat-48']:.2f}")
    if args.check and ratio > LIMIT:
        print(f"FAIL: repeat-48 compiles {ratio:.2f}x the time of repeat-4 (> {LIMIT})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
