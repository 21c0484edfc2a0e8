"""minimize: backward plus an Optax update, so a training step is one pure graph.

``minimize(graph, loss, params, optimizer)`` differentiates ``loss`` with respect to
``params`` (the :func:`~fnnc.graph.passes.backward.backward` pass: parameters not in
``params`` get no gradient nodes at all) and appends one ``optax_update`` node for any
``optax.GradientTransformation``. The optimizer state becomes graph inputs and outputs,
so the result compiles to a pure function::

    (params, opt_state, batch) -> (params', opt_state', loss)

Inputs are ordered: the parameters (in the order given), the state leaves, then the
graph's other inputs in their original order. :class:`TrainLayout` says where each
part sits and initialises the state.

Before / after (loss = sum(w * x), SGD)::

    graph(%0 w, %1 x) { ...; return %3 }
    graph(%0 w, %1 x) { ...; %5 = mul.backward...(...)
                        %6:f32[4] = optax_update[n_params=1](%5, %0); return %6, %3 }
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.core.ir import Graph
from fnnc.errors import DTypeError, GraphError, ShapeError
from fnnc.graph.builder import GraphBuilder
from fnnc.graph.passes.backward import _ids, backward
from fnnc.ops.optimizer import as_transformation, keys_as_bits, optax_update_command


@dataclasses.dataclass(frozen=True)
class TrainLayout:
    """Where parameters, optimizer state and the batch sit in a minimized graph.

    Attributes:
        n_params: number of parameters (first inputs, first outputs).
        n_state: number of optimizer-state leaves (next inputs, next outputs).
        state_tree: the Optax state's tree structure.
        optimizer: the Optax transformation.
        n_scale_state: number of loss-scale state tensors (the last inputs, the last
            outputs): 2 (``loss_scale``, ``good_steps``) for a
            :func:`~fnnc.graph.passes.loss_scale.minimize_scaled` step, else 0.
    """

    n_params: int
    n_state: int
    state_tree: Any
    optimizer: Any
    n_scale_state: int = 0

    def init(self, params: Sequence[Any]) -> list[Any]:
        """The initial optimizer-state leaves for parameter values ``params``."""
        return jax.tree.leaves(self.optimizer.init(list(params)))

    def split(self, outputs: Sequence[Any]) -> tuple[list[Any], list[Any], Any]:
        """Splits a step's outputs into (params', state', loss)."""
        n, m = self.n_params, self.n_state
        return list(outputs[:n]), list(outputs[n : n + m]), outputs[n + m]

    def state(self, leaves: Sequence[Any]) -> Any:
        """The Optax state pytree from its leaves."""
        return jax.tree.unflatten(self.state_tree, list(leaves))


def loss_and_params(
    graph: Graph, loss: Any, params: Sequence[Any], who: str
) -> tuple[int, list[int]]:
    """The ids of ``loss`` and ``params``, checking that the loss is one floating-point
    element (an integer loss had trained nothing: its gradients are zeros; a vector's
    error told to pass ``df=``, which a step does not take) and that every parameter is
    a graph input (the step returns their new values)."""
    (loss_id,) = _ids(graph, loss, "loss")
    spec = graph.spec(loss_id)
    kind = f"{np.dtype(spec.dtype).name}{list(spec.shape)}"
    if not jnp.issubdtype(spec.dtype, jnp.floating):
        raise DTypeError(
            f"{who}: loss {graph.label(loss_id)} is {kind}, which has no gradient (the step "
            "would never change the parameters); pass a floating-point loss"
        )
    if int(np.prod(spec.shape)) != 1:
        raise ShapeError(
            f"{who}: loss {graph.label(loss_id)} is {kind}, not one element; reduce it to "
            "one (ops.reduce_sum or ops.reduce_mean over every axis)"
        )
    param_ids = _ids(graph, params, "params")
    for i, pid in enumerate(param_ids):
        if pid in param_ids[:i]:
            raise GraphError(
                f"{who}: parameter {graph.label(pid)} is listed twice (positions "
                f"{param_ids.index(pid)} and {i}); list each parameter once"
            )
        if pid not in graph.inputs:
            raise GraphError(
                f"{who}: parameter {graph.label(pid)} is not a graph input; parameters "
                "must be inputs so the step can return their new values"
            )
    return loss_id, list(param_ids)


def minimize(
    graph: Graph, loss: Any, params: Sequence[Any], optimizer: Any
) -> tuple[Graph, TrainLayout]:
    """A training-step graph: gradients of ``loss`` and an Optax update of ``params``.

    Args:
        graph: the forward graph computing ``loss``.
        loss: a scalar symbol (or id) of ``graph``.
        params: graph inputs to train.
        optimizer: any ``optax.GradientTransformation`` (or an ``optax.MultiSteps``).

    Returns:
        ``(step_graph, layout)``; ``step_graph`` maps (params, state, other inputs) to
        (params', state', loss).

    >>> import numpy as np, optax
    >>> from fnnc import ops
    >>> from fnnc.graph import GraphBuilder, interpret
    >>> from fnnc.graph.passes.minimize import minimize
    >>> b = GraphBuilder()
    >>> w = b.input((), name="w")
    >>> loss = b.exec(ops.ewprod(), w, w)
    >>> step, layout = minimize(b.build([loss]), loss, [w], optax.sgd(0.25))
    >>> w1, state, value = layout.split(interpret(step, np.float32(2.0)))
    >>> float(w1[0]), float(value)       # w - 0.25 * 2w
    (1.0, 4.0)
    """
    loss_id, param_ids = loss_and_params(graph, loss, params, "minimize")
    specs = [graph.symbols[p].spec for p in param_ids]
    optimizer = keys_as_bits(as_transformation(optimizer), specs)  # a key rides as its bits
    grad_graph, grads = backward(graph, loss_id, param_ids)
    b = GraphBuilder.from_graph(grad_graph)
    param_syms = [grad_graph.symbols[p] for p in param_ids]
    cmd = optax_update_command(optimizer, [s.spec for s in param_syms])
    state_specs = cmd.param("state_specs")
    state_in = [
        b.tensor(shape, dtype, name=f"opt_state[{i}]")
        for i, (shape, dtype) in enumerate(state_specs)
    ]
    for s in state_in:
        b.add_input(s)
    outs = b.exec(cmd, *grads, *state_in, *param_syms, name="optimizer")
    outs = outs if isinstance(outs, tuple) else (outs,)
    step = b.build([*outs, grad_graph.symbols[loss_id]])
    rest = [i for i in graph.inputs if i not in param_ids]
    order = (*param_ids, *(s.id for s in state_in), *rest)
    step = dataclasses.replace(step, inputs=order)
    layout = TrainLayout(len(param_ids), len(state_in), cmd.param("state_tree").value, optimizer)
    return step, layout
