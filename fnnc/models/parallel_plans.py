"""The shardings of a data-parallel model's programs (``fit``, forward, ``backward``,
``apply_gradients``): :class:`PlansMixin` gives :class:`~fnnc.models.parallel.Parallel`
one method per program kind, each laying the batch over the mesh's data axis and the
parameters and optimizer state as the layout's mode (replicated, FSDP, sharding rules,
pipelined stacks) says."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax.sharding import Mesh, PartitionSpec

from fnnc.graph import state_specs
from fnnc.graph.sharding import Shardings, data_parallel


class PlansMixin:
    """:class:`~fnnc.models.parallel.Parallel`'s program shardings (module doc)."""

    mesh: Mesh
    mode: str
    axis: str
    rules: Any
    staged: tuple[tuple[str, PartitionSpec], ...]
    named: dict[str, PartitionSpec]
    size: int
    param_spec: Any

    def fit_plan(
        self, graph: Any, train: Any, n_inputs: int, n_targets: int, n_scale: int = 0,
        updates: Sequence[str] = (),
    ) -> Shardings:  # fmt: skip
        """The shardings of a fit program (inputs ordered as :class:`FitProgram` says;
        the ``n_scale`` loss-scale inputs last, replicated). ``updates``: the ids of the
        internals whose new values follow the loss, each laid out as its parameter (a
        pipelined Repeat's statistics stay on the stage axis)."""
        head = train.n_params + train.n_state
        n = len(graph.inputs) - n_scale
        batch = [*range(head, head + n_inputs), *range(n - n_targets, n)]
        mode = self.mode if self.rules is None else "replicated"
        plan = data_parallel(
            graph, self.mesh, batch=batch, axis=self.axis, layout=train, parameter_sharding=mode
        )
        if self.rules is None and not self.staged:
            return plan
        specs = list(plan.inputs)
        named = self.named
        for i, sid in enumerate(graph.inputs):
            if i not in batch and graph.symbols[sid].name in named:
                specs[i] = named[graph.symbols[sid].name]
        n, m = train.n_params, train.n_state
        params = [graph.symbols[s] for s in graph.inputs[:n]]
        specs[n : n + m] = _state_layout(train.optimizer, params, specs[:n], m)
        outs = [*specs[: n + m], *(plan.outputs or ())[n + m :]]
        for k, pid in enumerate(updates):  # after the loss
            outs[n + m + 1 + k] = named.get(pid, outs[n + m + 1 + k])
        return Shardings(self.mesh, tuple(specs), tuple(outs))

    def forward_plan(self, graph: Any, n_inputs: int, trainable: Sequence[str], params: Any) -> Any:
        """The shardings of a forward program: model inputs split (unless a batch does
        not divide, then replicated), parameters laid out as :meth:`param_spec`."""
        n_keys = len(graph.inputs) - n_inputs - len(params)
        specs = self._feed_specs(graph, n_inputs, trainable, params, n_keys)
        return Shardings(self.mesh, tuple(specs))

    def gradient_plan(self, graph: Any, feed: Any, trainable: Sequence[str], wrt: Any) -> Shardings:
        """The shardings of a ``backward`` program (a forward ``feed``, a
        :class:`~fnnc.models.programs.ModelFeed`, then one gradient per model output):
        output gradients split as the batch (where it divides); the gradients of
        parameters ``wrt`` laid out as the parameters, then those of the model inputs
        as the batch."""
        n_inputs, params = feed.n_inputs, feed.params
        specs = self._feed_specs(graph, n_inputs, trainable, params, feed.n_keys)
        head = len(specs)
        specs += [self._batch_spec(graph.symbols[s].shape) for s in graph.inputs[head:]]
        by_id = dict(zip(params, specs[n_inputs:]))
        outs = [by_id[p] for p in wrt]
        outs += [self._batch_spec(graph.symbols[s].shape) for s in graph.outputs[len(wrt) :]]
        return Shardings(self.mesh, tuple(specs), tuple(outs))

    def apply_plan(self, graph: Any, n_params: int) -> Shardings:
        """The shardings of an ``apply_gradients`` program (gradients, optimizer state,
        parameters; all of trainable parameters): laid out as ``fit`` lays out
        parameters and state, the outputs (parameters', state') as their inputs."""
        specs = [self.param_spec(graph.symbols[s].shape, True) for s in graph.inputs]
        if self.rules is not None or self.staged:
            k = len(specs) - n_params
            params = [graph.symbols[s] for s in graph.inputs[k:]]
            specs[k:] = [self.param_spec(p.shape, True, p.name) for p in params]
            specs[:n_params] = specs[k:]  # each gradient as its parameter
            (update,) = [node for node in graph.nodes if node.cmd.name == "optax_update"]
            optimizer = update.cmd.param("optimizer").value
            specs[n_params:k] = _state_layout(optimizer, params, specs[k:], k - n_params)
        outs = (*specs[len(specs) - n_params :], *specs[n_params : len(specs) - n_params])
        return Shardings(self.mesh, tuple(specs), outs)

    def _batch_spec(self, shape: Sequence[int]) -> PartitionSpec:
        split = len(shape) and shape[0] % self.size == 0
        return PartitionSpec(self.axis) if split else PartitionSpec()

    def _feed_specs(
        self, graph: Any, n_inputs: int, trainable: Sequence[str], params: Any, n_keys: int
    ) -> list[PartitionSpec]:
        """Specs of a :class:`~fnnc.models.programs.ModelFeed`: inputs, params, keys."""
        specs = []
        for i, sid in enumerate(graph.inputs[: n_inputs + len(params)]):
            shape = graph.symbols[sid].shape
            if i < n_inputs:
                specs.append(self._batch_spec(shape))
            else:
                pid = params[i - n_inputs]
                specs.append(self.param_spec(shape, pid in trainable, pid))
        return specs + [PartitionSpec()] * n_keys


def _state_layout(
    optimizer: Any, params: Sequence[Any], specs: Sequence[Any], n_state: int
) -> list[PartitionSpec]:
    """Optimizer-state specs (:func:`~fnnc.graph.state_specs`); replicated if unaligned."""
    found = state_specs(optimizer, params, specs)
    return found if len(found) == n_state else [PartitionSpec()] * n_state
