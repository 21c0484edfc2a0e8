"""``Model.profile``: the per-node profile (:func:`fnnc.graph.profile`) of a model's
training step or forward pass.

The fit step is profiled as ``fit`` runs it (the same compiled program, donation
included), so it *trains*: the model takes ``runs + 2`` steps on the batch (one that
compiles the step, one warm-up, then the ``runs`` timed ones). Profile a copy, or
restore a checkpoint after, when the weights matter. The forward pass (no targets)
changes nothing. A ``runs`` below 1 is refused before any step.

Nodes are named as parameter ids are (``hidden-0``); an unnamed layer without
parameters by its kind, a command layer (``ReLU()``, ``Add()``) by its command
(``relu``, ``ewsum``), as ``summary`` labels it.

>>> import numpy as np, optax
>>> from fnnc.models import Dense, Input, Model, ReLU
>>> x = Input()
>>> model = Model(x, Dense(3, name="out")(ReLU()(Dense(16, name="hidden")(x))))
>>> model.compile(np.zeros((32, 8), np.float32), loss="softmax_crossentropy",
...               minimizer=optax.sgd(0.1))
>>> report = model.profile(np.ones((32, 8), np.float32), np.zeros(32, np.int32), runs=2)
>>> {"hidden-0", "relu", "out-0", "optimizer"} <= {r.name for r in report.nodes}
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fnnc.graph.profile import Profile, check_runs, profile_calls


def profile_model(
    model: Any,
    inputs: Sequence[Any],
    targets: Sequence[Any] | None = None,
    *,
    runs: int = 10,
    log_dir: str | None = None,
) -> Profile:
    """The profile of ``model.fit(inputs, targets)`` or, without ``targets``, of
    ``model.evaluate(inputs)`` (test mode); see :mod:`fnnc.models.profiling`."""
    check_runs(runs)  # before the step that compiles fit, which trains
    engine = model.engine
    if targets is None:
        specs = engine._check_inputs(inputs)
        model.evaluate(inputs)  # compiles it
        compiled = engine._compiled(("evaluate", specs, False), _never)

        def run() -> Any:
            return model.evaluate(inputs)
    else:
        model.fit(inputs, targets)  # compiles it
        compiled = engine._last_fit

        def run() -> Any:
            return model.fit(inputs, targets)

    return profile_calls(run, compiled.program, runs=runs, log_dir=log_dir)


def _never() -> Any:
    raise AssertionError("evaluate compiled its program just before")
