"""Memory family: commands that exist to shape a program's memory, not its values.

``optimization_barrier(*xs)`` returns its inputs unchanged, but XLA may not look
through it: values computed from its outputs cannot be merged with (CSE) or moved
before (scheduling) the same computation on its inputs. The ``remat`` pass routes the
inputs of a recomputed forward segment through one, together with a tensor of the
backward, so the recomputation really happens in the backward (as ``jax.checkpoint``
does) instead of being folded back into the forward by XLA.
"""

from __future__ import annotations

from jax import lax

from fnnc.core.command import NOTHING, Spec, defcommand
from fnnc.errors import ShapeError


def _same_specs(*xs: Spec) -> tuple[Spec, ...]:
    if not xs:
        raise ShapeError("optimization_barrier: expected at least one input")
    return tuple(Spec(tuple(x.shape), x.dtype) for x in xs)


@defcommand(family="memory", shape=_same_specs, uses=NOTHING, min_inputs=1)
def optimization_barrier(*inputs):
    """The inputs, unchanged, behind ``lax.optimization_barrier`` (see the module doc).

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.optimization_barrier()(jnp.ones(2), jnp.zeros(1))
    (Array([1., 1.], dtype=float32), Array([0.], dtype=float32))
    """
    return tuple(lax.optimization_barrier(tuple(inputs)))


@optimization_barrier.backward
def _optimization_barrier_backward(grads, inputs, outputs):
    return tuple(grads)
