"""minimize_scaled: a training step with dynamic loss scaling (float16 training).

float16 holds magnitudes from about 6e-8 to 65504, so small gradients of a float16
computation underflow to zero. NNC's half-precision training (as Flax's
``DynamicScale`` and jmp's ``DynamicLossScale``) multiplies the loss by a scale ``S``
before the backward, so the gradients flowing through float16 are ``S`` times larger,
and divides them by ``S`` before the update. ``S`` adapts, inside the step:

- every gradient finite: the update is applied; after ``growth_interval`` such steps
  in a row, ``S`` doubles (``factor``);
- any gradient Inf or NaN (``S`` was too large, the float16 backward overflowed): the
  step is skipped (parameters and optimizer state come out bitwise unchanged) and ``S``
  halves (not below ``minimum``).

All of it is graph nodes (one ``ewprod`` for the scaled loss and one ``optax_update``
whose transformation unscales, checks and selects with ``jnp.where``), so a training
step stays one jitted computation with no host synchronisation. The scale state
(``loss_scale: f32[]``, ``good_steps: i32[]``) is two more graph inputs and outputs.

Before / after (``minimize`` for comparison; loss = sum(w * x))::

    graph(%0 w, %1 opt_state[0], %2 x) { ...; return %w', %state', %loss }
    graph(%0 w, %1 opt_state[0], %2 x, %3 loss_scale, %4 good_steps) {
        %5 = ewprod(%loss, %3)  # scaled_loss
        ... backward of %5 ...
        %w', %state', %3', %4' = optax_update[n_params=1](%grad, %1, %3, %4, %0)
        return %w', %state', %loss, %3', %4' }

>>> import numpy as np, optax
>>> from fnnc import ops
>>> from fnnc.graph import GraphBuilder, interpret
>>> from fnnc.graph.passes.loss_scale import LossScale, minimize_scaled
>>> b = GraphBuilder()
>>> w = b.input((), name="w")
>>> loss = b.exec(ops.ewprod(), w, w)
>>> step, layout = minimize_scaled(b.build([loss]), loss, [w], optax.sgd(0.25),
...                                scaling=LossScale(growth_interval=1))
>>> w1, value, scale, good = interpret(step, np.float32(2.0), np.float32(2.0**15), np.int32(0))
>>> float(w1), float(value), float(scale), int(good)      # w - 0.25 * 2w; S doubled
(1.0, 4.0, 65536.0, 0)
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fnnc import ops
from fnnc.core.ir import Graph
from fnnc.core.params import is_count
from fnnc.errors import GraphError
from fnnc.graph.builder import GraphBuilder
from fnnc.graph.passes.backward import backward
from fnnc.graph.passes.minimize import TrainLayout, loss_and_params
from fnnc.ops.optimizer import keys_as_bits, optax_update_command


class ScaleState(NamedTuple):
    """The dynamic state: the loss ``scale`` (float32) and the finite steps in a row
    since it last changed, ``good_steps`` (int32)."""

    scale: Any
    good_steps: Any


def _real(v: Any) -> bool:
    """A real number: a Python or NumPy one, or a 0-d array or JAX scalar of one."""
    if isinstance(v, numbers.Real):
        return True
    return (
        np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number) and not np.iscomplexobj(v)
    )


@dataclasses.dataclass(frozen=True)
class LossScale:
    """A dynamic loss-scaling policy (see the module doc).

    Attributes:
        initial: the first scale (Flax's ``2**15``; s4nnc's GradScaler starts at 65536).
        growth_interval: finite steps in a row after which the scale grows.
        factor: the scale is multiplied by it to grow, divided by it on Inf/NaN.
        minimum: the scale never goes below it.
    """

    initial: float = 2.0**15
    growth_interval: int = 2000
    factor: float = 2.0
    minimum: float = 1.0

    def __post_init__(self) -> None:
        # the state is float32: initial=1e39 became inf, and every step was skipped
        top = float(np.finfo(np.float32).max)
        positive = lambda v: (
            _real(v) and not isinstance(v, (bool, np.bool_)) and np.isfinite(v) and v > 0
        )
        problems = []
        if not positive(self.initial):
            problems.append(f"initial={self.initial!r} (a positive finite number)")
        elif self.initial > top:
            problems.append(f"initial={self.initial!r} (at most float32's largest, {top:.6g})")
        count = self.growth_interval  # NumPy's ints count; True is no count (it was 1)
        if not is_count(count, 1):
            problems.append(f"growth_interval={self.growth_interval!r} (an int >= 1)")
        if not (positive(self.factor) and 1 < self.factor <= top):
            problems.append(f"factor={self.factor!r} (a finite number > 1, e.g. 2.0)")
        if not positive(self.minimum):
            problems.append(f"minimum={self.minimum!r} (a number > 0)")
        elif positive(self.initial) and self.minimum > min(self.initial, top):
            problems.append(f"minimum={self.minimum!r} (at most initial={self.initial!r})")
        if problems:
            raise GraphError("LossScale: expected " + "; ".join(problems))
        for field in ("initial", "factor", "minimum"):  # hashable: programs key on it
            object.__setattr__(self, field, float(getattr(self, field)))
        object.__setattr__(self, "growth_interval", int(count))

    def init(self) -> ScaleState:
        """The starting state: ``initial`` and no good steps."""
        return ScaleState(jnp.asarray(self.initial, jnp.float32), jnp.zeros((), jnp.int32))

    def next(self, state: ScaleState, finite: Any) -> ScaleState:
        """The state after a step whose unscaled gradients were all ``finite`` (or not)."""
        good = state.good_steps + 1
        grown = state.scale * self.factor
        grow = finite & (good >= self.growth_interval) & jnp.isfinite(grown)
        kept = jnp.where(grow, grown, state.scale)
        backed = jnp.maximum(state.scale / self.factor, jnp.float32(self.minimum))
        scale = jnp.where(finite, kept, backed).astype(jnp.float32)
        good = jnp.where(finite & ~grow, good, 0).astype(jnp.int32)
        return ScaleState(scale, good)

    def transform(self, inner: optax.GradientTransformation) -> optax.GradientTransformation:
        """``inner`` on gradients of a scaled loss: its state is ``(inner state,
        ScaleState)``; it unscales the gradients, and where any is not finite it
        updates by ``-0.0`` (``p + -0.0 == p`` bitwise) and keeps the inner state.
        A 16-bit gradient is unscaled into float32 (:func:`_unscaled`)."""

        def init(params: Any) -> tuple[Any, ScaleState]:
            return inner.init(params), self.init()

        def update(grads: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
            inner_state, scaled = state
            grads = jax.tree.map(lambda g: _unscaled(g, scaled.scale), grads)
            finite = jnp.array(True)
            for g in jax.tree.leaves(grads):
                finite = finite & jnp.all(jnp.isfinite(g))
            updates, new_inner = inner.update(grads, inner_state, params)
            updates = jax.tree.map(lambda u: jnp.where(finite, u, -jnp.zeros_like(u)), updates)
            new_inner = jax.tree.map(
                lambda n, o: jnp.where(finite, n, o).astype(o.dtype), new_inner, inner_state
            )  # an Optax state of 16-bit parameters fed float32 gradients keeps its dtypes
            return updates, (new_inner, self.next(scaled, finite))

        return optax.GradientTransformation(init, update)


def _unscaled(g: Any, scale: Any) -> Any:
    """``g / scale``: in float32 for a half or bfloat16 ``g``, else in ``g``'s dtype.

    Rounding the quotient back to 16 bits would flush to zero the small gradients the
    scale kept from underflowing (float16 1e-8 is 0), before any update reads them;
    NNC's update kernels read a 16-bit gradient into float32 and multiply it by their
    ``scale`` there. The update is then float32, which ``apply_updates`` rounds once.
    """
    if jnp.issubdtype(g.dtype, jnp.floating) and np.dtype(g.dtype).itemsize == 2:
        return g.astype(jnp.float32) / scale
    return (g / scale).astype(g.dtype)


def minimize_scaled(
    graph: Graph,
    loss: Any,
    params: Sequence[Any],
    optimizer: Any,
    *,
    scaling: LossScale = LossScale(),
) -> tuple[Graph, TrainLayout]:
    """:func:`~fnnc.graph.passes.minimize.minimize` with dynamic loss scaling.

    Args:
        graph: the forward graph computing ``loss`` (a float scalar); its other
            outputs (every output but ``loss``, in their order; ``loss`` need not be
            an output at all) are kept after the loss.
        loss: a scalar symbol (or id) of ``graph``.
        params: graph inputs to train.
        optimizer: any ``optax.GradientTransformation``.
        scaling: the :class:`LossScale` policy.

    Returns:
        ``(step_graph, layout)``. The step maps (params, state, the graph's other
        inputs, ``loss_scale``, ``good_steps``) to (params', state', loss, the graph's
        other outputs, ``loss_scale'``, ``good_steps'``); ``layout`` describes the
        optimizer's own state in ``n_state`` (the scale state is not in it; it is
        ``n_scale_state == 2``, so :func:`~fnnc.graph.data_parallel` treats it as
        state, not batch) and ``scaling.init()`` gives the first scale state.
    """
    loss_id, param_ids = loss_and_params(graph, loss, params, "minimize_scaled")
    param_syms = [graph.symbols[p] for p in param_ids]
    # a PRNG key in the state rides as its bits
    optimizer = keys_as_bits(optimizer, [s.spec for s in param_syms])
    b = GraphBuilder.from_graph(graph)
    cmd = optax_update_command(scaling.transform(optimizer), [s.spec for s in param_syms])
    state_specs = cmd.param("state_specs")
    m = len(state_specs) - 2  # the optimizer's leaves; the scale state is last
    names = [*(f"opt_state[{i}]" for i in range(m)), "loss_scale", "good_steps"]
    state_in = [b.tensor(s, d, name=n) for (s, d), n in zip(state_specs, names)]
    for s in state_in:
        b.add_input(s)
    value = graph.symbols[loss_id]
    if np.dtype(value.dtype) != np.float32:
        value = b.exec(ops.datatype_conversion(dtype="float32"), value)
    scaled = b.exec(ops.ewprod(), value, state_in[m], name="scaled_loss")
    # the loss may sit anywhere among the outputs, or not be one
    others = [graph.symbols[i] for i in graph.outputs if i != loss_id]
    grad_graph, grads = backward(b.build([scaled, *others]), scaled, param_ids)
    b = GraphBuilder.from_graph(grad_graph)
    outs = b.exec(cmd, *grads, *state_in, *param_syms, name="optimizer")
    n = len(param_ids)
    head, tail = list(outs[: n + m]), list(outs[n + m :])
    step = b.build([*head, graph.symbols[loss_id], *others, *tail])
    rest = [i for i in graph.inputs if i not in param_ids]
    order = (*param_ids, *(s.id for s in state_in[:m]), *rest, *(s.id for s in state_in[m:]))
    step = dataclasses.replace(step, inputs=order)
    inner = jax.tree.structure(jax.eval_shape(optimizer.init, [s.spec for s in param_syms]))
    return step, TrainLayout(n, m, inner, optimizer, n_scale_state=2)
