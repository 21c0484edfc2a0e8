"""Step time of a ``Repeat`` model under Adam: the minimizer's view of the stacks.

A stacked parameter must be updated as its ``n`` blocks are in the unrolled model. A
rule with a norm per tensor (LAMB, Adafactor) gets each block as its own tensor
(:func:`fnnc.models.stacks.per_block`: slice each stack, update per block, restack);
an elementwise rule (SGD, Adam: :func:`~fnnc.models.stacks.acts_elementwise`) updates
each stack whole, which gives the same numbers bit for bit without the slicing. This
times, in one run, Adam's step three ways: as shipped (elementwise: whole stacks), the
per-block view forced on Adam (what the slicing would cost), and the stack-as-one-tensor
minimizer of before (the baseline; the same as shipped for Adam). Each model starts from
the same weights; after 3 steps the shipped one's weights are checked bit-identical to
the baseline's.

The model: ``Repeat(Sequential([Dense(width), ReLU()]), depth)`` between a dense input and
head, mean-squared-error loss, ``optax.adam``. Reported: median step times and ratios.

Run: python benchmarks/repeat_step.py [--depth 16] [--width 256] [--batch 32]
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any
from unittest import mock

import numpy as np
import optax

from benchmarks._timing import median_time
from fnnc.models import Dense, Input, Model, ReLU, Repeat, Sequential, optim
from fnnc.models.engine import Engine
from fnnc.models.optim import Minimizers


def model(depth: int, width: int, x: np.ndarray) -> Model:
    inp = Input()
    block = Repeat(lambda: Sequential([Dense(width, name="fc"), ReLU()], name="b"), depth)
    out = Dense(8, name="head")(block(Dense(width, name="inp")(inp)))
    m = Model(inp, out)
    m.compile(x, loss="mse", minimizer=optax.adam(1e-3))
    return m


def stacked_minimizers_of(self: Engine, pids: list[str]) -> Minimizers:
    """The minimizer of before: each stack updated as one tensor, whatever the rule."""
    return Minimizers.of(pids, [self.minimizer_of(p) for p in pids])


def variant(name: str) -> Any:
    """A context under which models are built and run the ``name`` way."""
    if name == "baseline":
        return mock.patch.object(Engine, "minimizers_of", stacked_minimizers_of)
    if name == "per-block":
        return mock.patch.object(optim, "acts_elementwise", lambda *_: False)
    return contextlib.nullcontext()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch, args.width)).astype(np.float32)
    y = rng.normal(size=(args.batch, 8)).astype(np.float32)
    names = ("baseline", "shipped", "per-block")
    models: dict[str, Model] = {}
    start = None
    for name in names:
        with variant(name):
            models[name] = model(args.depth, args.width, x)
            start = start or models[name].parameters()
            models[name].set_parameters(start)
            for _ in range(3):
                models[name].fit(x, y)
    after = {k: {p: np.asarray(v) for p, v in m.parameters().items()} for k, m in models.items()}
    same = all(np.array_equal(after["baseline"][p], v) for p, v in after["shipped"].items())
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(3):  # interleaved, so a slow spell of a shared machine hits all alike
        for name in names:
            with variant(name):
                times[name].append(median_time(lambda m=models[name]: m.fit(x, y), repeats=5))
    best = {n: min(t) for n, t in times.items()}
    print(f"Repeat depth {args.depth} width {args.width} batch {args.batch}, adam, step time")
    for name in names:
        ratio = best[name] / best["baseline"]
        print(f"  {name:10s} {best[name] * 1e3:8.3f} ms  x{ratio:5.3f} of baseline")
    print(f"  shipped weights after 3 steps bit-identical to baseline: {same}")


if __name__ == "__main__":
    main()
