"""Engine: a cnnp model's compiled programs, parameters and optimizer state.

Every program is a graph built by the model's layers, transformed by fnnc's passes
(``backward``, ``minimize``, ``simplify``) and compiled once per (kind, input specs,
trainable set, minimizers): new input shapes recompile and keep weights and state.

* ``fit``: forward + loss + backward + update as ONE program (the fused step);
* ``evaluate``: forward (test or training mode: BatchNorm statistics, Dropout);
* ``backward``: gradients w.r.t. inputs and trainable parameters, seeded with the
  output gradients; parameter gradients accumulate until ``apply_gradients``.

Frozen parameters (``is_trainable=False`` or a no-op minimizer) are plain graph inputs
of the step: they get no gradient nodes and no optimizer state.

The minimizer is one Optax transformation over the dict of trainable parameters,
partitioned by per-parameter ``set_minimizer`` calls (:mod:`fnnc.models.optim`); its
state is kept between programs as per-parameter views (:class:`StateStore`).

Each kind of program is a typed record of :mod:`fnnc.models.programs` (the compiled
program and its positional layout), cached by (kind, specs, ..., memory options,
dispatch state).

Buffers: ``fit`` and ``apply_gradients`` donate the parameters and optimizer state to
their programs, which write the new values in place. So the engine never hands out
its own buffers: :meth:`Engine.parameters` and :meth:`Engine.optimizer_state` return
copies, :meth:`Engine.set_parameters` copies what it is given, and state leaves that
are the same array as a parameter or another leaf (an Optax ``init`` may return its
argument) are copied before they are donated.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax

from fnnc.core import dispatch
from fnnc.core.ir import unit_axes_apart
from fnnc.errors import NumericsError
from fnnc.graph.passes.minimize import TrainLayout
from fnnc.models import checks, loss_scale, losses
from fnnc.models.engine_steps import StepsMixin
from fnnc.models.initialize import initialize
from fnnc.models.interrupts import deferred_interrupt
from fnnc.models.layer import BuildContext, ModelError, ParamInfo
from fnnc.models.memory import MemoryOptions, memory_key
from fnnc.models.model_passes import ModelPasses
from fnnc.models.optim import Minimizers, StateStore, is_noop
from fnnc.models.parallel import Parallel, place
from fnnc.models.pipeline import stage_specs
from fnnc.models.programs import (
    ApplyProgram,
    FitProgram,
    ForwardProgram,
    GradientProgram,
    ModelGraph,
    fit_program,
)
from fnnc.ops.optimizer import as_transformation, keys_as_bits

Spec = jax.ShapeDtypeStruct
AnyProgram = ForwardProgram | GradientProgram | ApplyProgram | FitProgram


def _copy(value: Any) -> Any:
    """A copy the engine will not donate (any pytree of arrays)."""
    return jax.tree.map(lambda a: jax.numpy.array(a, copy=True), value)


def _owned(leaves: Sequence[Any], params: Sequence[Any]) -> list[Any]:
    """``leaves`` with every leaf that is a parameter or repeats an earlier leaf copied,
    so no buffer is donated twice."""
    seen = {id(p) for p in params}
    out = []
    for leaf in leaves:
        if id(leaf) in seen:
            leaf = jax.numpy.array(leaf, copy=True)
        seen.add(id(leaf))
        out.append(leaf)
    return out


def _specs(arrays: Sequence[Any]) -> tuple[Spec, ...]:
    out = []
    for a in arrays:
        if not hasattr(a, "shape"):
            a = np.asarray(a)
        out.append(Spec(tuple(a.shape), jax.dtypes.canonicalize_dtype(a.dtype)))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class _Live:
    """The optimizer state of the running fit program (``key``), as flat ``leaves``,
    until :meth:`Engine._sync_live` writes it back to the store."""

    key: tuple[Any, ...]
    mins: Minimizers
    layout: TrainLayout
    leaves: list[Any]

    def states(self) -> Any:
        """The Optax states of the partitions, in ``mins.parts`` order."""
        return Minimizers.inner(self.layout.state(self.leaves))


class Engine(StepsMixin):
    """Compiled state of one model (see module doc); NNC's step-by-step ``evaluate``,
    ``backward`` and ``apply_gradients`` are :class:`~fnnc.models.engine_steps.StepsMixin`'s."""

    def __init__(self, model: Any, seed: int):
        self.model = model
        self.seed = seed
        self.key = jax.random.key(seed)
        self.values: dict[str, Any] = {}
        self.infos: dict[str, ParamInfo] = {}
        self.input_specs: tuple[Spec, ...] = ()
        self.loss: Any = None
        self.default_minimizer: Any = None
        self.minimizers: dict[str, Any] = {}
        self.store = StateStore()
        self.grads: dict[str, Any] = {}
        self._programs: dict[tuple[Any, ...], AnyProgram] = {}
        self._saved: Any = None  # engine_steps._Saved or residuals.Kept
        self._live: _Live | None = None
        self._last_fit: FitProgram | None = None
        self.parallel: Parallel | None = None  # a mesh layout (fnnc.models.parallel)
        self.precision: Any = None  # mixed precision (fnnc.models.precision)
        self.loss_scale_state: Any = None  # float16 loss scaling (fnnc.models.loss_scale)
        self.passes = ModelPasses()  # the user's passes (fnnc.models.model_passes)

    def __deepcopy__(self, memo: dict[int, Any]) -> Engine:
        """``copy.deepcopy`` of a model (NNC's ``ccv_cnnp_model_copy``): its own values,
        optimizer state and settings, and an empty program cache. Compiled programs
        (XLA executables) are not copied but compiled again when first used, and the
        residuals an ``evaluate(requires_grad=True)`` kept for ``backward`` are left
        behind; the mesh layout is shared (it holds devices, which are not copied)."""
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            if name == "_programs":
                value = {}
            elif name in ("_last_fit", "_saved"):
                value = None
            elif name != "parallel":
                value = copy.deepcopy(value, memo)
            new.__dict__[name] = value
        return new

    # -- set-up -------------------------------------------------------------------
    def compile(
        self, inputs: Sequence[Any], *, loss: Any, minimizer: Any, passes: Any = None
    ) -> None:
        """Fixes the input specs, the loss and minimizer (and ``passes``, when given),
        and initialises parameters."""
        losses.check(loss)
        if passes is not None:
            self.passes = ModelPasses.of(passes)
        specs = _specs(inputs)
        if loss is not None:
            self.loss = loss
        if minimizer is not None:
            self.set_minimizer(minimizer)
        self._build(False, specs)  # registers and initialises parameters
        self.input_specs = specs  # after: a mismatch names the specs compiled before

    def _build(self, training: bool, specs: Sequence[Spec]) -> ModelGraph:
        """Builds the model's graph; registers and initialises parameters it meets."""
        ctx = BuildContext(training)
        xs = [ctx.b.input(s.shape, s.dtype, name=f"input[{i}]") for i, s in enumerate(specs)]
        outs = self.model.build(ctx, *xs, nested=False)
        outs = outs if isinstance(outs, tuple) else (outs,)
        checks.parameters(self, ctx.params, specs)  # names the input, not the weight
        new = [pid for pid in ctx.params if pid not in self.values]
        self.infos.update(ctx.params)
        if new:  # one program for all of them (fnnc.models.initialize)
            self.key, values = initialize(self.key, [ctx.params[pid] for pid in new])
            self.values.update(zip(new, values))
        return ModelGraph(ctx, tuple(xs), outs)

    def trainable(self) -> list[str]:
        """Ids of the parameters a step updates (trainable, with a minimizer that acts)."""
        return [
            pid
            for pid, info in self.infos.items()
            if info.trainable and not is_noop(self.minimizer_of(pid))
        ]

    def minimizer_of(self, pid: str) -> Any:
        """The minimizer of parameter ``pid`` (``optax.set_to_zero()`` if none)."""
        opt = self.minimizers.get(pid, self.default_minimizer)
        return opt if opt is not None else optax.set_to_zero()

    def set_minimizer(
        self, minimizer: Any, *, reset: bool = False, params: Sequence[str] | str | None = None
    ) -> None:
        """Sets the minimizer of all (or ``params``) parameters; see ``Model.set_minimizer``.

        ``params`` makes those parameters one partition of the model's transformation
        (every parameter set with one object is one partition), updated as a whole.
        Without ``params`` it sets the default, and the parameters given their own
        minimizer keep it (NNC re-applies them) unless ``reset``."""
        # one GradientTransformation per MultiSteps object: its method makes a new one
        # at every call, and the parameters set with one object are one partition
        minimizer = as_transformation(minimizer)
        if not isinstance(minimizer, optax.GradientTransformation):
            raise ModelError(
                f"set_minimizer: expected an optax.GradientTransformation (e.g. "
                f"fnnc.models.minimizers.sgd(0.1)) or optax.MultiSteps, got "
                f"{type(minimizer).__name__}"
            )
        minimizer = keys_as_bits(minimizer)  # a PRNG key in the state rides as its bits
        params = checks.minimizer_ids(params)
        self._sync_live()
        if params is None:  # NNC: the per-parameter ones set before stay, unless reset
            self.default_minimizer = minimizer
            if reset:
                self.minimizers.clear()
        else:
            unknown = [p for p in params if self.infos and p not in self.infos]
            if unknown:
                raise ModelError(
                    f"set_minimizer: unknown parameter ids {unknown}; known: {sorted(self.infos)}"
                )
            self.minimizers.update({p: minimizer for p in params})
        if reset:
            self.store.reset(params)

    # -- parameters -----------------------------------------------------------------
    def parameters(self) -> dict[str, Any]:
        """Parameter id -> value (internals included), copies of the engine's buffers."""
        return {pid: self._host(v) for pid, v in self.values.items()}

    def _host(self, value: Any) -> Any:
        """A copy of a pytree of engine arrays; full arrays on one device if sharded."""
        return _copy(value) if self.parallel is None else jax.tree.map(self.parallel.gather, value)

    def place_parameters(self) -> None:
        """Lays every parameter out on the mesh (replicated, or FSDP-split if trainable)."""
        if self.parallel is not None:
            trainable = set(self.trainable())
            if self.parallel.rules is not None and self.input_specs:  # layouts by role
                built = self._build(False, self.input_specs)
                self.parallel = self.parallel.bind(built, self.infos, sorted(trainable))
            staged = stage_specs(self.parallel, self.infos, trainable)  # Repeat stacks
            self.parallel = dataclasses.replace(self.parallel, staged=staged)
            for pid, v in self.values.items():
                spec = self.parallel.param_spec(np.shape(v), pid in trainable, pid)
                self.values[pid] = place(v, self.parallel.sharding(spec))

    def set_parameters(self, values: dict[str, Any], *, strict: bool = True) -> list[str]:
        """Sets parameters by id and returns the ids of ``values`` it skipped. A value whose
        shape differs from the parameter's only by size-1 axes (a ``[1]`` value for a
        ``[1, 1]`` weight, which NNC's ``set_parameter`` copies) is reshaped to it.
        ``strict``: an unknown id or a value of another shape is a ``ModelError`` and
        nothing is set; ``strict=False`` skips those. A value that is not numbers is a
        ``ModelError`` either way."""
        if not isinstance(values, Mapping):
            raise ModelError(
                f"set_parameters: expected a dict {{parameter id: array}}, e.g. "
                f"{{'t-fc-0-0': w}}, got {type(values).__name__} (see model.parameters() "
                "for the ids)"
            )
        skipped = [k for k in values if k not in self.infos]
        if skipped and strict:
            raise ModelError(
                f"set_parameters: unknown parameter ids {skipped}; the model has "
                f"{sorted(self.infos)} (or their per-block ids, for a Repeat's stacks); pass "
                "strict=False to skip unknown ids"
            )
        kept = {}
        for pid, value in values.items():
            if pid not in self.infos:
                continue
            info = self.infos[pid]
            value = checks.parameter_value(pid, info, value)
            given = tuple(np.shape(value))
            if unit_axes_apart(given, info.shape):
                value = np.reshape(value, info.shape)
            elif given != info.shape:
                if not strict:
                    skipped.append(pid)
                    continue
                raise ModelError(
                    f"set_parameters: {pid} (layer {info.layer}) is {list(info.shape)}, the "
                    f"value given is {list(given)}; pass strict=False to set only the values "
                    "that fit"
                )
            kept[pid] = value
        for pid, value in kept.items():  # only once every value passed: nothing set on error
            self.values[pid] = jax.numpy.array(value, self.infos[pid].dtype, copy=True)
        self.place_parameters()
        return skipped

    # -- programs -------------------------------------------------------------------
    def _compiled(self, key: tuple[Any, ...], make: Any) -> Any:
        """The program for ``key`` under the current dispatch state, made once."""
        layout = (
            self.parallel and self.parallel.key,
            self.precision and self.precision.key,
            self.passes,
        )
        key = (*key, dispatch.state(), layout)  # a new backend, winner or mesh compiles anew
        if key not in self._programs:
            self._programs[key] = make()
        return self._programs[key]

    def _keys(self, n: int) -> list[Any]:
        """``n`` fresh random keys (as key data) for a program's random layers."""
        if not n:
            return []
        self.key, *subs = jax.random.split(self.key, n + 1)
        return [jax.random.key_data(k) for k in subs]

    def _check_inputs(self, inputs: Sequence[Any]) -> tuple[Spec, ...]:
        specs = _specs(inputs)
        if self.input_specs and len(specs) != len(self.input_specs):
            raise ModelError(
                f"model {self.model.describe()} takes {len(self.input_specs)} "
                f"inputs, got {len(specs)}; pass one array per model input (a list is a "
                "list of inputs: make a nested list of numbers one array with np.asarray)"
            )
        for i, (got, want) in enumerate(zip(specs, self.input_specs)):
            if got.dtype != want.dtype or len(got.shape) != len(want.shape):
                raise ModelError(
                    f"model {self.model.describe()}: {checks.input_label(self.model, i)} is "
                    f"{got.dtype}{list(got.shape)}, "
                    f"compiled for {want.dtype}{list(want.shape)} (the batch size and other "
                    "sizes may change; rank and dtype may not)"
                )
        return specs

    def minimizers_of(self, pids: Sequence[str]) -> Minimizers:
        """The partitioned minimizer of parameters ``pids``."""
        blocks = {p: self.infos[p].blocks for p in pids if self.infos[p].blocks}
        return Minimizers.of(pids, [self.minimizer_of(p) for p in pids], blocks, self.infos)

    def _state_leaves(self, mins: Minimizers) -> list[Any]:
        """The optimizer-state leaves of a program for ``mins``: each partition's state
        assembled from the store, then the hyper-parameters."""
        states = tuple(
            self.store.assemble(t, {p: self.values[p] for p in ids})
            for t, ids in zip(mins.templates(), mins.parts)
        )
        leaves = _owned(jax.tree.leaves(states), [self.values[p] for p in mins.pids])
        return [*leaves, *mins.hyper_leaves()]

    def _keep(self, mins: Minimizers, states: Sequence[Any]) -> None:
        for ids, state in zip(mins.parts, states):
            self.store.keep(state, ids)

    def fit(self, inputs: Sequence[Any], targets: Sequence[Any] = ()) -> Any:
        """One fused training step; returns the loss."""
        if self.default_minimizer is None and not self.minimizers:
            raise ModelError(
                f"model {self.model.describe()}: fit needs a minimizer; call "
                "compile(inputs, loss=..., minimizer=...) first"
            )
        checks.nonempty_batch(self, inputs, targets, "fit")  # before any state changes
        host, host_inputs = targets, inputs  # as given: the mesh's batch makes device arrays
        if self.parallel is not None:
            where = f"model {self.model.describe()} fit"
            inputs = self.parallel.batch(inputs, where)
            rows = np.shape(host_inputs[0])[0] if host_inputs and np.ndim(host_inputs[0]) else None
            targets = self.parallel.batch(targets, where, "target", rows_of_inputs=rows)
        specs = self._check_inputs(inputs)
        checks.targets(self, specs, host, "fit")  # NumPy labels only: no device sync
        key, prog, mins = self._fit_program(specs, _specs(targets))
        live = self._live
        if live is None or live.key != key:
            self._sync_live()
            live = _Live(key, mins, prog.train, self._state_leaves(mins))
        # the call deletes the donated parameters and state: a Ctrl-C waits until the
        # new ones are stored, the random key with them (fnnc.models.interrupts)
        with deferred_interrupt():
            keys = self._keys(prog.feed.n_keys)
            scale = loss_scale.current(self, prog.n_scale)
            try:
                new_params, new_state, loss, updates, scale = prog(
                    live.leaves, inputs, targets, self.values, keys, scale
                )
            except NumericsError as e:  # config numerics: name the model too
                raise NumericsError(f"model {self.model.describe()} fit: {e}") from None
            loss_scale.keep(self, scale)
            for pid, value in zip(prog.params, new_params):
                self.values[pid] = value
            self._live = _Live(key, live.mins, live.layout, new_state)
            for pid, value in zip(prog.updates, updates):
                self.values[pid] = value
        return loss

    def _fit_program(
        self, specs: tuple[Spec, ...], target_specs: tuple[Spec, ...]
    ) -> tuple[tuple[Any, ...], FitProgram, Minimizers]:
        """``(cache key, fit program, minimizers)`` for input and target specs."""
        pids = self.trainable()
        mins = self.minimizers_of(pids)  # keyed by structure; hyper-parameters are inputs

        def make() -> FitProgram:
            built = self._build(True, specs)
            memory = MemoryOptions.of(self.model, built.ctx)
            transform = mins.transform()
            return fit_program(
                built, self.loss, target_specs, pids, transform, memory, self.parallel,
                self.precision, mins.n_hyper, self.passes,
            )  # fmt: skip

        memory = memory_key(self.model)
        key = ("fit", specs, target_specs, tuple(pids), mins.key, memory)
        prog: FitProgram = self._compiled(key, make)
        self._last_fit = prog
        return key, prog, mins

    def fit_step(self, inputs: Sequence[Any] | None, targets: Sequence[Any], what: str) -> Any:
        """The compiled fit :class:`~fnnc.graph.Program` for ``inputs`` and ``targets``
        (arrays or specs; compiled here if new), or the last one :meth:`fit` used."""
        if inputs is not None:
            self._fit_program(self._check_inputs(inputs), _specs(targets))
        if self._last_fit is None:
            raise ModelError(
                f"model {self.model.describe()}: {what} needs a training step; call "
                f"fit first or pass {what}(inputs, targets)"
            )
        return self._last_fit.program

    def _sync_live(self) -> None:
        """Writes the state of the running fit program back to the store."""
        live = self._live
        if live is None:
            return
        self._keep(live.mins, live.states())
        self._live = None

    def optimizer_state(self, pid: str) -> dict[str, Any]:
        """Every optimizer state kept for ``pid`` (by state structure), each the state
        of its partition as ``pid`` sees it (:func:`fnnc.models.optim.view`)."""
        self._sync_live()
        return self._host(self.store.all_states(pid))
