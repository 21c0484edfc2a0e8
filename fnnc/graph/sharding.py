"""Shardings of a graph's inputs and outputs over a ``jax.sharding.Mesh``: data parallel
and FSDP training with JAX's own engine (XLA inserts every collective).

A :class:`Shardings` value says, per graph input and output, how it is laid out on a
mesh (a ``PartitionSpec``); :func:`fnnc.graph.compile` hands it to ``jax.jit``
(``in_shardings`` / ``out_shardings``). :func:`data_parallel` makes the usual one:

- batch inputs are split along their first axis over the mesh axis ``axis``;
- parameters (and optimizer state shaped like them) are replicated, or with
  ``parameter_sharding="fsdp"`` split along their first axis that divides by the axis
  size (ZeRO-3 / FSDP: each device holds a slice, XLA gathers it where used);
- with a training graph's :class:`~fnnc.graph.TrainLayout`, the new parameters and
  state keep their inputs' layouts and the loss is replicated (as is the loss-scale
  state of a ``minimize_scaled`` step).

NNC's ``ccv_cnnp_model_set_data_parallel`` is this with one mesh axis over the local
devices. Nothing here writes an all-reduce: the gradient sum over the batch shards is
XLA's, from the shardings alone.

>>> import jax, numpy as np
>>> from fnnc import ops
>>> from fnnc.graph import GraphBuilder, compile, data_parallel
>>> b = GraphBuilder()
>>> x, w = b.input((8, 3), name="x"), b.input((4, 3), name="w")
>>> g = b.build([b.exec(ops.gemm(transpose_b=True), x, w)])
>>> mesh = jax.make_mesh((1,), ("data",))
>>> plan = data_parallel(g, mesh, batch=["x"])
>>> plan.inputs
(P('data',), P())
>>> compile(g, shardings=plan)(np.ones((8, 3), np.float32), np.ones((4, 3), np.float32)).shape
(8, 4)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from fnnc.core.ir import Graph, require_graph
from fnnc.errors import GraphError, ShapeError
from fnnc.graph.sharding_checks import input_position

MODES = ("replicated", "fsdp")


@dataclasses.dataclass(frozen=True)
class Shardings:
    """Layouts of a graph's inputs and outputs on a mesh.

    Attributes:
        mesh: the device mesh.
        inputs: one ``PartitionSpec`` per graph input.
        outputs: one per graph output, or ``None`` to let XLA choose.
    """

    mesh: Mesh
    inputs: tuple[PartitionSpec, ...]
    outputs: tuple[PartitionSpec, ...] | None = None

    def named(self, specs: Sequence[PartitionSpec]) -> tuple[NamedSharding, ...]:
        """``NamedSharding`` values of ``specs`` on this mesh."""
        return tuple(NamedSharding(self.mesh, s) for s in specs)

    @property
    def replicated(self) -> NamedSharding:
        """The fully replicated sharding of this mesh (for constants)."""
        return NamedSharding(self.mesh, PartitionSpec())


def require_mesh(mesh: Any, where: str) -> Mesh:
    """``mesh`` when it is a ``jax.sharding.Mesh`` (or an ``AbstractMesh``, enough to plan
    layouts), else a :class:`GraphError` saying how to make one (``None`` was an
    AttributeError on ``mesh.axis_names``)."""
    if not isinstance(mesh, (Mesh, AbstractMesh)):
        raise GraphError(
            f"{where}: mesh is {type(mesh).__name__} {mesh!r:.40}; expected a "
            "jax.sharding.Mesh, e.g. Mesh(np.array(jax.devices()), ('data',))"
        )
    return mesh


def data_parallel(
    graph: Graph,
    mesh: Mesh,
    *,
    batch: Sequence[int | str] | None = None,
    axis: str = "data",
    parameters: Sequence[int | str] = (),
    parameter_sharding: str = "replicated",
    layout: Any = None,
) -> Shardings:
    """Data-parallel (or FSDP) shardings of ``graph`` on ``mesh`` (see module doc).

    Args:
        graph: the graph (a forward, or a training step from ``minimize``).
        mesh: a ``jax.sharding.Mesh`` with an axis named ``axis``.
        batch: inputs (positions or names) split along their first axis; default:
            every input that is not a parameter or optimizer state.
        axis: the mesh axis the batch (and FSDP parameters) are split over.
        parameters: inputs that are parameters (besides those a ``layout`` names).
        parameter_sharding: ``"replicated"`` or ``"fsdp"``; ``"fsdp"`` splits the inputs
            ``parameters`` and ``layout`` name (and their optimizer state), so it needs
            one of them.
        layout: the :class:`~fnnc.graph.TrainLayout` of a training graph: its first
            ``n_params`` inputs are parameters, the next ``n_state`` optimizer state,
            the last ``n_scale_state`` loss-scale state (replicated), and its outputs
            (new parameters, new state, loss, new scale state) get matching layouts.

    Raises:
        GraphError: an axis the mesh lacks, an unknown mode or input, ``"fsdp"`` with
            no parameter named.
        ShapeError: a batch input whose first axis does not divide by the axis size.
    """
    require_graph(graph, "data_parallel")
    require_mesh(mesh, "data_parallel")
    if axis not in mesh.axis_names:
        raise GraphError(
            f"data_parallel: the mesh has no axis {axis!r} (its axes: {list(mesh.axis_names)}); "
            "pass axis= one of them or build the mesh with that name"
        )
    if parameter_sharding not in MODES:
        raise GraphError(
            f"data_parallel: parameter_sharding={parameter_sharding!r}; expected one of {MODES}"
        )
    size = mesh.shape[axis]
    n_params = layout.n_params if layout is not None else 0
    n_state = layout.n_state if layout is not None else 0
    n_scale = layout.n_scale_state if layout is not None else 0
    params = set(range(n_params)) | {input_position(graph, p, "data_parallel") for p in parameters}
    state = set(range(n_params, n_params + n_state))
    scale = set(range(len(graph.inputs) - n_scale, len(graph.inputs)))
    if batch is None:
        batch_set = set(range(len(graph.inputs))) - params - state - scale
    else:
        batch_set = {input_position(graph, b, "data_parallel") for b in batch}
    fsdp = parameter_sharding == "fsdp"
    if fsdp and layout is None and not params:
        names = [graph.symbols[s].name or f"%{s}" for s in graph.inputs]
        raise GraphError(
            "data_parallel: parameter_sharding='fsdp' splits the parameters, but no input "
            f"is one (inputs {names}): name them with parameters=[...], or pass the "
            "training graph's layout= from minimize"
        )
    specs = []
    for i, sid in enumerate(graph.inputs):
        shape = graph.symbols[sid].shape
        if i in batch_set:
            specs.append(_split_batch(graph, sid, shape, axis, size))
        elif fsdp and (i in params or i in state):
            specs.append(_fsdp(shape, axis, size))
        else:
            specs.append(PartitionSpec())
    outputs = None
    if layout is not None:
        outputs = tuple(
            specs[k] if k < n_params + n_state else PartitionSpec()
            for k in range(len(graph.outputs))
        )  # the loss, other outputs and scale state (scalars) are replicated
    return Shardings(mesh, tuple(specs), outputs)


def _split_batch(graph: Graph, sid: int, shape: tuple[int, ...], axis: str, size: int) -> Any:
    if not shape:
        raise ShapeError(
            f"data_parallel: batch input {graph.label(sid)} is a scalar; only tensors with "
            "a batch axis can be split"
        )
    if shape[0] % size:
        fits = [n for n in range(1, shape[0] + 1) if shape[0] % n == 0]
        raise ShapeError(
            f"data_parallel: batch input {graph.label(sid)} has {shape[0]} rows, which do "
            f"not divide over {size} devices on mesh axis {axis!r}; use a batch size that is "
            f"a multiple of {size} (or a mesh whose axis size divides {shape[0]}: {fits})"
        )
    return PartitionSpec(axis)


def _fsdp(shape: tuple[int, ...], axis: str, size: int) -> PartitionSpec:
    """Split along the first axis that divides by ``size``; replicated if none does."""
    for d, n in enumerate(shape):
        if n % size == 0 and n >= size:
            return PartitionSpec(*([None] * d), axis)
    return PartitionSpec()
