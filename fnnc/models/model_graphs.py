"""A model's forward as a bare graph, for running it elsewhere (the dynamic graph's
``evaluate``, ``jax.export``); :class:`fnnc.models.Model` mixes it in.

:meth:`GraphsMixin.forward_graph` is the deterministic forward (no random keys, no
internal updates). :meth:`GraphsMixin.training_graph` is the training-mode forward
``Model.fit`` builds: Dropout takes random keys as extra inputs, and BatchNorm
normalises with the batch's statistics and returns the new running statistics as
extra outputs, which the caller writes back (:meth:`GraphsMixin.random_keys` draws
the keys from the model's own stream, as ``fit`` does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from fnnc.core.ir import Graph
from fnnc.models.layer import ModelError


@dataclasses.dataclass(frozen=True)
class TrainingGraph:
    """The training-mode forward of a model (:meth:`GraphsMixin.training_graph`).

    ``graph``'s inputs are the model inputs, the parameters ``params`` (ids, internals
    included), then ``n_keys`` random keys (``uint32[2]`` key data); its outputs are
    the model outputs, then the new values of the internals ``updates`` (ids).
    """

    graph: Graph
    params: tuple[str, ...]
    n_keys: int
    updates: tuple[str, ...]


class GraphsMixin:
    """``forward_graph``, ``training_graph`` and ``random_keys`` (see module doc)."""

    engine: Any
    describe: Any  # Layer's

    def forward_graph(
        self, inputs: Sequence[Any], *, is_test: bool = True, as_evaluated: bool = False
    ) -> tuple[Graph, list[str]]:
        """The forward :class:`~fnnc.core.ir.Graph` for inputs like ``inputs`` (arrays or
        specs), with the parameters as extra inputs: ``(graph, parameter ids)``; the
        graph's inputs are the model inputs then those parameters, its outputs the
        model outputs (how :meth:`fnnc.graph.DynamicGraph.evaluate` and model export
        run a model). ``as_evaluated``: the graph as :meth:`~fnnc.models.Model.evaluate`
        runs it, after ``compile``'s ``precision`` cast and forward ``passes`` (model
        export takes this one); else the graph the layers built. For the
        training-mode forward of a model with dropout or batch norm use
        :meth:`training_graph`."""
        built, feed, graph = self._graph(
            inputs, not is_test, with_updates=False, as_evaluated=as_evaluated
        )
        if built.ctx.keys and is_test:
            keys = set(graph.inputs[len(graph.inputs) - len(built.ctx.keys) :])
            users = sorted({n.name or n.cmd.name for n in graph.nodes if keys & set(n.inputs)})
            raise ModelError(
                f"model {self.describe()}: its test-mode forward draws random keys (read "
                f"by {', '.join(users) or 'its outputs'}), so forward_graph (and export) "
                "have no deterministic forward to give: a layer is random in test mode too, "
                "e.g. a Linen nn.Dropout(deterministic=False) in a from_flax module; make it "
                "deterministic in test mode (Linen: deterministic=not self.train)"
            )
        if built.ctx.keys or built.ctx.updates:
            raise ModelError(
                f"model {self.describe()}: forward_graph needs a deterministic forward "
                "without internal updates (no dropout keys, no batch-norm statistics); "
                "pass is_test=True, or use training_graph for the training-mode forward"
            )
        return graph, list(feed.params)

    def training_graph(self, inputs: Sequence[Any], *, as_evaluated: bool = False) -> TrainingGraph:
        """The training-mode forward for inputs like ``inputs`` (arrays or specs):
        dropout active (keys as inputs), batch norm on the batch's statistics (new
        running statistics as outputs); see :class:`TrainingGraph`. ``as_evaluated``:
        after ``compile``'s ``precision`` cast and forward ``passes``, as ``fit`` runs
        it; else the graph the layers built."""
        built, feed, graph = self._graph(inputs, True, with_updates=True, as_evaluated=as_evaluated)
        return TrainingGraph(graph, tuple(feed.params), feed.n_keys, tuple(built.ctx.updates))

    def random_keys(self, n: int) -> list[Any]:
        """``n`` fresh random keys (key data) from the model's stream, the one ``fit``
        and ``evaluate`` draw their dropout keys from."""
        return self.engine._keys(n)

    def _graph(
        self, inputs: Sequence[Any], training: bool, *, with_updates: bool,
        as_evaluated: bool = False,
    ) -> tuple[Any, Any, Graph]:  # fmt: skip
        """``(build, its feed, graph)``: the model outputs (then the internals' new
        values ``with_updates``), inputs in the feed's order; ``as_evaluated``: after the
        engine's precision cast and forward passes, as ``forward_program`` runs them."""
        from fnnc.models.programs import _ordered, evaluated_graph
        from fnnc.models.sample_sets import as_list

        engine = self.engine
        arrays = as_list(inputs)
        built = engine._build(training, engine._check_inputs(arrays))
        ctx = built.ctx
        outputs = [*built.outputs, *(ctx.updates.values() if with_updates else ())]
        if as_evaluated:
            graph, feed = evaluated_graph(built, outputs, engine.precision, engine.passes)
            return built, feed, graph
        feed, order = built.feed(tuple(ctx.params))
        return built, feed, _ordered(ctx.b.build(outputs), order)
