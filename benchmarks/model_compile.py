"""``Model.compile`` time: parameters initialised by one program against eagerly.

``Model.compile`` builds the model's graph and gives every parameter its first value
(:mod:`fnnc.models.initialize`): one program for all of them, compiled at XLA's lowest
optimization level. The baseline, measured in the same run, is what fnnc did before:
each initializer run eagerly, one XLA compile per primitive per new parameter shape.
Both draw the same values (checked here).

Models: an MLP of 12 Dense layers of distinct widths; a CNN (four convolutions and
two Dense layers, the digits demo's shape of model, wider); a 6-block MLP of one width
(repeated shapes, where eager compiles are reused). Before each timing JAX's caches are
cleared (``jax.clear_caches``), so no run reuses another's compiles; the runs of the
two ways interleave. Reported: the median of ``--runs`` timings and their ratio. (A
model built again with the same shapes reuses its program, as eager initializers reuse
their compiles: both then take a few milliseconds.)

Run: python benchmarks/model_compile.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

import fnnc.models.engine as engine
from fnnc.models import Conv, Dense, Flatten, MaxPool, ReLU, Sequential
from fnnc.models.initialize import _PROGRAMS as init_programs
from fnnc.models.initialize import initialize


def _eager(key: Any, infos: Any) -> tuple[Any, list[Any]]:
    """The old way: each initializer run eagerly, in order, from its own split key."""
    values = []
    for info in infos:
        key, sub = jax.random.split(key)
        values.append(info.init(sub, info.shape, info.dtype))
    return key, values


def _mlp() -> tuple[Any, np.ndarray]:
    layers: list[Any] = []
    for k in range(12):
        layers += [Dense(8 + 3 * k), ReLU()]
    return Sequential(layers), np.ones((2, 5), np.float32)


def _cnn() -> tuple[Any, np.ndarray]:
    layers = [Conv(16, (3, 3), padding="SAME"), ReLU(), Conv(24, (3, 3), padding="SAME"), ReLU()]
    layers += [MaxPool((2, 2)), Conv(32, (3, 3), padding="SAME"), ReLU()]
    layers += [Conv(40, (3, 3), padding="SAME"), ReLU(), MaxPool((2, 2)), Flatten()]
    layers += [Dense(64), ReLU(), Dense(10)]
    return Sequential(layers), np.ones((4, 16, 16, 1), np.float32)


def _same_width() -> tuple[Any, np.ndarray]:
    layers: list[Any] = []
    for _ in range(6):
        layers += [Dense(64), ReLU()]
    return Sequential(layers), np.ones((2, 64), np.float32)


MODELS: dict[str, Callable[[], tuple[Any, np.ndarray]]] = {
    "mlp, 12 widths": _mlp,
    "cnn, 4 conv + 2 dense": _cnn,
    "mlp, 6 x one width": _same_width,
}


def _timed(make: Callable[[], tuple[Any, np.ndarray]], init: Any) -> tuple[float, dict]:
    engine.initialize = init
    try:
        jax.clear_caches()
        init_programs.clear()  # fnnc's own cache of initialization programs too
        model, x = make()
        start = time.perf_counter()
        model.compile(x)
        seconds = time.perf_counter() - start
        return seconds, {k: np.asarray(v) for k, v in model.parameters().items()}
    finally:
        engine.initialize = initialize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"{'model':<24} {'one program s':>14} {'eager s':>9} {'eager / one':>12}")
    for name, make in MODELS.items():
        ours, base = [], []
        for _ in range(args.runs):
            t, got = _timed(make, initialize)
            ours.append(t)
            t, want = _timed(make, _eager)
            base.append(t)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7, err_msg=k)
        a, b = statistics.median(ours), statistics.median(base)
        print(f"{name:<24} {a:>14.2f} {b:>9.2f} {b / a:>11.2f}x")


if __name__ == "__main__":
    main()
