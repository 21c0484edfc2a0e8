"""Evaluate once, differentiate later: the residuals NNC keeps between the two.

``evaluate(..., requires_grad=True)`` runs ONE program that returns the model outputs,
the internals' updates and the *residuals*: the forward values the backward reads.
``backward(ingrads)`` runs a second program that takes those residuals and the output
gradients, so the forward never runs twice (NNC's ``ccv_cnnp_model_evaluate`` with
``requires_grad`` followed by ``ccv_cnnp_model_backward``).

Both programs come from one graph: the model's forward with the
:func:`~fnnc.graph.passes.backward.backward` pass seeded by inputs ``df[i]``, with the
memory options (checkpointing, compression, reduction) and ``simplify`` applied, then
cut in two by :func:`split_at_seeds`:

* a node that reads or writes anything computed from a seed is **backward**;
* a node the forward outputs need is **forward**;
* any other node (it feeds only the backward) runs in the backward when that keeps
  no more bytes alive than keeping its outputs would (a constant, a zero fill, a
  widening conversion, a decompression), else in the forward (a compression).

The residuals are the roots the backward nodes read (or keep writing) that the
forward half made or the feed holds. Before / after, for ``y = relu(x W^T)``::

    graph(%0 x, %1 W, %2 df) {             forward(%0 x, %1 W) {
      %3 = gemm(%0, %1)                       %3 = gemm(%0, %1)
      %4 = relu(%3)                           %4 = relu(%3)
      %5 = relu.backward(%2, %4)              return %4, %4     # output, residual
      %6 = gemm.backward(%5, %0, %1)        }
      return %4, %6                         backward(%0 x, %4, %2 df) {
    }                                         %5 = relu.backward(%2, %4)
                                              %6 = gemm.backward(%5, %0, %1)
                                              return %6
                                            }

Residuals from the feed (the batch, the keys) are the arrays ``evaluate`` was given;
parameters are read at ``backward`` time, as NNC's backward reads its parameter
tensors (an ``apply_gradients`` in between is seen). The engine keeps the residuals
until the next ``evaluate(..., requires_grad=True)``, so ``backward`` may run several
times (its parameter gradients accumulate); an ``evaluate`` without
``requires_grad`` leaves them alone.

Input gradients (NNC's ``outgrads``): the forward keeps what the gradients of every
floating-point model input need, and each ``backward`` program returns the parameter
gradients plus the input gradients asked for; asking for none drops the nodes that
compute them (:func:`backward_program`).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from fnnc.core.dtypes import is_inexact
from fnnc.core.ir import Graph, unit_axes_apart
from fnnc.errors import DTypeError, ShapeError
from fnnc.graph import compile, simplify
from fnnc.graph.compile import Program
from fnnc.graph.memory import tensor_bytes
from fnnc.graph.passes import dce
from fnnc.graph.passes._subgraphs import is_pure
from fnnc.graph.passes.backward import backward as backward_pass
from fnnc.models.layer import ModelError
from fnnc.models.model_passes import NO_PASSES, ModelPasses
from fnnc.models.programs import (
    ForwardProgram,
    ModelGraph,
    Transform,
    _as_list,
    _Compiled,
    _ordered,
)


@dataclasses.dataclass(frozen=True)
class Halves:
    """A forward + backward graph cut at its seeds (see :func:`split_at_seeds`).

    Attributes:
        forward: feed -> forward outputs, then the ``n_computed`` residuals it made.
        backward: residuals from the feed (positions ``from_feed``), the computed
            ones, then the seeds -> the gradients.
        from_feed: positions in the feed of the inputs the backward reads.
        n_computed: residuals the forward returns.
    """

    forward: Graph
    backward: Graph
    from_feed: tuple[int, ...]
    n_computed: int


def split_at_seeds(graph: Graph, n_feed: int, n_forward: int) -> Halves:
    """Cuts ``graph`` (inputs: ``n_feed`` feed inputs then seeds; outputs: ``n_forward``
    forward outputs then gradients) into the forward and the backward it contains.

    Raises:
        ModelError: a forward output depends on a seed.
    """
    sym, nodes = graph.symbols, graph.nodes
    seeded, tainted = _seeded(graph, n_feed)
    for s in graph.outputs[:n_forward]:
        if sym[s].root in tainted:
            raise ModelError(
                f"backward: forward output {graph.label(s)} depends on an output gradient; "
                "the forward and backward of this model cannot be separated"
            )
    placed = _place(graph, n_forward, seeded)
    early_roots = {sym[o].root for i, n in enumerate(nodes) if not placed[i] for o in n.outputs}
    feed_roots = [sym[s].root for s in graph.inputs[:n_feed]]
    kept: dict[int, None] = {}
    late_nodes = [n for i, n in enumerate(nodes) if placed[i]]
    read = [s for n in late_nodes for s in (*n.inputs, *n.outputs)]
    for s in (*read, *graph.outputs[n_forward:]):
        root = sym[s].root
        if root in early_roots or root in feed_roots:
            kept.setdefault(root, None)
    from_feed = tuple(feed_roots.index(r) for r in kept if r in feed_roots)
    computed = tuple(r for r in kept if r not in feed_roots)
    forward = dataclasses.replace(
        graph,
        nodes=tuple(n for i, n in enumerate(nodes) if not placed[i]),
        inputs=graph.inputs[:n_feed],
        outputs=(*graph.outputs[:n_forward], *computed),
        out_tree=None,
    )
    backward = dataclasses.replace(
        graph,
        nodes=tuple(late_nodes),
        inputs=(*(graph.inputs[i] for i in from_feed), *computed, *graph.inputs[n_feed:]),
        outputs=graph.outputs[n_forward:],
        out_tree=None,
    )
    return Halves(forward, backward, from_feed, len(computed))


def _seeded(graph: Graph, n_feed: int) -> tuple[list[bool], set[int]]:
    """Per node, whether it reads or writes a value computed from a seed; and those roots."""
    sym = graph.symbols
    tainted = {sym[s].root for s in graph.inputs[n_feed:]}
    late = []
    for node in graph.nodes:
        roots = {sym[s].root for s in (*node.inputs, *node.outputs)}
        hit = not tainted.isdisjoint(roots)
        if hit:
            tainted.update(sym[s].root for s in node.outputs)
        late.append(hit)
    return late, tainted


def _place(graph: Graph, n_forward: int, late: list[bool]) -> list[bool]:
    """``late`` plus the unseeded nodes that are cheaper to run in the backward."""
    sym, nodes = graph.symbols, graph.nodes
    late = list(late)
    need = {sym[s].root for s in graph.outputs[:n_forward]}
    needed = [False] * len(nodes)
    for i in range(len(nodes) - 1, -1, -1):
        if not late[i] and any(sym[o].root in need for o in nodes[i].outputs):
            needed[i] = True
            need.update(sym[s].root for s in nodes[i].inputs)
    touch: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):
        for r in dict.fromkeys(sym[s].root for s in (*node.inputs, *node.outputs)):
            touch.setdefault(r, []).append(i)
    grads = {sym[s].root for s in graph.outputs[n_forward:]}
    for i in range(len(nodes) - 1, -1, -1):
        node = nodes[i]
        if late[i] or needed[i] or not is_pure(node.cmd):
            continue
        outs = dict.fromkeys(sym[o].root for o in node.outputs)
        users = [j for r in outs for j in touch[r] if j != i]
        if not all(late[j] for j in users) or not (users or grads.intersection(outs)):
            continue
        ins = dict.fromkeys(sym[s].root for s in node.inputs)
        late[i] = _bytes(graph, outs) >= _bytes(graph, ins)
    return late


def _bytes(graph: Graph, roots: Any) -> int:
    return sum(tensor_bytes(graph.symbols[r].shape, graph.symbols[r].dtype) for r in roots)


# -- programs ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ResidualForward(ForwardProgram):
    """``evaluate(..., requires_grad=True)``: a :class:`ForwardProgram` that also
    returns ``n_residuals`` residuals, and the :class:`Halves` it came from."""

    n_residuals: int
    halves: Halves
    params: tuple[str, ...]

    def run(
        self, inputs: Sequence[Any], values: Mapping[str, Any], keys: Sequence[Any]
    ) -> tuple[list[Any], list[Any], list[Any]]:
        """``(outputs, new internals, residuals)``."""
        results = _as_list(self.program(*self.feed.args(inputs, values, keys)))
        n, m = self.n_outputs, len(results) - self.n_residuals
        return results[:n], results[n:m], results[m:]

    def __call__(
        self, inputs: Sequence[Any], values: Mapping[str, Any], keys: Sequence[Any]
    ) -> tuple[list[Any], list[Any]]:
        """``(outputs, new internals)``, as :class:`ForwardProgram` (residuals dropped)."""
        outputs, updates, _ = self.run(inputs, values, keys)
        return outputs, updates


@dataclasses.dataclass(frozen=True)
class ResidualGradient(_Compiled):
    """``backward`` from residuals: inputs the feed values at ``from_feed``, the
    computed residuals, one gradient per model output (shaped ``out_shapes``, of types
    ``out_dtypes``); outputs the gradients of ``params`` (ids), then of the model inputs
    ``wrt_inputs``."""

    program: Program
    from_feed: tuple[int, ...]
    out_shapes: tuple[tuple[int, ...], ...]
    params: tuple[str, ...]
    wrt_inputs: tuple[int, ...]
    out_dtypes: tuple[np.dtype, ...] = ()

    def __call__(
        self, feed_args: Sequence[Any], residuals: Sequence[Any], ingrads: Sequence[Any]
    ) -> tuple[list[Any], list[Any]]:
        """``(parameter gradients, input gradients)``."""
        picked = [feed_args[i] for i in self.from_feed]
        results = _as_list(self.program(*picked, *residuals, *ingrads))
        n = len(self.params)
        return results[:n], results[n:]


def residual_forward(
    built: ModelGraph,
    wrt_params: Sequence[str],
    diff_inputs: Sequence[int],
    memory: Transform | None = None,
    precision: Any = None,
    passes: ModelPasses = NO_PASSES,
) -> ResidualForward:
    """The ``evaluate(..., requires_grad=True)`` program of one build: gradients will
    be w.r.t. those of ``wrt_params`` it has and model inputs ``diff_inputs``."""
    ctx, n_out = built.ctx, len(built.outputs)
    b = ctx.b
    dfs = [b.input(o.shape, o.dtype, name=f"df[{i}]") for i, o in enumerate(built.outputs)]
    graph = b.build([*built.outputs, *ctx.updates.values()])
    if precision is not None:  # keeps input ids
        graph = precision(graph)
    graph, ids = passes.run_forward(graph)
    params = tuple(p for p in wrt_params if p in ctx.symbols)
    wrt = [ctx.symbols[p].id for p in params] + [built.inputs[i].id for i in diff_inputs]
    dfs_ids = [ids(d.id) for d in dfs]
    full, _ = backward_pass(graph, list(graph.outputs[:n_out]), [ids(w) for w in wrt], df=dfs_ids)
    feed, order = built.feed(tuple(ctx.params))
    full = _ordered(full, [*(ids(i) for i in order), *dfs_ids])
    if memory is not None:
        full = memory(full)
    full = passes.run_training(simplify(full))
    halves = split_at_seeds(full, len(order), len(graph.outputs))
    return ResidualForward(
        compile(halves.forward), feed, n_out, tuple(ctx.updates), halves.n_computed, halves, params
    )


def backward_program(forward: ResidualForward, wrt_inputs: Sequence[int]) -> ResidualGradient:
    """The ``backward`` program of ``forward`` returning the parameter gradients and
    those of the ``wrt_inputs`` (positions among the differentiated model inputs)."""
    graph = forward.halves.backward
    n = len(forward.params)
    outputs = (*graph.outputs[:n], *(graph.outputs[n + i] for i in wrt_inputs))
    graph = dce(dataclasses.replace(graph, outputs=outputs))
    n_dfs = forward.n_outputs
    dfs = [graph.symbols[s] for s in graph.inputs[len(graph.inputs) - n_dfs :]]
    return ResidualGradient(
        compile(graph),
        forward.halves.from_feed,
        tuple(tuple(d.shape) for d in dfs),
        forward.params,
        tuple(wrt_inputs),
        tuple(np.dtype(d.dtype) for d in dfs),
    )


def seeds(
    ingrads: Sequence[Any] | None,
    out_shapes: Sequence[tuple[int, ...]],
    out_dtypes: Sequence[Any] = (),
) -> list[Any]:
    """The output gradients of a ``backward`` call: ``ingrads``, or, as NNC's
    ``ccv_cnnp_model_backward`` without them, ones shaped as each output and of its type
    ``out_dtypes`` (float32 where not given) (the gradients of the sum of every output's
    entries; under data parallelism each copy's output gradient is 1, whatever the
    number of copies); an entry of ``ingrads`` that is ``None`` is that output's ones,
    as NNC's null ``ingrads[i]``, and one whose shape differs from the output's only by
    size-1 axes is reshaped to it (NNC binds any of the output's element count); checks
    their number, shapes and types."""
    dtypes = [np.dtype(d) for d in out_dtypes] or [np.dtype(np.float32)] * len(out_shapes)
    if ingrads is None:
        return [jax.numpy.ones(s, d) for s, d in zip(out_shapes, dtypes)]
    if len(ingrads) != len(out_shapes):
        raise ModelError(
            f"backward: the model has {len(out_shapes)} outputs, got {len(ingrads)} ingrads"
        )
    ingrads = [
        jax.numpy.ones(s, d) if g is None else g for g, s, d in zip(ingrads, out_shapes, dtypes)
    ]
    ingrads = [  # NNC binds a gradient of the output's count: a [1] one for a [1, 1] output
        g.reshape(s) if unit_axes_apart(np.shape(g), s) and hasattr(g, "reshape") else g
        for g, s in zip(ingrads, out_shapes)
    ]
    for i, (g, shape) in enumerate(zip(ingrads, out_shapes)):
        if tuple(np.shape(g)) != tuple(shape):
            procs = jax.process_count()
            rows = (
                f"; with {procs} processes that is every process's rows, as evaluate "
                "returned them, the same array on every process"
                if procs > 1
                else ""
            )
            raise ShapeError(
                f"backward: ingrads {i} is {list(np.shape(g))}, but output {i} of the last "
                f"evaluate(..., requires_grad=True) is {list(shape)}; pass one gradient "
                f"shaped as each output{rows}"
            )
        given = getattr(g, "dtype", None)
        if given is not None and jax.dtypes.canonicalize_dtype(given) != dtypes[i]:
            raise DTypeError(
                f"backward: ingrads {i} is {np.dtype(given).name}{list(np.shape(g))}, but "
                f"output {i} of the last evaluate(..., requires_grad=True) is "
                f"{dtypes[i].name}{list(shape)}; pass each output's gradient in its type "
                f"(.astype({dtypes[i].name}))"
            )
    return list(ingrads)


# -- what the engine keeps between evaluate and backward ---------------------------
@dataclasses.dataclass(frozen=True)
class Kept:
    """What ``evaluate(..., requires_grad=True)`` keeps: its program and cache ``key``,
    the input ``specs``, the model ``inputs`` and random ``keys`` it ran with, and the
    computed ``residuals``."""

    forward: ResidualForward
    key: tuple[Any, ...]
    specs: tuple[Any, ...]
    inputs: tuple[Any, ...]
    keys: tuple[Any, ...]
    residuals: tuple[Any, ...]

    def feed_args(self, values: Mapping[str, Any]) -> list[Any]:
        """The forward's feed with the parameters as they are now."""
        return self.forward.feed.args(self.inputs, values, self.keys)


def outgrad_inputs(outgrad: bool | Sequence[int], specs: Sequence[Any]) -> list[int]:
    """The model inputs whose gradients ``backward(..., outgrads=)`` returns: every
    floating-point one (``True``), none (``False``), or those listed."""
    floats = [i for i, s in enumerate(specs) if is_inexact(s.dtype)]
    if isinstance(outgrad, bool):
        return floats if outgrad else []
    try:
        chosen = [operator.index(i) for i in outgrad]
    except TypeError:
        raise ModelError(
            f"backward: outgrads picks the inputs whose gradients come back (True, False or "
            f"a list of input positions), got a {type(outgrad).__name__}; the output "
            "gradients go first, as ingrads"
        ) from None
    bad = [i for i in chosen if i not in floats]
    if bad:
        raise ModelError(
            f"backward: outgrads={list(outgrad)} names inputs {bad}, which have no gradient; "
            f"the model's floating-point inputs are {floats} (pass True for all of them)"
        )
    return chosen
