"""User passes in a cnnp model's programs: ``Model.compile(..., passes=...)``.

A model's programs are built from the graph its layers emit. The user's passes run at
one of two places, as the user says:

* ``"forward"`` (the default when ``passes`` is a list): on the forward graph (the
  model's outputs, with the loss in ``fit``), *before* ``backward``: the gradient
  nodes are then those of the rewritten forward, so a rewrite changes training as if
  the model had been written that way. Every program runs them (``fit``,
  ``evaluate``, ``backward``).
* ``"training"``: on the graph with its backward and optimizer update, *after* it is
  simplified, just before it is compiled (``fit``; ``backward``'s gradient graph). A
  training pass that takes a ``donate`` keyword (:func:`fnnc.graph.remat` does) gets
  the graph inputs the program donates, unless it has one bound already: ``fit``'s
  parameters and optimizer state, updated in place. So
  ``functools.partial(remat, budget_bytes=...)`` meets its budget on the plan
  :meth:`fnnc.models.Model.memory_plan` reports.

>>> import optax
>>> from fnnc.models.model_passes import ModelPasses
>>> def my_pass(graph):
...     return graph
>>> ModelPasses.of([my_pass]).forward == (my_pass,)
True
>>> ModelPasses.of({"training": [my_pass]}).training == (my_pass,)
True

A pass must keep its graph's inputs and outputs (their number, order, shapes and
dtypes): the engine feeds and reads programs by position. Passes key the engine's
program cache by identity, so compiling again with other passes builds new programs.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from fnnc.core.ir import Graph
from fnnc.errors import GraphError
from fnnc.graph.passes.pipeline import resolve_passes, run_passes
from fnnc.models.layer import ModelError

Pass = Callable[[Graph], Graph]

STAGES = ("forward", "training")


@dataclasses.dataclass(frozen=True)
class ModelPasses:
    """The passes of each stage (see the module doc)."""

    forward: tuple[Pass, ...] = ()
    training: tuple[Pass, ...] = ()

    @staticmethod
    def of(passes: Any) -> ModelPasses:
        """From what ``Model.compile(passes=)`` takes: ``None``, a list of passes (the
        forward stage), a mapping ``{"forward": [...], "training": [...]}``, or a
        :class:`ModelPasses`."""
        if passes is None:
            return ModelPasses()
        if isinstance(passes, ModelPasses):
            return passes
        if isinstance(passes, Mapping):
            unknown = [k for k in passes if k not in STAGES]
            if unknown:
                raise ModelError(
                    f"compile(passes=): unknown stage(s) {unknown}; the stages are "
                    f"{list(STAGES)} (before backward, or the training graph after it)"
                )
            return ModelPasses(
                _passes(passes.get("forward", ()), "forward"),
                _passes(passes.get("training", ()), "training"),
            )
        return ModelPasses(_passes(passes, "forward"))

    def run_forward(self, graph: Graph) -> tuple[Graph, Callable[[int], int]]:
        """``graph`` after the forward passes, and a map from its input and output
        symbol ids to the new graph's (passes may renumber symbols)."""
        if not self.forward:
            return graph, lambda sid: sid
        new = _run(graph, self.forward, "forward")
        ids = dict(zip(graph.outputs, new.outputs))
        ids.update(zip(graph.inputs, new.inputs))
        return new, ids.__getitem__

    def run_training(self, graph: Graph, donate: tuple[int, ...] = ()) -> Graph:
        """``graph`` (forward, backward, update) after the training passes; those taking
        a ``donate`` keyword get ``donate``, the inputs the compiled step donates."""
        if not self.training:
            return graph
        return _run(graph, tuple(_donating(p, donate) for p in self.training), "training")


NO_PASSES = ModelPasses()


def _passes(items: Any, stage: str) -> tuple[Pass, ...]:
    try:  # the graph layer's rule: functions, or names of the built-in passes
        return resolve_passes(items, f"compile(passes=): the {stage} passes")
    except GraphError as e:
        raise ModelError(str(e)) from None


def _donating(p: Pass, donate: tuple[int, ...]) -> Pass:
    """``p`` with ``donate=donate`` bound if it takes that keyword and has none bound."""
    if isinstance(p, functools.partial) and "donate" in p.keywords:
        return p
    try:
        params = inspect.signature(p).parameters
    except (TypeError, ValueError):  # a callable without a signature: called as it is
        return p
    takes = params.get("donate")
    if takes is None or takes.kind in (takes.POSITIONAL_ONLY, takes.VAR_POSITIONAL):
        return p
    bound = functools.partial(p, donate=donate)
    functools.update_wrapper(bound, p)  # type: ignore[arg-type]  # its name in messages
    return bound


def _run(graph: Graph, passes: tuple[Pass, ...], stage: str) -> Graph:
    new = run_passes(graph, passes)
    if new.input_specs != graph.input_specs or new.output_specs != graph.output_specs:
        names = [getattr(p, "__name__", repr(p)) for p in passes]
        raise ModelError(
            f"compile(passes=): the {stage} passes {names} changed the graph's inputs or "
            f"outputs ({len(graph.inputs)} -> {len(new.inputs)} inputs, "
            f"{len(graph.outputs)} -> {len(new.outputs)} outputs, or their specs); a "
            "pass in a model keeps them, since programs are fed by position"
        )
    return new
