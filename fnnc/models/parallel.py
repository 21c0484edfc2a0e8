"""Data-parallel and FSDP models: a cnnp engine's programs on a device mesh.

:meth:`Model.set_data_parallel(n) <fnnc.models.Model.set_data_parallel>` (NNC's
``ccv_cnnp_model_set_data_parallel``) or ``Model.compile(..., mesh=...)`` give the engine
a :class:`Parallel`: its ``fit`` and ``evaluate`` programs are compiled with
:func:`fnnc.graph.data_parallel` shardings (the batch split over the mesh axis
``"data"``, parameters and optimizer state replicated or FSDP-split), and every
argument is placed on its layout before a call (:class:`Placed`), so parameters and
state live as sharded ``jax.Array`` values between steps. XLA inserts the collectives.

With sharding rules (``parameter_sharding="megatron"``, a dict ``{layer pattern:
PartitionSpec}`` or a :class:`~fnnc.graph.ShardingRules`) on a 2-D mesh
``("data", "model")``, the batch is split over ``"data"`` and each parameter as its
role says (:mod:`fnnc.graph.sharding_rules`: tensor parallelism over ``"model"``):
:meth:`Parallel.bind` finds the layouts once on the model's forward graph, every
program lays parameters and their optimizer state out so, and
:meth:`Parallel.constrain` pins the activations between layers. The stacked parameters
of a pipelined :class:`~fnnc.models.Repeat` lie on its stage axis in every mode
(``staged``, :mod:`fnnc.models.pipeline`).

With several processes (``jax.distributed.initialize``), each process passes its own
slice of the global batch; :meth:`Parallel.batch` assembles the global array with
``jax.make_array_from_process_local_data``. What leaves the engine
(``parameters()``, optimizer state, ``evaluate`` outputs) is gathered to full arrays:
with FSDP over processes that is a collective, so every process must call it (then
let process 0 alone write files). ``parameters(gather=False)`` is the exception: the
live arrays as laid out, nothing gathered.

This module holds the layout (:class:`Parallel`: mesh, mode, parameter specs); its
neighbours hold the rest, re-exported here: :mod:`.parallel_plans` the shardings of each
program kind, :mod:`.parallel_values` moving batches and results on and off the mesh
(``batch``, ``gather``, :class:`Placed`), :mod:`.parallel_processes` the mesh of
``set_data_parallel`` and the checks of a mesh's processes and of a checkpoint's layout.

>>> import jax, numpy as np, optax
>>> from fnnc.models import Dense, Input, Model
>>> x = Input()
>>> model = Model(x, Dense(2, name="fc")(x))
>>> model.set_data_parallel(0)        # every device: one on this CPU
>>> model.compile(np.zeros((4, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
>>> loss = model.fit(np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32))
>>> model.parameters()["t-fc-0-0"].shape
(2, 3)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from fnnc.errors import FnncError, ModelError
from fnnc.graph import ShardingRules, constrain_activations, parameter_specs
from fnnc.graph.sharding import MODES as MODES
from fnnc.graph.sharding import _fsdp
from fnnc.models.parallel_plans import PlansMixin
from fnnc.models.parallel_plans import _state_layout as _state_layout
from fnnc.models.parallel_processes import AXIS as AXIS
from fnnc.models.parallel_processes import _check_batch_axis as _check_batch_axis
from fnnc.models.parallel_processes import _check_processes
from fnnc.models.parallel_processes import _divisors as _divisors
from fnnc.models.parallel_processes import check_restore as check_restore
from fnnc.models.parallel_processes import layout_json as layout_json
from fnnc.models.parallel_processes import mesh_of as mesh_of
from fnnc.models.parallel_values import Placed as Placed
from fnnc.models.parallel_values import ValuesMixin
from fnnc.models.parallel_values import place as place
from fnnc.models.pipeline import PIPELINE as PIPELINE
from fnnc.models.pipeline import with_data_axis


@dataclasses.dataclass(frozen=True)
class Parallel(PlansMixin, ValuesMixin):
    """How a model's programs are laid out: a ``mesh`` whose axis ``axis`` splits the
    batch, and the ``mode`` of parameters (``"replicated"``, ``"fsdp"``, or ``"rules"``:
    ``rules`` lay them out, ``specs`` once :meth:`bind` found them)."""

    mesh: Mesh
    mode: str = "replicated"
    axis: str = AXIS
    rules: ShardingRules | None = None
    specs: tuple[tuple[str, PartitionSpec], ...] | None = None
    staged: tuple[tuple[str, PartitionSpec], ...] = ()  # pipelined stacks (models.pipeline)
    # local row counts every process was seen to agree on (Parallel.batch)
    _seen_rows: set = dataclasses.field(default_factory=set, compare=False, repr=False)

    @staticmethod
    def of(mesh: Mesh, mode: Any, axis: str = AXIS, where: str = "compile") -> Parallel:
        """Checks ``mesh`` and ``mode`` (a mode name or sharding rules, see module doc)
        and says what to change; ``where`` begins the errors of ``mode``."""
        if not isinstance(mesh, Mesh):
            raise ModelError(
                f"compile: mesh= must be a jax.sharding.Mesh, got {type(mesh).__name__}"
            )
        rules = None
        if mode == PIPELINE:  # stages alone: the batch on a size-1 "data" axis if none
            mode, mesh = "replicated", with_data_axis(mesh, axis)
        if not (isinstance(mode, str) and mode in MODES):
            try:
                rules = ShardingRules.of(mode)
            except FnncError as e:
                raise ModelError(
                    f"{where}: parameter_sharding={mode!r}; expected one of {(*MODES, PIPELINE)}, "
                    f"'megatron'/'tensor_parallel', a dict {{layer pattern: PartitionSpec}} "
                    f"or a fnnc.graph.ShardingRules ({e})"
                ) from None
            axis = rules.data
        if axis not in mesh.axis_names:
            shape, names = ("(n,)", (axis,)) if rules is None else ("(n, m)", (axis, "model"))
            raise ModelError(
                f"compile: the mesh has no axis {axis!r} (its axes: {list(mesh.axis_names)}); "
                f"build it with jax.make_mesh({shape}, {names!r}) (for pipeline stages "
                f"alone: parameter_sharding={PIPELINE!r})"
            )
        _check_processes(mesh, axis)
        # Auto axes: XLA's partitioner chooses what no layout fixes (jax.make_mesh's
        # Explicit axes would type every intermediate's sharding instead).
        types = (AxisType.Auto,) * len(mesh.axis_names)
        auto = Mesh(mesh.devices, mesh.axis_names, axis_types=types)
        return Parallel(auto, "rules" if rules is not None else mode, axis, rules)

    def bind(self, built: Any, infos: Any, trainable: Sequence[str]) -> Parallel:
        """This layout with the parameters' specs found on ``built`` (a
        :class:`~fnnc.models.programs.ModelGraph`, the model's forward graph);
        itself without rules."""
        if self.rules is None:
            return self
        graph = built.ctx.b.build(list(built.outputs))
        pids = [p for p in built.ctx.params if p in infos]
        names = {p: infos[p].owners[-1].name for p in pids if infos[p].owners[-1].name}
        # a Repeat's stacks get their FSDP axis from stage_specs: on a block's own axes,
        # never the block axis
        fsdp = [p for p in trainable if not (p in infos and infos[p].blocks)]
        try:
            specs = parameter_specs(
                graph, self.mesh, self.rules, parameters=pids, trainable=fsdp, names=names
            )
        except FnncError as e:
            raise type(e)(f"compile: {e}") from None
        return dataclasses.replace(self, specs=tuple(specs.items()))

    def constrain(self, graph: Any) -> Any:
        """``graph`` with its activations pinned (rules only; see module doc)."""
        if self.rules is None or not self.rules.activations or not self.specs:
            return graph
        sizes = dict(self.mesh.shape)
        return constrain_activations(graph, dict(self.specs), sizes=sizes, data=self.axis)

    @functools.cached_property
    def named(self) -> dict[str, PartitionSpec]:
        """Parameter id -> spec, of the rules' and the stacks' layouts (built once per
        layout: ``param_spec`` runs once per parameter)."""
        return {**dict(self.specs or ()), **dict(self.staged)}

    @property
    def size(self) -> int:
        return int(self.mesh.shape[self.axis])

    @property
    def key(self) -> tuple[Any, ...]:
        devices = tuple(d.id for d in self.mesh.devices.flat)
        mesh = (devices, self.mesh.axis_names, self.mesh.axis_sizes)
        return (*mesh, self.mode, self.rules, self.specs, self.staged)

    def sharding(self, spec: PartitionSpec) -> NamedSharding:
        return NamedSharding(self.mesh, spec)

    def param_spec(self, shape: Sequence[int], trainable: bool, pid: str = "") -> PartitionSpec:
        """The layout of parameter ``pid`` (FSDP: trainable ones split on their first
        axis that divides by the device count, as :func:`~fnnc.graph.data_parallel`
        does; rules: its spec from :meth:`bind`; a pipelined stack: its stage layout)."""
        named = self.named
        if self.rules is not None or pid in named:
            return named.get(pid, PartitionSpec())
        if self.mode == "fsdp" and trainable:
            return _fsdp(tuple(shape), self.axis, self.size)
        return PartitionSpec()
