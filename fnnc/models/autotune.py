"""Autotuning a cnnp model: its programs' backends timed per node on the real shapes.

NNC's ``ccv_nnc_graph_autotune`` runs a concrete graph once and, for every node,
times each backend that can run it, keeping the fastest. A compiled model owns several
programs (``evaluate``, the fused ``fit`` step); :func:`autotune` takes the graphs
those programs run for one batch of inputs (and targets) and hands each to
:func:`fnnc.graph.autotune_graph` with the arguments the program would be fed (the
model's parameters, its optimizer state and the batch), captured from the engine's own
call so they follow its layout. Winners land in the autotune table
(:data:`fnnc.ops.autotune.TABLE`); the engine's program cache keys on the dispatch
state, which every table write moves, so the next ``evaluate`` / ``fit`` compiles with
the tuned choices.

Nothing the model holds changes: parameters, optimizer state, BatchNorm statistics and
the model's random key stay as they were, and every backend computes the same function,
so outputs differ from untuned ones only by the rounding of another summation order. A
(command, specs) already in the table is not timed again, so a second call measures
nothing.

>>> import numpy as np, optax
>>> from fnnc.models import Dense, Input, Model
>>> x = Input()
>>> model = Model(x, Dense(2, name="fc")(x))
>>> model.compile(np.zeros((4, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
>>> tuned = model.autotune(np.ones((4, 3), np.float32))  # {program: {node: backend}}
>>> list(tuned)  # (on CPU a dense layer has no second backend: {'evaluate': {}})
['evaluate']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fnnc.core.ir import Graph
from fnnc.graph.autotune import autotune_graph
from fnnc.graph.check import draw
from fnnc.graph.compile import Program
from fnnc.models.engine import Engine
from fnnc.models.layer import ModelError
from fnnc.ops.autotune import check_repeats


class _Captured(BaseException):
    """Carries a program's graph and arguments out of the engine, past its handlers."""

    def __init__(self, graph: Graph, args: tuple[Any, ...]):
        super().__init__()
        self.graph, self.args = graph, args


def _program_call(engine: Engine, run: Callable[[], Any]) -> tuple[Graph, list[Any]]:
    """The graph and arguments of the program ``run`` (an engine method) calls.

    The engine goes as far as calling its compiled program (choosing, compiling and
    caching it, assembling its arguments by its own layout); the call is captured
    instead of executed, so nothing the step would write is written. The random key
    the engine drew for the step is put back.
    """
    key, call = engine.key, Program.__call__

    def capture(program: Program, *args: Any) -> Any:
        raise _Captured(program.graph, args)

    Program.__call__ = capture  # type: ignore[method-assign]
    try:
        run()
    except _Captured as c:
        return c.graph, list(c.args)
    finally:
        Program.__call__ = call  # type: ignore[method-assign]
        engine.key = key
    raise RuntimeError("autotune: the engine ran no program")  # pragma: no cover


def stand_in(engine: Engine) -> list[Any]:
    """A batch of the shapes ``engine`` was compiled for, drawn as
    :func:`fnnc.graph.check.draw` does (seed 0); a :class:`ModelError` before
    ``compile``."""
    if not engine.input_specs:
        raise ModelError(
            f"model {engine.model.describe()}: autotune() without inputs tunes the shapes "
            "the model was compiled for; call compile(inputs, ...) first or pass a batch"
        )
    rng = np.random.default_rng(0)
    return [draw(rng, s) for s in engine.input_specs]


def autotune(
    engine: Engine,
    inputs: Sequence[Any],
    targets: Sequence[Any] | None = None,
    *,
    repeats: int = 5,
    retune: bool = False,
) -> dict[str, dict[int, str]]:
    """Tunes the backends of ``engine``'s programs on one batch (see module doc).

    Args:
        engine: a compiled model's engine.
        inputs: one batch of model inputs (their shapes are the ones tuned).
        targets: the batch's targets; given (``[]`` for a loss without targets) and
            with a minimizer set, the ``fit`` step is tuned too.
        repeats: timed runs per backend (the median counts), an int >= 1.
        retune: time again what the table already holds.

    Returns:
        Per program tuned (``"fit"`` first when tuned, then ``"evaluate"``),
        ``{node index: backend}`` for the nodes of its graph that had a choice.

    Raises:
        BackendError: ``repeats`` is no int >= 1 (before any program is built).
    """
    check_repeats(repeats, "Model.autotune")  # before anything compiles
    runs = {}
    has_minimizer = engine.default_minimizer is not None or bool(engine.minimizers)
    if targets is not None and has_minimizer:
        # The training step first: the forward nodes it shares with evaluate are then
        # chosen (and checked against the defaults) inside the program that trains.
        runs["fit"] = lambda: engine.fit(inputs, targets)
    runs["evaluate"] = lambda: engine.evaluate(inputs, is_test=True, requires_grad=False)
    calls = {kind: _program_call(engine, run) for kind, run in runs.items()}
    return {
        kind: autotune_graph(graph, *args, repeats=repeats, retune=retune)
        for kind, (graph, args) in calls.items()
    }
