"""A cnnp :class:`~fnnc.models.Model` in a dynamic graph (NNC's "dynamic graph to
evaluate cnnp model", with and without parameters).

:meth:`DynamicGraph.evaluate(model, inputs) <fnnc.graph.DynamicGraph.evaluate>` records
the model as ONE ``call[graph]`` node: the graph is the model's forward
(:meth:`Model.forward_graph <fnnc.models.Model.forward_graph>`) with the parameters as
extra inputs, so gradients flow through the node to the inputs and to the parameters.

A model that was never compiled is compiled here from the specs of the inputs it is
given, without loss or minimizer, as NNC's ``ccv_nnc_dynamic_graph_evaluate`` compiles
it (:func:`compile_for`); the dynamic graph's optimizer trains it, not the model's.

The parameters are variables of the dynamic graph, made once per model from
:meth:`Model.parameters` (:func:`parameters`; trainable ones as ``dg.variable``, the
rest as constants). ``dg.minimize`` / ``dg.apply_gradients`` on them update the
variables (as do ``dg.set``, writes and ``exec(outputs=)``); :func:`sync` then writes
the new values back into the model, so ``model.parameters()`` (and ``model.evaluate``,
``model.save``) see them. The other way, a
change the model makes itself (``set_parameters``, ``fit``, a checkpoint restored) is
seen at the next ``dg.evaluate`` / ``dg.parameters``: the variables of the parameters
whose arrays the model replaced take their new values (:meth:`_Bound.refresh`; one
identity check per parameter, nothing copied when none changed). NNC holds one copy
of the parameters; the two copies here behave as that one.

``evaluate(model, inputs, is_test=False)`` records the training-mode forward
(:meth:`Model.training_graph <fnnc.models.Model.training_graph>`): Dropout draws its
keys from the model's stream, BatchNorm uses the batch's statistics and its new
running statistics go into their variables (constants), and on into the model at
once (in lazy mode at the next ``minimize`` / ``apply_gradients``), as ``fit`` keeps
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax

from fnnc.core.ir import Graph
from fnnc.errors import GraphError, ModelError
from fnnc.ops.call import call

from .variable import Variable
from .versions import detach, repin, set_value

if TYPE_CHECKING:
    from .graph import DynamicGraph


class _Bound:
    """A model's parameter variables in one dynamic graph, the versions last synced
    into the model (``synced``), the model's own arrays last synced from it (``seen``),
    and its forward graphs by (input specs, is_test)."""

    __slots__ = ("graphs", "model", "seen", "synced", "trainable", "variables")

    def __init__(self, dg: DynamicGraph, model: Any) -> None:
        self.model = model
        engine = model.engine
        values = model.parameters()
        infos = engine.infos
        self.trainable = [p for p in values if infos[p].trainable]
        self.variables: dict[str, Variable] = {
            pid: (dg.variable if pid in self.trainable else dg.constant)(value, name=pid)
            for pid, value in values.items()
        }
        self.synced = {pid: v._slot.version for pid, v in self.variables.items()}
        self.seen = dict(engine.values)  # the model's arrays (held: an id could be reused)
        self.graphs: dict[tuple[Any, ...], Any] = {}

    def refresh(self, dg: DynamicGraph) -> None:
        """Gives the variables of the parameters the model replaced since the last
        sync (``set_parameters``, ``fit``, a restore: each makes new arrays) their new
        values; the model's change wins over a variable's unsynced one."""
        values = self.model.engine.values
        seen = self.seen
        changed = [pid for pid, v in values.items() if seen.get(pid) is not v]
        if not changed:
            return
        for pid in changed:
            var = self.variables.get(pid)
            if var is not None and var._slot is not None:  # a copy: the model donates its own
                set_value(dg, var, self.model.engine._host(values[pid]))
                self.synced[pid] = var._slot.version
        self.seen = dict(values)

    def push(self, dg: DynamicGraph) -> None:
        """Writes the variables that changed since the last sync into the model."""
        changed = {}
        for pid, var in self.variables.items():
            slot = var._slot
            if slot is not None and slot.version is not self.synced[pid]:
                changed[pid] = dg.value_of(var)
                self.synced[pid] = slot.version
        if changed:
            values = self.model.engine.values
            before = dict(values)
            self.model.set_parameters(changed)
            # what set_parameters replaced (a mesh re-places them all) is our change
            self.seen.update((p, v) for p, v in values.items() if v is not before.get(p))

    def forward(self, specs: list[jax.ShapeDtypeStruct], is_test: bool) -> Any:
        """The model's forward for ``specs``: ``(graph, parameter ids)`` in test mode,
        else its ``TrainingGraph``; built once per specs and mode, as ``Model.evaluate``
        and ``fit`` run it (after ``compile``'s ``precision`` cast and forward passes)."""
        key = (*((s.shape, s.dtype) for s in specs), is_test)
        got = self.graphs.get(key)
        if got is None:
            model = self.model
            got = self.graphs[key] = (
                model.forward_graph(specs, is_test=True, as_evaluated=True)
                if is_test
                else model.training_graph(specs, as_evaluated=True)
            )
        return got


def is_model(model: Any) -> bool:
    """Whether ``model`` is a cnnp model (it has ``forward_graph``)."""
    return callable(getattr(model, "forward_graph", None))


def _bound(dg: DynamicGraph, model: Any) -> _Bound:
    if not is_model(model):
        raise GraphError(f"parameters: expected a cnnp Model, got {type(model).__name__}")
    bound = dg._models.get(id(model))
    if bound is None or bound.model is not model:
        bound = dg._models[id(model)] = _Bound(dg, model)
    else:
        bound.refresh(dg)
    return bound


def compile_for(model: Any, specs: Sequence[jax.ShapeDtypeStruct]) -> None:
    """Compiles ``model`` for inputs like ``specs`` unless it already is (NNC's rule).

    Only through the model's own interface (``engine``, ``compile``), so this layer
    needs nothing from :mod:`fnnc.models`: a compiled model keeps its input specs,
    loss and minimizer; one that never was gets these specs and neither of the others.
    """
    try:
        _ = model.engine
    except ModelError:  # "not compiled": the one thing a model's engine property raises
        model.compile(list(specs))


def parameters(dg: DynamicGraph, model: Any) -> dict[str, Variable]:
    """The trainable parameters of ``model`` as variables of ``dg``, by parameter id
    (the same variables every call; what ``dg.minimize`` should update)."""
    bound = _bound(dg, model)
    return {pid: bound.variables[pid] for pid in bound.trainable}


def output_count(model: Any) -> int | None:
    """How many output variables :func:`evaluate` of ``model`` makes (pytree leaves for a
    traced graph), known before it runs; ``None`` where the model does not say."""
    if not is_model(model):
        return len(graph_of(model).outputs)
    outs = getattr(model, "outputs", None)
    return len(outs) if isinstance(outs, (list, tuple)) else None


def evaluate(
    dg: DynamicGraph, model: Any, inputs: Sequence[Any], name: str, is_test: bool = True
) -> Any:
    """Records ``model`` (a cnnp model, a graph, a program) on ``inputs`` as one
    ``call`` node; its output variable(s) (a pytree for a traced graph). A cnnp model
    runs in test mode unless ``is_test`` is False (see the module doc)."""
    inputs = _inputs(dg, model, inputs, name)
    if not is_model(model):
        if not is_test:
            raise GraphError(
                f"evaluate: is_test=False selects a cnnp Model's training mode; a "
                f"{type(model).__name__} has one mode (drop is_test)"
            )
        graph = graph_of(model)
        outs = dg.exec(call(graph=graph), *inputs, name=name)
        if graph.out_tree is not None:
            leaves = outs if isinstance(outs, tuple) else (outs,)
            return jax.tree.unflatten(graph.out_tree, list(leaves))
        return outs
    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs]
    compile_for(model, specs)
    bound = _bound(dg, model)
    if is_test:
        graph, pids = bound.forward(specs, True)
        return dg.exec(
            call(graph=graph), *_args(bound, model, inputs, pids), name=name or model.describe()
        )
    fwd = bound.forward(specs, False)
    args = [*_args(bound, model, inputs, fwd.params), *model.random_keys(fwd.n_keys)]
    outs = dg.exec(call(graph=fwd.graph), *args, name=name or model.describe())
    outs = outs if isinstance(outs, tuple) else (outs,)
    n = len(outs) - len(fwd.updates)
    _keep_updates(dg, bound, fwd.updates, outs[n:])
    return outs[0] if n == 1 else outs[:n]


def _inputs(dg: DynamicGraph, model: Any, inputs: Any, name: str) -> list[Any]:
    """``inputs`` as a list of variables: arrays and numbers become constants, as
    ``exec`` takes them (a list of numbers had no ``.shape``: an AttributeError). A
    variable or array given for the list was iterated row by row into inputs."""
    if not isinstance(inputs, (list, tuple)):
        raise GraphError(
            f"evaluate{' ' + repr(name) if name else ''}: inputs is a list with one entry "
            f"per input of the model, got {type(inputs).__name__}; pass [x] for one input"
        )
    return [x if isinstance(x, Variable) else dg.constant(x) for x in inputs]


def _args(bound: _Bound, model: Any, inputs: Sequence[Any], pids: Sequence[str]) -> list[Any]:
    missing = [p for p in pids if p not in bound.variables]
    if missing:
        raise GraphError(
            f"evaluate: model {model.describe()} has parameters {missing} that the dynamic "
            "graph did not see when it first evaluated the model; evaluate a model in a "
            "dynamic graph only after model.compile(...) with these input shapes"
        )
    return [*inputs, *(bound.variables[p] for p in pids)]


def _keep_updates(
    dg: DynamicGraph, bound: _Bound, pids: Sequence[str], values: Sequence[Variable]
) -> None:
    """The internals' new values (batch norm's running statistics) become their
    variables' values, as constants, and go into the model (eagerly: at once)."""
    if not pids:
        return
    for pid, value in zip(pids, values):
        # statistics carry no gradient (what only they fed is pruned at the record's
        # limit, not once per statistic and step as dg.detach's collect would)
        detach(dg, value, collect=False)
        repin(dg, bound.variables[pid]._slot, value._slot.version)
    if not dg.lazy:
        bound.push(dg)


def graph_of(model: Any) -> Graph:
    """``model`` itself, or its ``.graph`` (a :class:`~fnnc.graph.Program`)."""
    graph = model if isinstance(model, Graph) else getattr(model, "graph", None)
    if not isinstance(graph, Graph):
        raise GraphError(
            f"evaluate: expected a Graph, a Program, a compiled cnnp Model or an object "
            f"with a .graph Graph, got {type(model).__name__}"
        )
    return graph


def sync(dg: DynamicGraph) -> None:
    """Writes parameter variables that changed since the last sync into their models."""
    for bound in dg._models.values():
        bound.push(dg)
