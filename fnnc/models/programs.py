"""The compiled programs of a cnnp engine: one typed record per kind, fed by position.

Each record holds a compiled :class:`~fnnc.graph.compile.Program` and its positional
layout, as :class:`~fnnc.graph.passes.minimize.TrainLayout` does for a bare training
step. A program's graph inputs are put in the record's order when it is built, so a
call is one positional call, with no names looked up:

============  ==================================================  ============================
record        inputs                                              outputs
============  ==================================================  ============================
forward       model inputs, parameters, keys                      outputs, internals'
gradient      model inputs, parameters, keys, output gradients    parameter grads, input grads
apply         gradients, optimizer state, parameters              parameters', state'
fit           trainable parameters, optimizer state, model        parameters', state', loss,
              inputs, other parameters, keys, targets[, loss      internals'[, loss scale']
              scale]
============  ==================================================  ============================

"loss scale" is the state of float16 training's dynamic loss scaling
(:mod:`fnnc.models.loss_scale`), when it is on.

"model inputs, parameters, keys" is a :class:`ModelFeed`. Graph inputs keep their names
(``input[0]``, ``t-linear-0-0``, ``key[0]``, ``opt_state[0]``, ``hyper[0]``) for printing
only. The optimizer state of ``fit`` and ``apply`` ends with the minimizers'
hyper-parameters (``hyper[i]``, passed through unchanged), so a new learning rate is a
new input value, not a new program (:mod:`fnnc.graph.dynamic.minimizer_key`). ``evaluate`` with
``requires_grad`` and ``backward`` without a mesh are the records of
:mod:`fnnc.models.residuals`.

``fit`` and ``apply`` donate the parameters and optimizer state they update (the
engine owns those buffers and replaces them with the outputs), so XLA writes the new
values in place: a step holds one copy of them. ``fit`` and ``gradient`` take a
``memory`` transform (:class:`fnnc.models.memory.MemoryOptions`) applied to the graph
with its backward before ``simplify``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from fnnc.core.ir import Graph, Symbol
from fnnc.graph import GraphBuilder, compile, simplify
from fnnc.graph.compile import Program
from fnnc.graph.passes import linear_crossentropy_mean
from fnnc.graph.passes.backward import backward as backward_pass
from fnnc.graph.passes.linear_crossentropy import fuse_linear_crossentropy
from fnnc.graph.passes.loss_scale import minimize_scaled
from fnnc.graph.passes.minimize import TrainLayout, minimize
from fnnc.models import losses
from fnnc.models.layer import BuildContext, ModelError
from fnnc.models.model_passes import NO_PASSES, ModelPasses
from fnnc.models.parallel import Placed
from fnnc.ops.optimizer import optax_update_command


@dataclasses.dataclass(frozen=True)
class ModelFeed:
    """The inputs of a model build, in order: ``n_inputs`` model inputs, the
    parameters ``params`` (ids, internals included), then ``n_keys`` random keys."""

    n_inputs: int
    params: tuple[str, ...]
    n_keys: int

    def args(
        self, inputs: Sequence[Any], values: Mapping[str, Any], keys: Sequence[Any]
    ) -> list[Any]:
        """The positional arguments for model ``inputs``, parameter ``values`` and ``keys``."""
        return [*inputs, *[values[p] for p in self.params], *keys]


@dataclasses.dataclass(frozen=True)
class ModelGraph:
    """One build of a model: its context and its input and output symbols."""

    ctx: BuildContext
    inputs: tuple[Symbol, ...]
    outputs: tuple[Symbol, ...]

    def feed(self, params: Sequence[str]) -> tuple[ModelFeed, list[int]]:
        """The :class:`ModelFeed` for ``params``, and the symbol ids it feeds, in order."""
        ctx = self.ctx
        ids = [x.id for x in self.inputs]
        ids += [ctx.symbols[p].id for p in params]
        ids += [k.id for k in ctx.keys]
        return ModelFeed(len(self.inputs), tuple(params), len(ctx.keys)), ids


class _Compiled:
    program: Program

    @property
    def names(self) -> tuple[str, ...]:
        """The graph's input names in feeding order (for diagnostics; calls go by position)."""
        graph = self.program.graph
        return tuple(graph.symbols[i].name for i in graph.inputs)


@dataclasses.dataclass(frozen=True)
class ForwardProgram(_Compiled):
    """``evaluate``: inputs ``feed``; outputs the ``n_outputs`` model outputs, then the
    new values of the internals ``updates`` (ids; BatchNorm statistics when training)."""

    program: Program
    feed: ModelFeed
    n_outputs: int
    updates: tuple[str, ...]

    def __call__(
        self, inputs: Sequence[Any], values: Mapping[str, Any], keys: Sequence[Any]
    ) -> tuple[list[Any], list[Any]]:
        """``(outputs, new internals)`` (the latter in ``updates`` order)."""
        results = _as_list(self.program(*self.feed.args(inputs, values, keys)))
        return results[: self.n_outputs], results[self.n_outputs :]


@dataclasses.dataclass(frozen=True)
class GradientProgram(_Compiled):
    """``backward``: inputs ``feed`` then one gradient per model output (shaped
    ``out_shapes``, of types ``out_dtypes``); outputs the gradients of ``params`` (ids),
    then of the differentiable model inputs."""

    program: Program
    feed: ModelFeed
    out_shapes: tuple[tuple[int, ...], ...]
    params: tuple[str, ...]
    out_dtypes: tuple[np.dtype, ...] = ()

    def __call__(
        self,
        inputs: Sequence[Any],
        values: Mapping[str, Any],
        keys: Sequence[Any],
        ingrads: Sequence[Any],
    ) -> tuple[list[Any], list[Any]]:
        """``(parameter gradients, input gradients)``."""
        args = self.feed.args(inputs, values, keys)
        results = _as_list(self.program(*args, *ingrads))
        n = len(self.params)
        return results[:n], results[n:]


@dataclasses.dataclass(frozen=True)
class ApplyProgram(_Compiled):
    """``apply_gradients``: inputs the gradients of ``params`` (ids), ``n_state``
    optimizer-state leaves, then the parameters; outputs the new parameters, then the
    new state leaves (a ``state_tree``)."""

    program: Program
    params: tuple[str, ...]
    n_state: int
    state_tree: Any

    def __call__(
        self, grads: Sequence[Any], leaves: Sequence[Any], values: Mapping[str, Any]
    ) -> tuple[list[Any], Any]:
        """``(new parameters, new per-parameter states)``, both in ``params`` order."""
        results = _as_list(self.program(*grads, *leaves, *[values[p] for p in self.params]))
        n = len(self.params)
        return results[:n], jax.tree.unflatten(self.state_tree, results[n:])


@dataclasses.dataclass(frozen=True)
class FitProgram(_Compiled):
    """``fit``, the fused step: inputs the trainable ``params`` (ids), the optimizer
    state leaves (both placed by ``train``), ``feed`` (model inputs, the other
    parameters, keys) and ``n_targets`` targets; outputs the new parameters, the new
    state leaves, the loss, then the new values of the internals ``updates``."""

    program: Program
    train: TrainLayout
    params: tuple[str, ...]
    feed: ModelFeed
    n_targets: int
    updates: tuple[str, ...]
    n_scale: int = 0

    def __call__(
        self,
        leaves: Sequence[Any],
        inputs: Sequence[Any],
        targets: Sequence[Any],
        values: Mapping[str, Any],
        keys: Sequence[Any],
        scale: Sequence[Any] = (),
    ) -> tuple[list[Any], list[Any], Any, list[Any], tuple[Any, ...]]:
        """``(new parameters, new state leaves, loss, new internals, new scale state)``;
        ``scale``: the ``n_scale`` loss-scale arrays (:mod:`fnnc.models.loss_scale`)."""
        params = [values[p] for p in self.params]
        args = self.feed.args(inputs, values, keys)
        results = _as_list(self.program(*params, *leaves, *args, *targets, *scale))
        new_params, new_state, loss = self.train.split(results)
        rest = results[self.train.n_params + self.train.n_state + 1 :]
        cut = len(rest) - self.n_scale
        return new_params, new_state, loss, rest[:cut], tuple(rest[cut:])


# -- building ---------------------------------------------------------------------
def forward_program(
    built: ModelGraph,
    parallel: Any = None,
    trainable: Sequence[str] = (),
    precision: Any = None,
    passes: ModelPasses = NO_PASSES,
) -> ForwardProgram:
    """The program of ``evaluate`` for one build; ``parallel``
    (:class:`fnnc.models.parallel.Parallel`) lays it out on a mesh, ``precision``
    (:class:`fnnc.models.precision.Precision`) casts its compute type, ``passes``
    (:mod:`fnnc.models.model_passes`) rewrite it."""
    ctx = built.ctx
    outputs = [*built.outputs, *ctx.updates.values()]
    graph, feed = evaluated_graph(built, outputs, precision, passes, parallel)
    if parallel is None:
        program = compile(graph)
    else:
        plan = parallel.forward_plan(graph, len(built.inputs), trainable, feed.params)
        program = Placed(compile(graph, shardings=plan))
    return ForwardProgram(program, feed, len(built.outputs), tuple(ctx.updates))


def evaluated_graph(
    built: ModelGraph,
    outputs: Sequence[Any],
    precision: Any = None,
    passes: ModelPasses = NO_PASSES,
    parallel: Any = None,
) -> tuple[Graph, ModelFeed]:
    """The graph of ``outputs`` (symbols of ``built``) as ``evaluate`` runs it, and its
    feed: the ``precision`` cast, the forward ``passes``, ``parallel``'s mesh
    constraints, then the inputs in the feed's order. :func:`forward_program` compiles
    it and model export (``forward_graph(as_evaluated=True)``) interprets it, so the two
    cannot drift apart."""
    graph = built.ctx.b.build(list(outputs))
    graph = precision(graph) if precision is not None else graph
    graph, ids = passes.run_forward(graph)
    graph = parallel.constrain(graph) if parallel is not None else graph
    feed, order = built.feed(tuple(built.ctx.params))
    return _ordered(graph, [ids(i) for i in order]), feed


Transform = Callable[[Graph], Graph]


def gradient_program(
    built: ModelGraph,
    wrt_params: Sequence[str],
    diff_inputs: Sequence[int],
    memory: Transform | None = None,
    parallel: Any = None,
    passes: ModelPasses = NO_PASSES,
    precision: Any = None,
) -> GradientProgram:
    """The program of ``backward``: gradients w.r.t. those of ``wrt_params`` this build
    has, then w.r.t. model inputs ``diff_inputs``, seeded with the output gradients;
    ``parallel`` lays it out on a mesh as ``fit`` is; ``precision`` casts the forward's
    compute type as ``evaluate`` and the residual backward do."""
    ctx, outs = built.ctx, built.outputs
    dfs = [ctx.b.input(o.shape, o.dtype, name=f"df[{i}]") for i, o in enumerate(outs)]
    graph = ctx.b.build(list(outs))
    graph = precision(graph) if precision is not None else graph  # keeps input ids
    graph, ids = passes.run_forward(graph)
    graph = parallel.constrain(graph) if parallel is not None else graph
    params = tuple(p for p in wrt_params if p in ctx.symbols)
    wrt = [ctx.symbols[p] for p in params] + [built.inputs[i] for i in diff_inputs]
    dfs_ids = [ids(d.id) for d in dfs]
    grad_graph, _ = backward_pass(graph, graph.outputs, [ids(w.id) for w in wrt], df=dfs_ids)
    grad_graph = dataclasses.replace(grad_graph, outputs=grad_graph.outputs[len(outs) :])
    feed, order = built.feed(tuple(ctx.params))
    grad_graph = _ordered(grad_graph, [*(ids(i) for i in order), *dfs_ids])
    if memory is not None:
        grad_graph = memory(grad_graph)
    shapes = tuple(tuple(o.shape) for o in outs)
    grad_graph = passes.run_training(simplify(grad_graph))
    if parallel is None:
        program = compile(grad_graph)
    else:
        plan = parallel.gradient_plan(grad_graph, feed, wrt_params, params)
        program = Placed(compile(grad_graph, shardings=plan))
    dtypes = tuple(np.dtype(o.dtype) for o in outs)
    return GradientProgram(program, feed, shapes, params, dtypes)


def apply_program(
    transform: Any,
    pids: Sequence[str],
    specs: Sequence[Any],
    parallel: Any = None,
    n_hyper: int = 0,
) -> ApplyProgram:
    """The program of ``apply_gradients``: ``transform`` (per parameter) on ``pids``;
    ``parallel`` lays it out on a mesh as ``fit`` lays out parameters and state; the
    last ``n_hyper`` state leaves are hyper-parameters (:mod:`fnnc.graph.dynamic.minimizer_key`)."""
    b = GraphBuilder()
    cmd = optax_update_command(transform, list(specs))
    grads = [b.input(s.shape, s.dtype, name=f"grad[{p}]") for p, s in zip(pids, specs)]
    n_state = len(cmd.param("state_specs"))
    state = [
        b.input(shape, dtype, name=_state_name(i, n_state, n_hyper))
        for i, (shape, dtype) in enumerate(cmd.param("state_specs"))
    ]
    params = [b.input(s.shape, s.dtype, name=p) for p, s in zip(pids, specs)]
    outs = b.exec(cmd, *grads, *state, *params, name="optimizer")
    graph = b.build(list(outs) if isinstance(outs, tuple) else [outs])
    donated = range(len(grads), len(graph.inputs))  # state and parameters, updated in place
    if parallel is None:
        program = compile(graph, donate=donated)
    else:
        plan = parallel.apply_plan(graph, len(pids))
        program = Placed(compile(graph, donate=donated, shardings=plan))
    return ApplyProgram(program, tuple(pids), len(state), cmd.param("state_tree").value)


def fit_program(
    built: ModelGraph,
    loss: Any,
    target_specs: Sequence[Any],
    pids: Sequence[str],
    transform: Any,
    memory: Transform | None = None,
    parallel: Any = None,
    precision: Any = None,
    n_hyper: int = 0,
    passes: ModelPasses = NO_PASSES,
) -> FitProgram:
    """The fused training step: ``loss`` against targets, minimized over ``pids``;
    ``parallel`` (:class:`fnnc.models.parallel.Parallel`) lays it out on a mesh; the
    last ``n_hyper`` state leaves are hyper-parameters (:mod:`fnnc.graph.dynamic.minimizer_key`)."""
    ctx = built.ctx
    b = ctx.b
    ts = [b.input(s.shape, s.dtype, name=f"target[{i}]") for i, s in enumerate(target_specs)]
    model_nodes = len(b._nodes)  # the builder appends: the loss's nodes follow these
    loss_sym = losses.build_loss(b, loss, built.outputs, ts)
    graph = b.build([loss_sym, *ctx.updates.values()])
    if precision is not None:  # keeps input ids: parameters are still ctx.symbols[p]
        graph = precision(graph, float32_from=model_nodes)  # the loss in float32
    graph, ids = passes.run_forward(graph)
    graph = parallel.constrain(graph) if parallel is not None else graph
    graph = fuse_linear_crossentropy(graph)  # keeps ids too; before backward, so it pays
    if linear_crossentropy_mean.IN_FIT:  # a training step: its gradient made in the forward
        graph = linear_crossentropy_mean.fuse_linear_crossentropy_mean(graph)
    loss_id = graph.outputs[0]
    scaling = getattr(precision, "loss_scale", None)
    wrt = [ids(ctx.symbols[p].id) for p in pids]
    if scaling is not None:  # loss scale state: last inputs and outputs
        step, train = minimize_scaled(graph, loss_id, wrt, transform, scaling=scaling)
    else:
        step, train = minimize(graph, loss_id, wrt, transform)
        step = dataclasses.replace(step, outputs=step.outputs + graph.outputs[1:])
    n_scale = 2 if scaling is not None else 0
    step = _hyper_named(step, train, n_hyper)
    trainable = set(pids)
    feed, order = built.feed(tuple(p for p in ctx.params if p not in trainable))
    head = step.inputs[: train.n_params + train.n_state]
    tail = step.inputs[len(step.inputs) - n_scale :]
    step = _ordered(step, [*head, *(ids(i) for i in order), *(ids(t.id) for t in ts), *tail])
    if memory is not None:
        step = memory(step)
    donated = tuple(range(train.n_params + train.n_state))  # parameters and state, in place
    step = passes.run_training(simplify(step), donated)
    if parallel is None:
        program = compile(step, donate=donated)
    else:
        plan = parallel.fit_plan(step, train, len(built.inputs), len(ts), n_scale, ctx.updates)
        program = Placed(compile(step, donate=donated, shardings=plan))
    return FitProgram(
        program,
        train,
        tuple(pids),
        feed,
        len(ts),
        tuple(ctx.updates),
        n_scale,
    )


def _ordered(graph: Graph, ids: Sequence[int]) -> Graph:
    """``graph`` with its inputs in the order ``ids`` (which must be exactly its inputs)."""
    if len(ids) != len(graph.inputs) or set(ids) != set(graph.inputs):
        extra = [graph.label(i) for i in graph.inputs if i not in set(ids)]
        raise ModelError(
            f"the model's graph has inputs the engine does not feed: {extra}; layers take "
            "parameters from ctx.param and random keys from ctx.key"
        )
    return dataclasses.replace(graph, inputs=tuple(ids))


def _state_name(i: int, n_state: int, n_hyper: int) -> str:
    first = n_state - n_hyper
    return f"opt_state[{i}]" if i < first else f"hyper[{i - first}]"


def _hyper_named(graph: Graph, train: TrainLayout, n_hyper: int) -> Graph:
    """``graph`` with its last ``n_hyper`` optimizer-state inputs named ``hyper[i]``."""
    if not n_hyper:
        return graph
    end = train.n_params + train.n_state
    symbols = list(graph.symbols)
    for i, sid in enumerate(graph.inputs[end - n_hyper : end]):
        symbols[sid] = dataclasses.replace(symbols[sid], name=f"hyper[{i}]")
    return dataclasses.replace(graph, symbols=tuple(symbols))


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]
