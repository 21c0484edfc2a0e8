"""Sharding family: ``sharding_constraint`` pins an activation's layout on a device mesh.

The tensor-parallel pass (:mod:`fnnc.graph.sharding_rules`) wraps activations in it so
XLA's SPMD partitioner keeps Megatron's layout (a column-split gemm's output split over
the model axis, a row-split gemm's output whole after its all-reduce) instead of
guessing one. The value never changes: the command is the identity, and its backward
pins the gradient to the same layout (as ``jax.lax.with_sharding_constraint`` does).

``spec`` holds mesh axis names, one entry per tensor axis (``None``: not split, a tuple
of names: split over several), so a graph with constraints saves and loads like any
other. The mesh comes from the program: :func:`fnnc.graph.compile` with ``shardings``
traces under that mesh. Outside one (eager calls, ``interpret``, a program compiled
without shardings), on one device, or for axes the mesh lacks, it does nothing.
"""

from __future__ import annotations

import math
from typing import Any

import jax
from jax.sharding import AxisType, PartitionSpec

from fnnc.core.command import NOTHING, Spec, defcommand
from fnnc.ops._rules import fail, show

Axes = tuple[str | tuple[str, ...] | None, ...]


def _constraint_shape(x: Spec, *, spec: Axes) -> Spec:
    if len(spec) > len(x.shape):
        fail(f"sharding_constraint: spec {spec} names {len(spec)} axes for {show(x)}")
    return Spec(tuple(x.shape), x.dtype)


def _on_mesh(spec: Axes, shape: tuple[int, ...]) -> PartitionSpec | None:
    """``spec`` restricted to the context mesh's axes that divide their tensor axis
    (an evaluation batch may not); ``None`` when nothing is split."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return None
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))

    def keep(entry: Any, n: int) -> Any:
        names = (entry,) if isinstance(entry, str) else tuple(entry or ())
        kept = tuple(a for a in names if sizes.get(a, 1) > 1)
        if not kept or n % math.prod(sizes[a] for a in kept):
            return None
        return kept[0] if len(kept) == 1 else kept

    kept = tuple(keep(e, n) for e, n in zip(spec, shape))
    return None if all(e is None for e in kept) else PartitionSpec(*kept)


def _constrain(x: Any, spec: Axes) -> Any:
    target = _on_mesh(spec, tuple(x.shape))
    if target is None:
        return x
    mesh = jax.sharding.get_abstract_mesh()
    if all(t == AxisType.Explicit for t in mesh.axis_types):
        return jax.sharding.reshard(x, target)  # an explicit mesh types shardings
    return jax.lax.with_sharding_constraint(x, target)


@defcommand(family="sharding", shape=_constraint_shape, uses=NOTHING)
def sharding_constraint(x, *, spec=()):
    """``x``, laid out as ``spec`` on the program's mesh (see the module doc).

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.sharding_constraint(spec=("data", "model"))(jnp.ones((2, 3))).shape
    (2, 3)
    """
    return _constrain(x, tuple(spec))


@sharding_constraint.backward
def _sharding_constraint_backward(grads, inputs, outputs, *, spec=()):
    return (_constrain(grads[0], tuple(spec)),)
