"""fnnc.data streaming throughput: digits-sized batches through a DataFrame vs NumPy.

Data: scikit-learn's ``load_digits`` (1797 images, 8x8x1 float32, int32 labels), batch
32, reshuffled every epoch. Contenders, each timed over whole epochs (creating the
iterator included, as a training loop that asks for one epoch at a time does):

- ``numpy slices``: ``x[i:i+32]`` of arrays in memory (no shuffle): the floor.
- ``numpy shuffled``: ``x[perm[i:i+32]]`` with a new permutation per epoch: what a
  hand-written loop does.
- ``DataFrame threads=T``: ``from_arrays(x=, y=).shuffle().batch(32)`` read through
  Grain with T reading threads (0: in the consuming thread).

Reported: samples/s (median of several interleaved rounds) and the ratio to the
shuffled NumPy loop. ``--workers N`` adds a run with N worker processes (their start-up,
seconds on a small machine, is reported separately and not in the throughput).

``--fit``: the pipeline feeding training instead. The digits CNN of
``examples/digits.py`` (1437 training images, batch 32, Adam) runs ``model.train``
epochs fed by in-memory arrays, by a DataFrame read in the training thread, and by
the DataFrame with 2 Grain worker processes (``df.read_with(workers=2)``; started
once, in the warm-up, and kept from epoch to epoch). Each contender trains its own
copy of the model; every round runs one ``train(epochs=1)`` call per contender, in an
order rotated each round; reported are the median wall-clock seconds per epoch and the
ratio to arrays (the pipeline is not the bottleneck at <= 1.05), the median of the
per-round ratios (each epoch against the arrays epoch of its own round, which cancels
the slow drifts of a shared virtual machine: medians of 61 rounds moved by 6% from run
to run, paired ratios by 2%), and the CPU time of this process (XLA's threads included,
worker processes not).

Run: python benchmarks/data_pipeline.py [--quick] [--workers 2] [--fit [--rounds 41]]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
from sklearn.datasets import load_digits

from fnnc.data import DataFrame

BATCH = 32


def numpy_slices(x: np.ndarray, y: np.ndarray) -> Callable[[int], int]:
    def epoch(e: int) -> int:
        n = 0
        for i in range(0, len(x), BATCH):
            xb, yb = x[i : i + BATCH], y[i : i + BATCH]
            n += len(xb) + 0 * len(yb)
        return n

    return epoch


def numpy_shuffled(x: np.ndarray, y: np.ndarray) -> Callable[[int], int]:
    def epoch(e: int) -> int:
        perm = np.random.default_rng(e).permutation(len(x))
        n = 0
        for i in range(0, len(x), BATCH):
            idx = perm[i : i + BATCH]
            xb, yb = x[idx], y[idx]
            n += len(xb) + 0 * len(yb)
        return n

    return epoch


def dataframe(df: DataFrame, threads: int) -> Callable[[int], int]:
    def epoch(e: int) -> int:
        n = 0
        for xb, _ in df.iterator(("x", "y"), epoch=e, threads=threads):
            n += len(xb)
        return n

    return epoch


def measure(cases: dict[str, Callable[[int], int]], rounds: int, epochs: int) -> dict[str, float]:
    """Median samples/s of each case over ``rounds`` interleaved rounds of ``epochs`` epochs."""
    for fn in cases.values():
        fn(0)  # warm up
    rates: dict[str, list[float]] = {k: [] for k in cases}
    for r in range(rounds):
        for name, fn in cases.items():
            start, n = time.perf_counter(), 0
            for e in range(epochs):
                n += fn(r * epochs + e)
            rates[name].append(n / (time.perf_counter() - start))
    return {k: statistics.median(v) for k, v in rates.items()}


def fit_epochs(rounds: int, workers: int) -> None:
    """Median seconds per ``model.train`` epoch of the digits CNN per data source: arrays
    against the DataFrame read in the training thread, then (a second phase, since the
    worker processes and Grain's threads that serve them take CPU from every contender
    while they run) arrays against the DataFrame read by ``workers`` processes."""
    from examples.digits import load

    (x, y), _ = load()
    frame = DataFrame.from_arrays(x=x, y=y)
    print(f"digits CNN train: {len(x) // BATCH} steps of {BATCH} per epoch, median of {rounds} "
          f"interleaved epochs each ({os.cpu_count()} CPUs)")  # fmt: skip
    _fit_phase({"arrays": (x, y), "DataFrame workers=0": frame}, rounds, x)
    _fit_phase({"arrays": (x, y), f"DataFrame workers={workers}": frame.read_with(workers=workers)},
               rounds, x)  # fmt: skip


def _fit_phase(sources: dict, rounds: int, x: np.ndarray) -> None:
    from examples.digits import make_model
    from fnnc.models import minimizers

    models = {}
    for name, data in sources.items():
        model = make_model()
        model.compile([x[:BATCH]], loss="softmax_crossentropy", minimizer=minimizers.adam(3e-3))
        start = time.perf_counter()
        model.train(data, epochs=1, batch_size=BATCH, verbose=False)  # compile, start workers
        print(f"  warm-up epoch {name:22s} {time.perf_counter() - start:6.1f} s")
        models[name] = model
    seconds: dict[str, list[float]] = {k: [] for k in sources}
    cpu: dict[str, list[float]] = {k: [] for k in sources}
    names = list(sources)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start, start_cpu = time.perf_counter(), time.process_time()
            models[name].train(sources[name], epochs=1, batch_size=BATCH, verbose=False)
            seconds[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    base, base_cpu = statistics.median(seconds["arrays"]), statistics.median(cpu["arrays"])
    print(f"  load average {os.getloadavg()[0]:.1f}")
    for name, values in seconds.items():
        wall, used = statistics.median(values), statistics.median(cpu[name])
        paired = statistics.median(v / a for v, a in zip(values, seconds["arrays"]))
        print(f"  {name:22s} {wall * 1e3:7.1f} ms/epoch, ratio to arrays {wall / base:5.3f} "
              f"(paired {paired:5.3f})   CPU {used * 1e3:7.1f} ms/epoch, "
              f"ratio {used / base_cpu:5.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--workers", type=int, default=0, help="also time N worker processes")
    parser.add_argument("--fit", action="store_true", help="time model.train epochs instead")
    parser.add_argument("--rounds", type=int, default=0, help="--fit: epochs per contender")
    args = parser.parse_args()
    if args.fit:
        fit_epochs(args.rounds or (5 if args.quick else 41), workers=args.workers or 2)
        return
    rounds, epochs = (3, 2) if args.quick else (7, 5)
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]  # [1797, 8, 8, 1]
    y = digits.target.astype(np.int32)
    df = DataFrame.from_arrays(x=x, y=y).shuffle().batch(BATCH)
    cases = {
        "numpy slices": numpy_slices(x, y),
        "numpy shuffled": numpy_shuffled(x, y),
        "DataFrame threads=0": dataframe(df, 0),
        "DataFrame threads=2": dataframe(df, 2),
    }
    rates = measure(cases, rounds, epochs)
    if args.workers:
        start = time.perf_counter()
        it = df.iterator(("x", "y"), epochs=None, workers=args.workers)
        next(it)
        startup = time.perf_counter() - start
        samples = []
        for _ in range(rounds):
            t, n = time.perf_counter(), 0
            for _ in range(epochs * len(df)):
                n += len(next(it)[0])
            samples.append(n / (time.perf_counter() - t))
        it.close()
        rates[f"DataFrame workers={args.workers}"] = statistics.median(samples)
        print(f"workers={args.workers}: first batch after {startup:.1f} s (process start-up)")
    base = rates["numpy shuffled"]
    print(f"digits {x.shape} float32, batch {BATCH}, {rounds} rounds x {epochs} epochs (medians)")
    for name, rate in rates.items():
        print(f"  {name:24s} {rate:12,.0f} samples/s   {versus(base / rate)} numpy shuffled")


def versus(time_ratio: float) -> str:
    """``"3.90x slower than"`` for a time ratio to the baseline at or above 1, else
    ``"12.50x faster than"`` (the inverted ratio): a ratio below 1 is not "slower"."""
    if time_ratio >= 1:
        return f"{time_ratio:6.2f}x slower than"
    return f"{1 / time_ratio:6.2f}x faster than"


if __name__ == "__main__":
    main()
