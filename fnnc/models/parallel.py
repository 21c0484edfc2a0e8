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

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from fnnc.errors import CheckpointError, FnncError, ModelError, ShapeError
from fnnc.graph import ShardingRules, constrain_activations, parameter_specs, state_specs
from fnnc.graph.sharding import MODES, Shardings, _fsdp, data_parallel
from fnnc.models import processes
from fnnc.models.layer import is_int
from fnnc.models.pipeline import PIPELINE, with_data_axis

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


@dataclasses.dataclass(frozen=True)
class Parallel:
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

    # -- plans --------------------------------------------------------------------
    def fit_plan(
        self, graph: Any, train: Any, n_inputs: int, n_targets: int, n_scale: int = 0,
        updates: Sequence[str] = (),
    ) -> Shardings:  # fmt: skip
        """The shardings of a fit program (inputs ordered as :class:`FitProgram` says;
        the ``n_scale`` loss-scale inputs last, replicated). ``updates``: the ids of the
        internals whose new values follow the loss, each laid out as its parameter (a
        pipelined Repeat's statistics stay on the stage axis)."""
        head = train.n_params + train.n_state
        n = len(graph.inputs) - n_scale
        batch = [*range(head, head + n_inputs), *range(n - n_targets, n)]
        mode = self.mode if self.rules is None else "replicated"
        plan = data_parallel(
            graph, self.mesh, batch=batch, axis=self.axis, layout=train, parameter_sharding=mode
        )
        if self.rules is None and not self.staged:
            return plan
        specs = list(plan.inputs)
        named = self.named
        for i, sid in enumerate(graph.inputs):
            if i not in batch and graph.symbols[sid].name in named:
                specs[i] = named[graph.symbols[sid].name]
        n, m = train.n_params, train.n_state
        params = [graph.symbols[s] for s in graph.inputs[:n]]
        specs[n : n + m] = _state_layout(train.optimizer, params, specs[:n], m)
        outs = [*specs[: n + m], *(plan.outputs or ())[n + m :]]
        for k, pid in enumerate(updates):  # after the loss
            outs[n + m + 1 + k] = named.get(pid, outs[n + m + 1 + k])
        return Shardings(self.mesh, tuple(specs), tuple(outs))

    def forward_plan(self, graph: Any, n_inputs: int, trainable: Sequence[str], params: Any) -> Any:
        """The shardings of a forward program: model inputs split (unless a batch does
        not divide, then replicated), parameters laid out as :meth:`param_spec`."""
        n_keys = len(graph.inputs) - n_inputs - len(params)
        specs = self._feed_specs(graph, n_inputs, trainable, params, n_keys)
        return Shardings(self.mesh, tuple(specs))

    def gradient_plan(self, graph: Any, feed: Any, trainable: Sequence[str], wrt: Any) -> Shardings:
        """The shardings of a ``backward`` program (a forward ``feed``, a
        :class:`~fnnc.models.programs.ModelFeed`, then one gradient per model output):
        output gradients split as the batch (where it divides); the gradients of
        parameters ``wrt`` laid out as the parameters, then those of the model inputs
        as the batch."""
        n_inputs, params = feed.n_inputs, feed.params
        specs = self._feed_specs(graph, n_inputs, trainable, params, feed.n_keys)
        head = len(specs)
        specs += [self._batch_spec(graph.symbols[s].shape) for s in graph.inputs[head:]]
        by_id = dict(zip(params, specs[n_inputs:]))
        outs = [by_id[p] for p in wrt]
        outs += [self._batch_spec(graph.symbols[s].shape) for s in graph.outputs[len(wrt) :]]
        return Shardings(self.mesh, tuple(specs), tuple(outs))

    def apply_plan(self, graph: Any, n_params: int) -> Shardings:
        """The shardings of an ``apply_gradients`` program (gradients, optimizer state,
        parameters; all of trainable parameters): laid out as ``fit`` lays out
        parameters and state, the outputs (parameters', state') as their inputs."""
        specs = [self.param_spec(graph.symbols[s].shape, True) for s in graph.inputs]
        if self.rules is not None or self.staged:
            k = len(specs) - n_params
            params = [graph.symbols[s] for s in graph.inputs[k:]]
            specs[k:] = [self.param_spec(p.shape, True, p.name) for p in params]
            specs[:n_params] = specs[k:]  # each gradient as its parameter
            (update,) = [node for node in graph.nodes if node.cmd.name == "optax_update"]
            optimizer = update.cmd.param("optimizer").value
            specs[n_params:k] = _state_layout(optimizer, params, specs[k:], k - n_params)
        outs = (*specs[len(specs) - n_params :], *specs[n_params : len(specs) - n_params])
        return Shardings(self.mesh, tuple(specs), outs)

    def _batch_spec(self, shape: Sequence[int]) -> PartitionSpec:
        split = len(shape) and shape[0] % self.size == 0
        return PartitionSpec(self.axis) if split else PartitionSpec()

    def _feed_specs(
        self, graph: Any, n_inputs: int, trainable: Sequence[str], params: Any, n_keys: int
    ) -> list[PartitionSpec]:
        """Specs of a :class:`~fnnc.models.programs.ModelFeed`: inputs, params, keys."""
        specs = []
        for i, sid in enumerate(graph.inputs[: n_inputs + len(params)]):
            shape = graph.symbols[sid].shape
            if i < n_inputs:
                specs.append(self._batch_spec(shape))
            else:
                pid = params[i - n_inputs]
                specs.append(self.param_spec(shape, pid in trainable, pid))
        return specs + [PartitionSpec()] * n_keys

    # -- moving values ------------------------------------------------------------
    def batch(
        self, arrays: Sequence[Any], where: str, names: str = "input", lenient: bool = False,
        rows_of_inputs: int | None = None,
    ) -> list[Any]:  # fmt: skip
        """Global batch arrays from this process's ``arrays`` (split over the mesh);
        ``lenient`` (``evaluate``) replicates a batch that does not divide in one process,
        and with several checks the processes' rows at every call (``fit``: the first
        time this process sees its row counts, so that a step waits on no collective).
        ``rows_of_inputs``: this process's input rows, for the error of a target that
        does not divide because it has another number of rows."""
        procs = jax.process_count()
        if procs > 1:
            self._check_rows(arrays, where, names, every_call=lenient)
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
            if not a.ndim:
                raise ShapeError(
                    f"{where}: {names} {i} is a scalar {a.dtype.name}, with no batch axis to "
                    f"split over the {self.size} devices of mesh axis {self.axis!r}; give "
                    "it rows (a leading batch axis, e.g. np.full((batch, 1), value)), or "
                    "pass it to the model as a constant or parameter instead of as an input"
                )
            if rows % self.size and rows_of_inputs not in (None, a.shape[0]):
                raise ShapeError(
                    f"{where}: {names} {i} has {a.shape[0]} rows but the inputs have "
                    f"{rows_of_inputs}; give as many {names} rows as input rows (one per "
                    "sample: the loss compares them row by row)"
                )
            if rows % self.size:
                raise ShapeError(self._indivisible(where, f"{names} {i}", a, rows))
            sharding = self.sharding(PartitionSpec(self.axis))
            if procs == 1:
                out.append(jax.device_put(a, sharding))
            else:
                out.append(
                    jax.make_array_from_process_local_data(sharding, a, (rows, *a.shape[1:]))
                )
        return out

    def _check_rows(self, arrays: Sequence[Any], where: str, names: str, every_call: bool) -> None:
        """The global batch is each process's rows times the process count: checks
        (one all-gather; unless ``every_call``, only the first time this process sees
        these row counts) that every process passes as many rows, where a mismatch
        would abort or hang a collective. (Once per row counts leaves a gap: a process
        that saw its counts before does not check while another's are new, as when only
        one process's data has a short last batch; ``train`` checks that every process
        has as many batches, and evenly split data, ``DataFrame.shard()``, has the
        same batch sizes on every process.)"""
        rows = tuple(
            0 if isinstance(a, jax.Array) and not a.is_fully_addressable else int(np.shape(a)[0])
            for a in arrays
            if np.ndim(a)
        )
        if rows in self._seen_rows and not every_call:
            return
        processes.agree(
            rows, where, f"the rows of each {names}",
            "every process must pass as many rows (its slice of the global batch; "
            "DataFrame.shard() gives equal shares)",
        )  # fmt: skip
        self._seen_rows.add(rows)

    def _indivisible(self, where: str, what: str, a: np.ndarray, rows: int) -> str:
        """The error for a batch of ``rows`` rows (``a``: this process's) that does
        not divide over the mesh, saying what to change."""
        procs = jax.process_count()
        head = (
            f"{where}: {what} has a batch of {rows} rows, which does not divide over the "
            f"{self.size} devices of mesh axis {self.axis!r}"
        )
        if procs == 1:
            return (
                f"{head}; use a batch size that is a multiple of {self.size}, or "
                f"set_data_parallel(n) with n dividing {rows}"
            )
        local, each = a.shape[0] if a.ndim else 0, max(self.size // procs, 1)
        return (
            f"{head} ({local} rows in each of {procs} processes, {each} devices each); "
            f"give each process a batch that is a multiple of {each} (a global batch that "
            f"is a multiple of {self.size})"
        )

    def gather(self, value: Any) -> Any:
        """A full array on one device from any (sharded, multi-process) array."""
        if not isinstance(value, jax.Array):
            return jax.numpy.array(value, copy=True)
        if value.is_fully_addressable or value.is_fully_replicated:
            # a copy: np.asarray of a replicated CPU array, then device_put, can both be
            # zero-copy, and the caller's array would pin a buffer the next step donates
            host = np.array(value, copy=True)
        else:
            from jax.experimental import multihost_utils

            host = np.asarray(multihost_utils.process_allgather(value, tiled=True))
        return jax.device_put(host, jax.local_devices()[0])


def _state_layout(
    optimizer: Any, params: Sequence[Any], specs: Sequence[Any], n_state: int
) -> list[PartitionSpec]:
    """Optimizer-state specs (:func:`~fnnc.graph.state_specs`); replicated if unaligned."""
    found = state_specs(optimizer, params, specs)
    return found if len(found) == n_state else [PartitionSpec()] * n_state


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
