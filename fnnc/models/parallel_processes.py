"""The devices and processes of a data-parallel run: :func:`mesh_of` (the mesh of
``Model.set_data_parallel(n)``), the checks that a mesh given to ``compile`` spans this
run's processes evenly and in order (each process feeds its own slice of the batch), and
the run's layout as a checkpoint records it (:func:`layout_json`), with the check that a
mid-epoch checkpoint restores only under the process count that saved it
(:func:`check_restore`). :mod:`fnnc.models.parallel` holds the layout itself."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from fnnc.errors import CheckpointError, ModelError
from fnnc.models.layer import is_int

AXIS = "data"


def mesh_of(n: int) -> Mesh:
    """A one-axis mesh ``"data"`` over the first ``n`` devices (``0``: all of them)."""
    devices = jax.devices()
    procs = jax.process_count()
    if not is_int(n) or not 0 <= n <= len(devices):
        raise ModelError(
            f"set_data_parallel({n!r}): this run has {len(devices)} devices "
            f"({procs} processes); pass 0 for all or 1..{len(devices)} (on "
            "CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N makes N devices; "
            "more processes: jax.distributed.initialize(num_processes=...))"
        )
    n = int(n) or len(devices)
    if procs > 1 and n != len(devices):
        raise ModelError(
            f"set_data_parallel({n}): with {procs} processes ({len(devices)} devices in "
            f"all, {jax.local_device_count()} in this one) the mesh must span every "
            f"process's devices; pass 0 (all {len(devices)}), or start "
            f"{_divisors(n)} processes to train on {n} devices"
        )
    return Mesh(np.array(devices[:n]), (AXIS,))


def _divisors(n: int) -> str:
    """``"1, 2 or 4"``: the process counts that split ``n`` devices evenly."""
    ds = [str(d) for d in range(1, n + 1) if n % d == 0]
    return ds[0] if len(ds) == 1 else ", ".join(ds[:-1]) + " or " + ds[-1]


def _check_processes(mesh: Mesh, axis: str = AXIS) -> None:
    """A mesh of this run's processes, as many devices of each (a mesh built for
    another process count, or before ``jax.distributed.initialize``, is not), whose
    batch axis ``axis`` gives each process its own positions in process order."""
    procs = jax.process_count()
    per: dict[int, int] = {}
    for d in mesh.devices.flat:
        per[d.process_index] = per.get(d.process_index, 0) + 1
    counts = ", ".join(f"{per[p]} of process {p}" for p in sorted(per))
    if max(per) >= procs:
        raise ModelError(
            f"compile: the mesh has devices of processes up to {max(per)} ({counts}) but "
            f"this run has {procs} process(es); build the mesh in this run from "
            "jax.devices() after jax.distributed.initialize, or use set_data_parallel(0)"
        )
    if procs > 1 and len(per) != procs:
        raise ModelError(
            f"compile: the mesh spans processes {sorted(per)} of {procs}; a data-parallel "
            "mesh must include devices of every process: build it from jax.devices() "
            "(not jax.local_devices()), or use set_data_parallel(0)"
        )
    if len(set(per.values())) > 1:
        raise ModelError(
            f"compile: the mesh has {counts}; each process feeds its own slice of the "
            "batch, so every process needs as many devices in the mesh: build it from "
            "jax.devices() whole, or use set_data_parallel(0)"
        )
    if procs > 1:
        _check_batch_axis(mesh, axis, procs)


def _check_batch_axis(mesh: Mesh, axis: str, procs: int) -> None:
    """Each process's rows fill its own positions of ``axis``, process 0's first (the
    global batch is the processes' rows in process order, and evaluate's outputs are
    read back so): position ``i`` of ``size`` must hold devices of process
    ``i * procs // size`` only. A mesh listing the processes in another order put
    process 1's outputs where process 0's rows were read; one whose ``axis`` positions
    mix processes (the processes along another axis) failed in JAX at the first batch."""
    size = int(mesh.shape[axis])
    rows = np.moveaxis(mesh.devices, mesh.axis_names.index(axis), 0).reshape(size, -1)
    owners = [sorted({int(d.process_index) for d in row}) for row in rows]
    if size % procs == 0 and owners == [[i * procs // size] for i in range(size)]:
        return
    seen = ", ".join("/".join(map(str, o)) for o in owners)
    raise ModelError(
        f"compile: the mesh's batch axis {axis!r} ({size} positions) holds the devices of "
        f"processes {seen}, in that order; each process passes its own rows, which fill "
        f"the axis in process order, so every position must hold devices of one process "
        f"and the processes must come in order, {max(size // procs, 1)} positions each: "
        f"build it with the processes along {axis!r}, from jax.devices() in their order "
        f"(e.g. Mesh(np.array(jax.devices()).reshape({size}, -1), ({axis!r}, ...))), or "
        "use set_data_parallel(0)"
    )


def layout_json(engine: Any) -> dict[str, Any]:
    """The run's ``processes`` and data-parallel ``devices``, for a checkpoint."""
    par = engine.parallel
    return {"processes": jax.process_count(), "devices": 1 if par is None else par.size}


def check_restore(where: str, saved: dict[str, Any]) -> None:
    """Refuses a checkpoint ``saved`` mid-epoch with a data position under another
    process count: the position is that of one process's shard of the data
    (:meth:`fnnc.data.DataFrame.shard`), meaningless for another split. Parameters,
    optimizer state and the loss scale are full arrays and restore on any layout."""
    before, now = saved.get("processes"), jax.process_count()
    if before is None or before == now or saved.get("data") is None:
        return
    raise CheckpointError(
        f"checkpoint: {where} was saved in the middle of an epoch by a run of {before} "
        f"process(es), with the data position of its shard of the data; this run has "
        f"{now}. Restore it with {before} process(es), or restore a step saved at an epoch "
        "end (CheckpointEvery(..., per_epoch=True)), or take only the parameters: "
        "model.set_parameters(Checkpoints(path).restore().state)"
    )
