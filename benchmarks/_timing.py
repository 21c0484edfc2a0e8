"""Timing helpers shared by the benchmarks: medians of several runs, same-run baselines."""

from __future__ import annotations

import math
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


MIN_BLOCK = 0.05
"""Seconds a timed block lasts at least (short steps are repeated more): blocks of a few
ms timed 2 ms steps 30% apart from round to round."""


def samples_of(
    fns: dict[str, Callable[[], Any]], *, rounds: int = 7, inner: int = 20
) -> dict[str, list[float]]:
    """Seconds per call of each fn, one sample per round, the fns alternating within
    each round (interleaving is fair on noisy machines: a slow spell hits every
    contender alike). The order rotates every round, and every block starts with one
    untimed call: without it, two identical compiled 2 ms programs (the MLP's, default
    and "tuned") timed 18-27% apart, the one that more often ran right after torch
    being the slower. (Idling 50 ms before each block instead made every 2 ms step
    slower, torch's by 2x: the cores had gone idle.) A block runs at least ``inner``
    calls and at least :data:`MIN_BLOCK` seconds' worth, as the warm-up calls timed it."""
    calls = {}
    for name, fn in fns.items():
        for _ in range(2):
            jax.block_until_ready(fn())
        start = time.perf_counter()
        jax.block_until_ready(fn())
        calls[name] = max(inner, math.ceil(MIN_BLOCK / max(time.perf_counter() - start, 1e-6)))
    samples: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = fns[name]
            jax.block_until_ready(fn())  # untimed: the previous contender's threads settle
            start = time.perf_counter()
            for _ in range(calls[name]):
                out = fn()
            jax.block_until_ready(out)
            samples[name].append((time.perf_counter() - start) / calls[name])
    return samples


def interleaved(
    fns: dict[str, Callable[[], Any]], *, rounds: int = 7, inner: int = 20
) -> dict[str, float]:
    """Median seconds per call of each fn, alternating between them each round
    (:func:`samples_of`)."""
    samples = samples_of(fns, rounds=rounds, inner=inner)
    return {k: statistics.median(v) for k, v in samples.items()}


def round_ratios(samples: dict[str, list[float]], ours: str, theirs: str) -> list[float]:
    """``ours / theirs`` of each round of :func:`samples_of` (both timed in the same
    round, so a slow spell of the machine mostly cancels)."""
    return [a / b for a, b in zip(samples[ours], samples[theirs], strict=True)]


def check_ratio(name: str, ratios: list[float], limit: float) -> bool:
    """Prints the median of ``ratios`` against ``limit``; True if it is within."""
    median = statistics.median(ratios)
    ok = median <= limit
    spread = f"{min(ratios):.3f}-{max(ratios):.3f}"
    verdict = "ok" if ok else "REGRESSION"
    print(f"check {name}: median ratio {median:.3f} (rounds {spread}), limit {limit}: {verdict}")
    return ok
