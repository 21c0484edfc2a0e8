"""Data-parallel and FSDP models: a cnnp engine's programs on a device mesh.

:meth:`Model.set_data_parallel(n) <fnnc.models.Model.set_data_parallel>` (NNC's
``ccv_cnnp_model_set_data_parallel``) or ``Model.compile(..., mesh=...)`` give the engine
a :class:`Parallel`: its ``fit`` and ``evaluate`` programs are compiled with
:func:`fnnc.graph.data_parallel` shardings (the batch split over the mesh axis
``"data"``, parameters and optimizer state replicated or FSDP-split), and every
argument is placed on its layout before a call (:class:`Placed`), so parameters and
state live as sharded ``jax.Array`` values between steps. XLA inserts the collectives.

With several processes (``jax.distributed.initialize``), each process passes its own
slice of the global batch; :meth:`Parallel.batch` assembles the global array with
``jax.make_array_from_process_local_data``. What leaves the engine
(``parameters()``, optimizer state, ``evaluate`` outputs) is gathered to full arrays:
with FSDP over processes that is a collective, so every process must call it (then
let process 0 alone write files).

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
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fnnc.errors import ModelError, ShapeError
from fnnc.graph.sharding import MODES, Shardings, _fsdp, data_parallel

AXIS = "data"


def mesh_of(n: int) -> Mesh:
    """A one-axis mesh ``"data"`` over the first ``n`` devices (``0``: all of them)."""
    devices = jax.devices()
    if n < 0 or n > len(devices):
        raise ModelError(
            f"set_data_parallel({n}): this run has {len(devices)} devices "
            f"({jax.process_count()} processes); pass 0 for all or 1..{len(devices)} (on "
            "CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N makes N devices)"
        )
    n = n or len(devices)
    if jax.process_count() > 1 and n != len(devices):
        raise ModelError(
            f"set_data_parallel({n}): with {jax.process_count()} processes the mesh must "
            f"span every process's devices; pass 0 (all {len(devices)})"
        )
    return Mesh(np.array(devices[:n]), (AXIS,))


@dataclasses.dataclass(frozen=True)
class Parallel:
    """How a model's programs are laid out: a ``mesh`` with axis ``axis`` and the
    ``mode`` of parameters (``"replicated"`` or ``"fsdp"``)."""

    mesh: Mesh
    mode: str = "replicated"
    axis: str = AXIS

    @staticmethod
    def of(mesh: Mesh, mode: str, axis: str = AXIS) -> Parallel:
        """Checks ``mesh`` and ``mode`` and says what to change."""
        if not isinstance(mesh, Mesh):
            raise ModelError(
                f"compile: mesh= must be a jax.sharding.Mesh, got {type(mesh).__name__}"
            )
        if axis not in mesh.axis_names:
            raise ModelError(
                f"compile: the mesh has no axis {axis!r} (its axes: {list(mesh.axis_names)}); "
                f"build it with jax.make_mesh((n,), ({axis!r},))"
            )
        if mode not in MODES:
            raise ModelError(f"compile: parameter_sharding={mode!r}; expected one of {MODES}")
        mine = {d.process_index for d in mesh.devices.flat}
        if jax.process_count() > 1 and len(mine) != jax.process_count():
            raise ModelError(
                f"compile: the mesh spans processes {sorted(mine)} of {jax.process_count()}; "
                "a data-parallel mesh must include devices of every process (jax.devices())"
            )
        return Parallel(mesh, mode, axis)

    @property
    def size(self) -> int:
        return int(self.mesh.shape[self.axis])

    @property
    def key(self) -> tuple[Any, ...]:
        return (tuple(d.id for d in self.mesh.devices.flat), self.mesh.axis_names, self.mode)

    def sharding(self, spec: PartitionSpec) -> NamedSharding:
        return NamedSharding(self.mesh, spec)

    def param_spec(self, shape: Sequence[int], trainable: bool) -> PartitionSpec:
        """The layout of a parameter (FSDP: trainable ones split on their first axis
        that divides by the device count, as :func:`~fnnc.graph.data_parallel` does)."""
        if self.mode == "fsdp" and trainable:
            return _fsdp(tuple(shape), self.axis, self.size)
        return PartitionSpec()

    # -- plans --------------------------------------------------------------------
    def fit_plan(self, graph: Any, train: Any, n_inputs: int, n_targets: int) -> Shardings:
        """The shardings of a fit program (inputs ordered as :class:`FitProgram` says)."""
        head = train.n_params + train.n_state
        n = len(graph.inputs)
        batch = [*range(head, head + n_inputs), *range(n - n_targets, n)]
        return data_parallel(
            graph, self.mesh, batch=batch, axis=self.axis, layout=train,
            parameter_sharding=self.mode,
        )  # fmt: skip

    def forward_plan(self, graph: Any, n_inputs: int, trainable: Sequence[str], params: Any) -> Any:
        """The shardings of a forward program: model inputs split (unless a batch does
        not divide, then replicated), parameters laid out as :meth:`param_spec`."""
        specs = []
        for i, sid in enumerate(graph.inputs):
            shape = graph.symbols[sid].shape
            if i < n_inputs:
                split = shape and shape[0] % self.size == 0
                specs.append(PartitionSpec(self.axis) if split else PartitionSpec())
            elif i - n_inputs < len(params):
                specs.append(self.param_spec(shape, params[i - n_inputs] in trainable))
            else:
                specs.append(PartitionSpec())
        return Shardings(self.mesh, tuple(specs))

    # -- moving values ------------------------------------------------------------
    def batch(
        self, arrays: Sequence[Any], where: str, names: str = "input", lenient: bool = False
    ) -> list[Any]:
        """Global batch arrays from this process's ``arrays`` (split over the mesh);
        ``lenient`` (``evaluate`` in one process) replicates a batch that does not divide."""
        procs = jax.process_count()
        out = []
        for i, a in enumerate(arrays):
            if isinstance(a, jax.Array) and not a.is_fully_addressable:
                out.append(a)
                continue
            a = np.asarray(a)
            rows = a.shape[0] * procs if a.ndim else 0
            if (not a.ndim or rows % self.size) and lenient and procs == 1:
                out.append(a)
                continue
            if not a.ndim or rows % self.size:
                local = f" ({a.shape[0] if a.ndim else 0} rows in each of {procs} processes)"
                raise ShapeError(
                    f"{where}: {names} {i} has a batch of {rows} rows"
                    f"{local if procs > 1 else ''}, which does not divide over the "
                    f"{self.size} devices of mesh axis {self.axis!r}; use a batch size that "
                    f"is a multiple of {self.size}, or set_data_parallel(n) with n dividing {rows}"
                )
            sharding = self.sharding(PartitionSpec(self.axis))
            if procs == 1:
                out.append(jax.device_put(a, sharding))
            else:
                out.append(
                    jax.make_array_from_process_local_data(sharding, a, (rows, *a.shape[1:]))
                )
        return out

    def gather(self, value: Any) -> Any:
        """A full array on one device from any (sharded, multi-process) array."""
        if not isinstance(value, jax.Array):
            return jax.numpy.array(value, copy=True)
        if value.is_fully_addressable or value.is_fully_replicated:
            host = np.asarray(value)
        else:
            from jax.experimental import multihost_utils

            host = np.asarray(multihost_utils.process_allgather(value, tiled=True))
        return jax.device_put(host, jax.local_devices()[0])


def place(value: Any, sharding: NamedSharding) -> Any:
    """``value`` laid out as ``sharding`` (itself when it already is)."""
    if isinstance(value, jax.Array) and value.sharding == sharding:
        return value
    if sharding.is_fully_addressable:
        return jax.device_put(value, sharding)
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        return jax.device_put(value, sharding)  # global -> global: a reshard
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


class Placed:
    """A compiled program whose arguments are moved to its input layouts first."""

    def __init__(self, program: Any):
        self.program = program
        plan = program.shardings
        self.targets = plan.named(plan.inputs)

    def __call__(self, *args: Any) -> Any:
        return self.program(*[place(a, s) for a, s in zip(args, self.targets)])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.program, name)
