"""Timing helpers shared by the benchmarks: medians of several runs, same-run baselines."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax


def median_time(
    fn: Callable[[], Any], *, repeats: int = 7, inner: int = 20, warmup: int = 3
) -> float:
    """Median over ``repeats`` of the mean seconds per call of ``fn`` (blocked on its result)."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            out = fn()
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples)


def samples_of(
    fns: dict[str, Callable[[], Any]], *, rounds: int = 7, inner: int = 20
) -> dict[str, list[float]]:
    """Seconds per call of each fn, one sample per round, the fns alternating within
    each round (interleaving is fair on noisy machines: a slow spell hits every
    contender alike). The order rotates every round, so no contender always runs right
    after the same other one: with a fixed order, two identical compiled 2 ms programs
    (the MLP's, default and "tuned") timed 18% apart, the first of them always running
    right after torch."""
    for fn in fns.values():
        for _ in range(3):
            jax.block_until_ready(fn())
    samples: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = fns[name]
            start = time.perf_counter()
            for _ in range(inner):
                out = fn()
            jax.block_until_ready(out)
            samples[name].append((time.perf_counter() - start) / inner)
    return samples


def interleaved(
    fns: dict[str, Callable[[], Any]], *, rounds: int = 7, inner: int = 20
) -> dict[str, float]:
    """Median seconds per call of each fn, alternating between them each round
    (:func:`samples_of`)."""
    samples = samples_of(fns, rounds=rounds, inner=inner)
    return {k: statistics.median(v) for k, v in samples.items()}
