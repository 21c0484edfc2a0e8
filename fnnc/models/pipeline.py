"""Pipeline parallelism for cnnp models: a :class:`~fnnc.models.Repeat` whose blocks run
as GPipe stages over a mesh axis.

``Repeat(block, n, pipeline=Pipeline(stages, microbatches))`` runs its ``n`` blocks
with :func:`fnnc.graph.pipeline` instead of :func:`~fnnc.graph.scan`: the blocks are cut
into ``stages`` groups of ``n / stages``, the batch into ``microbatches`` (microbatch
``j`` is the rows ``j, j + microbatches, ...``), and the block is built once for one
microbatch (its carry has ``batch / microbatches`` rows). Parameter ids, files and
checkpoints are those of the plain ``Repeat`` (stacked ``[n, ...]``).

On one device (no mesh) a pipelined Repeat computes what the plain one computes, for
blocks that treat every example on its own (MLP, attention and norm-per-example blocks).
Blocks that couple examples across the batch see one microbatch at a time and differ,
as in every GPipe: batch norm normalizes each microbatch by its own statistics, and the
running statistics move by the mean of the microbatches' updates
(:class:`~fnnc.models.Repeat`).

Compiled on a mesh with the pipeline's ``axis`` (``Model.compile(mesh=...)``), each
stacked parameter of the Repeat, and the optimizer state shaped like it, is laid out
``P(axis)`` on its leading (block) axis: each device of that axis holds ``1 / size`` of
the blocks, runs only their stages and passes activations to its neighbour by a
collective permute. The rest of the layout is the mesh's usual one:

- ``mesh=jax.make_mesh((2, 2), ("stage", "data"))``: the batch split over ``"data"``,
  other parameters replicated (``parameter_sharding="fsdp"`` splits them over
  ``"data"``, and the stacked ones on a further axis; sharding rules add tensor
  parallelism on a ``"model"`` axis);
- ``mesh=jax.make_mesh((4,), ("stage",))`` with ``parameter_sharding="pipeline"``:
  pipeline stages alone, the batch not split (a size-1 ``"data"`` axis is added to the
  mesh). ``"pipeline"`` on a mesh that has ``"data"`` is ``"replicated"``.

A mesh without the pipeline's axis, or whose axis size does not divide ``stages``, is
refused with a :class:`~fnnc.errors.ModelError`.

>>> import numpy as np, optax
>>> from fnnc.models import Dense, Input, Model, Pipeline, Repeat, ReLU, Sequential
>>> x = Input()
>>> blocks = Repeat(lambda: Sequential([Dense(8), ReLU()]), 4, name="blocks",
...                 pipeline=Pipeline(stages=2, microbatches=4))
>>> model = Model(x, Dense(1, name="out")(blocks(Dense(8, name="in")(x))))
>>> model.compile(np.zeros((8, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
>>> loss = model.fit(np.ones((8, 3), np.float32), np.zeros((8, 1), np.float32))
>>> model.parameters()["t-blocks-0-[0:4]-0"].shape
(4, 8, 8)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from jax.sharding import Mesh, PartitionSpec

from fnnc.errors import ModelError
from fnnc.graph.sharding_rules import _with_fsdp

PIPELINE = "pipeline"
"""The ``parameter_sharding`` value of a mesh of pipeline stages alone (module doc)."""


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """How a :class:`~fnnc.models.Repeat` pipelines its blocks (module doc).

    Attributes:
        stages: how many groups the blocks are cut into (it must divide the Repeat's
            ``n``; on a mesh, the size of mesh axis ``axis`` must divide it).
        microbatches: how many parts every batch is cut into (it must divide the batch).
        axis: the mesh axis the stages are spread over.
    """

    stages: int
    microbatches: int
    axis: str = "stage"

    def __post_init__(self) -> None:
        for what in ("stages", "microbatches"):
            v = getattr(self, what)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ModelError(f"Pipeline: {what} must be an int >= 1, got {v!r}")
        if not isinstance(self.axis, str) or not self.axis:
            raise ModelError(f"Pipeline: axis must be a mesh axis name, got {self.axis!r}")

    @staticmethod
    def check(pipeline: Any, where: str, n: int) -> Pipeline | None:
        """``pipeline`` (``None`` or a :class:`Pipeline`) for the ``n`` blocks of the
        Repeat ``where``.

        Raises:
            ModelError: not a :class:`Pipeline`, or ``stages`` does not divide ``n``.
        """
        if pipeline is not None and not isinstance(pipeline, Pipeline):
            raise ModelError(
                f"{where}: pipeline must be a fnnc.models.Pipeline(stages, microbatches), "
                f"got {pipeline!r}"
            )
        if pipeline is not None and n % pipeline.stages:
            raise ModelError(
                f"{where}: {n} blocks do not split into stages={pipeline.stages} equal "
                f"groups; pick stages dividing {n}"
            )
        return pipeline

    def microbatch(self, where: str, shape: Any) -> tuple[int, ...]:
        """The shape of one microbatch of a carry of ``shape`` (its leading axis the batch).

        Raises:
            ModelError: the batch does not split into ``microbatches``.
        """
        shape = tuple(shape)
        if not shape or shape[0] % self.microbatches:
            rows = f"{shape[0]} rows" if shape else "no batch axis"
            raise ModelError(
                f"{where}: its input {list(shape)} has {rows}, which does not split into "
                f"microbatches={self.microbatches}; feed batches that are a multiple of "
                f"{self.microbatches} or pick microbatches dividing the batch "
                "(Model.predict and score pad a last short batch themselves)"
            )
        return (shape[0] // self.microbatches, *shape[1:])


def with_data_axis(mesh: Any, axis: str) -> Any:
    """``mesh`` with a last axis ``axis`` of size 1 if it has none (``"pipeline"``)."""
    if not isinstance(mesh, Mesh) or axis in mesh.axis_names:
        return mesh
    return Mesh(mesh.devices[..., None], (*mesh.axis_names, axis))


def pipelined(infos: Mapping[str, Any]) -> dict[str, tuple[Pipeline, str]]:
    """Stacked parameter id -> (its Repeat's :class:`Pipeline`, the Repeat's
    description), for every parameter of a pipelined Repeat in ``infos`` (a model's
    :class:`~fnnc.models.layer.ParamInfo` by id)."""
    out = {}
    for pid, info in infos.items():
        if not info.blocks:
            continue
        for owner in info.owners:
            pipe = getattr(owner, "pipeline", None)
            if isinstance(pipe, Pipeline):
                out[pid] = (pipe, owner.describe())
                break
    return out


def stage_specs(
    parallel: Any, infos: Mapping[str, Any], trainable: Iterable[str]
) -> tuple[tuple[str, PartitionSpec], ...]:
    """The layouts of the stacked parameters of pipelined Repeats on ``parallel``'s mesh
    (a :class:`~fnnc.models.parallel.Parallel`): the stage axis on the block axis, then
    a user rule's axes or the role's (tensor parallelism, found by
    :meth:`~fnnc.models.parallel.Parallel.bind`), then FSDP's data axis (``"fsdp"``
    mode or ``rules.fsdp``) on the first other axis that divides. Under FSDP, the
    stacks of scanned (not pipelined) Repeats too: the data axis on a block's own axes,
    never the block axis (:func:`_stack_spec`).

    Raises:
        ModelError: the mesh lacks a pipeline's axis, or its size does not divide
            ``stages``.
    """
    mesh, trainable = parallel.mesh, set(trainable)
    bound = dict(parallel.specs or ())
    out, staged = [], pipelined(infos)
    for pid, (pipe, where) in staged.items():
        if pipe.axis not in mesh.axis_names:
            sizes = (pipe.stages, *(int(mesh.shape[a]) for a in mesh.axis_names))
            raise ModelError(
                f"layer {where} pipelines its blocks over mesh axis {pipe.axis!r}, but the "
                f"mesh has axes {list(mesh.axis_names)}; give compile a mesh with that axis, "
                f"e.g. mesh=jax.make_mesh({sizes}, {(pipe.axis, *mesh.axis_names)}), or drop "
                "pipeline= to run the blocks as one scan on every device"
            )
        size = int(mesh.shape[pipe.axis])
        if pipe.stages % size:
            raise ModelError(
                f"layer {where} has stages={pipe.stages}, which do not spread "
                f"evenly over the {size} devices of mesh axis {pipe.axis!r}; use a "
                f"multiple of {size} stages or a mesh axis of a size dividing {pipe.stages}"
            )
        out.append((pid, _stack_spec(parallel, infos, pid, bound, trainable, pipe.axis)))
    if _fsdp_on(parallel):  # scanned stacks: FSDP on a block's own axes, not the block axis
        scanned = {pid for pid, info in infos.items() if info.blocks and pid not in staged}
        for pid in sorted(scanned & trainable):
            out.append((pid, _stack_spec(parallel, infos, pid, bound, trainable, None)))
    return tuple(out)


def _fsdp_on(parallel: Any) -> bool:
    """Whether ``parallel`` splits trainable parameters over its data axis (ZeRO-3)."""
    return parallel.mode == "fsdp" or (parallel.rules is not None and parallel.rules.fsdp)


def _stack_spec(
    parallel: Any, infos: Mapping[str, Any], pid: str, bound: Mapping[str, Any],
    trainable: set[str], stage_axis: str | None,
) -> PartitionSpec:  # fmt: skip
    """The layout of stack ``pid`` ``[n, ...]``: a user rule's axes or the role's (bound
    by :meth:`~fnnc.models.parallel.Parallel.bind`), ``stage_axis`` on the block axis if
    that is free, then FSDP's data axis on the first axis of one block that divides,
    never on the block axis. A scan slices one block per iteration; a stack split along
    that axis made XLA gather the whole stack on every device (a 4-block stack under
    4-way FSDP took 13x the temporaries of the unrolled model), where a block split
    along its own axes is gathered one block at a time."""
    shape = tuple(infos[pid].shape)
    given = bound.get(pid)
    if given is None and parallel.rules is not None:
        given = parallel.rules.match(pid, infos[pid].owners[-1].name or None)
    entries = [*(given or ()), *[None] * len(shape)][: len(shape)]
    if entries[0] is None:
        entries[0] = stage_axis
    block = PartitionSpec(*entries[1:])
    if _fsdp_on(parallel) and pid in trainable:
        block = _with_fsdp(shape[1:], block, parallel.axis, parallel.mesh)
    return _trimmed(PartitionSpec(entries[0], *block))


def _trimmed(spec: PartitionSpec) -> PartitionSpec:
    """``P("data")``, not ``P("data", None)``: one spelling of each layout."""
    while len(spec) and spec[-1] is None:
        spec = PartitionSpec(*spec[:-1])
    return spec
