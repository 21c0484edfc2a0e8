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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import optax

from fnnc.core import dispatch
from fnnc.core.ir import Graph
from fnnc.graph import compile, simplify
from fnnc.graph.passes.backward import backward as backward_pass
from fnnc.graph.passes.minimize import minimize
from fnnc.models import losses
from fnnc.models.layer import BuildContext, ModelError, ParamInfo
from fnnc.models.optim import StateStore, is_noop, per_parameter
from fnnc.ops.optimizer import optax_update_command

Spec = jax.ShapeDtypeStruct


def _specs(arrays: Sequence[Any]) -> tuple[Spec, ...]:
    out = []
    for a in arrays:
        if not hasattr(a, "shape"):
            a = np.asarray(a)
        out.append(Spec(tuple(a.shape), jax.dtypes.canonicalize_dtype(a.dtype)))
    return tuple(out)


@dataclasses.dataclass
class _Program:
    program: Any
    names: tuple[str, ...]
    n_keys: int
    extra: Any = None

    def __call__(self, env: dict[str, Any]) -> Any:
        return self.program(*[env[n] for n in self.names])


class Engine:
    """Compiled state of one model (see module doc)."""

    def __init__(self, model: Any, seed: int):
        self.model = model
        self.key = jax.random.key(seed)
        self.values: dict[str, Any] = {}
        self.infos: dict[str, ParamInfo] = {}
        self.input_specs: tuple[Spec, ...] = ()
        self.loss: Any = None
        self.default_minimizer: Any = None
        self.minimizers: dict[str, Any] = {}
        self.store = StateStore()
        self.grads: dict[str, Any] = {}
        self._programs: dict[Any, _Program] = {}
        self._saved: dict[str, Any] | None = None
        self._live: tuple[Any, list[Any]] | None = None

    # -- set-up -------------------------------------------------------------------
    def compile(self, inputs: Sequence[Any], *, loss: Any, minimizer: Any) -> None:
        losses.check(loss)
        self.input_specs = _specs(inputs)
        if loss is not None:
            self.loss = loss
        if minimizer is not None:
            self.set_minimizer(minimizer)
        self._build(False, self.input_specs)  # registers and initialises parameters

    def _build(
        self, training: bool, specs: Sequence[Spec]
    ) -> tuple[BuildContext, list[Any], tuple]:
        ctx = BuildContext(training)
        xs = [ctx.b.input(s.shape, s.dtype, name=f"input[{i}]") for i, s in enumerate(specs)]
        outs = self.model.build(ctx, *xs, nested=False)
        outs = outs if isinstance(outs, tuple) else (outs,)
        for pid, info in ctx.params.items():
            self.infos[pid] = info
            if pid not in self.values:
                self.key, sub = jax.random.split(self.key)
                self.values[pid] = info.init(sub, info.shape, info.dtype)
        return ctx, xs, outs

    def trainable(self) -> list[str]:
        return [
            pid
            for pid, info in self.infos.items()
            if info.trainable and not is_noop(self.minimizer_of(pid))
        ]

    def minimizer_of(self, pid: str) -> Any:
        opt = self.minimizers.get(pid, self.default_minimizer)
        return opt if opt is not None else optax.set_to_zero()

    def set_minimizer(
        self, minimizer: Any, *, reset: bool = False, params: Sequence[str] | None = None
    ) -> None:
        if not isinstance(minimizer, optax.GradientTransformation):
            raise ModelError(
                f"set_minimizer: expected an optax.GradientTransformation (e.g. "
                f"fnnc.models.minimizers.sgd(0.1)), got {type(minimizer).__name__}"
            )
        self._sync_live()
        if params is None:
            self.default_minimizer = minimizer
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
        return dict(self.values)

    def set_parameters(self, values: dict[str, Any], *, strict: bool = True) -> None:
        unknown = [k for k in values if k not in self.infos]
        if unknown and strict:
            raise ModelError(
                f"set_parameters: unknown parameter ids {unknown}; the model has "
                f"{sorted(self.infos)} (pass strict=False to skip unknown ids)"
            )
        for pid, value in values.items():
            if pid not in self.infos:
                continue
            info = self.infos[pid]
            if tuple(np.shape(value)) != info.shape:
                raise ModelError(
                    f"set_parameters: {pid} (layer {info.layer}) is "
                    f"{list(info.shape)}, the value given is {list(np.shape(value))}"
                )
            self.values[pid] = jax.numpy.asarray(value, info.dtype)

    # -- programs -------------------------------------------------------------------
    def _compiled(self, key: Any, make: Any) -> _Program:
        key = (key, dispatch.state())  # a new backend or autotune winner compiles anew
        if key not in self._programs:
            self._programs[key] = make()
        return self._programs[key]

    def _env(self, program: _Program, inputs: Sequence[Any], prefix: str = "input") -> dict:
        env = dict(self.values)
        env.update({f"{prefix}[{i}]": x for i, x in enumerate(inputs)})
        if program.n_keys:
            self.key, *subs = jax.random.split(self.key, program.n_keys + 1)
            env.update({f"key[{i}]": jax.random.key_data(k) for i, k in enumerate(subs)})
        return env

    def _check_inputs(self, inputs: Sequence[Any]) -> tuple[Spec, ...]:
        specs = _specs(inputs)
        if self.input_specs and len(specs) != len(self.input_specs):
            raise ModelError(
                f"model {self.model.describe()} takes {len(self.input_specs)} "
                f"inputs, got {len(specs)}"
            )
        for i, (got, want) in enumerate(zip(specs, self.input_specs)):
            if got.dtype != want.dtype or len(got.shape) != len(want.shape):
                raise ModelError(
                    f"model {self.model.describe()}: input {i} is {got.dtype}{list(got.shape)}, "
                    f"compiled for {want.dtype}{list(want.shape)} (the batch size and other "
                    "sizes may change; rank and dtype may not)"
                )
        return specs

    def evaluate(self, inputs: Sequence[Any], *, is_test: bool, requires_grad: bool) -> Any:
        specs = self._check_inputs(inputs)
        training = not is_test

        def make() -> _Program:
            ctx, _, outs = self._build(training, specs)
            updates = list(ctx.updates.items())
            graph = ctx.b.build([*outs, *(s for _, s in updates)])
            return _Program(
                compile(graph),
                _names(graph),
                len(ctx.keys),
                extra=(len(outs), [pid for pid, _ in updates]),
            )

        prog = self._compiled(("evaluate", specs, training), make)
        env = self._env(prog, inputs)
        results = _as_list(prog(env))
        n_out, update_ids = prog.extra
        for pid, value in zip(update_ids, results[n_out:]):
            self.values[pid] = value
        if requires_grad:
            self._saved = {"env": env, "specs": specs, "training": training, "n_keys": prog.n_keys}
        outputs = results[:n_out]
        return outputs[0] if n_out == 1 else outputs

    def backward(self, ingrads: Sequence[Any] | None) -> list[Any]:
        if self._saved is None:
            raise ModelError(
                f"model {self.model.describe()}: backward needs a preceding "
                "evaluate(..., requires_grad=True)"
            )
        saved = self._saved
        specs, training = saved["specs"], saved["training"]
        wrt_params = self.trainable()
        diff_inputs = [i for i, s in enumerate(specs) if jax.numpy.issubdtype(s.dtype, np.inexact)]

        def make() -> _Program:
            ctx, xs, outs = self._build(training, specs)
            b = ctx.b
            dfs = [b.input(o.shape, o.dtype, name=f"df[{i}]") for i, o in enumerate(outs)]
            graph = b.build(list(outs))
            wrt = [ctx.symbols[p] for p in wrt_params if p in ctx.symbols]
            wrt += [xs[i] for i in diff_inputs]
            grad_graph, _ = backward_pass(graph, list(outs), wrt, df=dfs)
            grad_graph = dataclasses.replace(grad_graph, outputs=grad_graph.outputs[len(outs) :])
            used = [p for p in wrt_params if p in ctx.symbols]
            return _Program(
                compile(simplify(grad_graph)),
                _names(grad_graph),
                0,
                extra=([tuple(o.shape) for o in outs], used),
            )

        prog = self._compiled(("backward", specs, training, tuple(wrt_params)), make)
        out_shapes, used = prog.extra
        if ingrads is None:
            if any(int(np.prod(s)) != 1 for s in out_shapes):
                raise ModelError(
                    "backward: the outputs are not scalars; pass ingrads (the "
                    "gradients of the outputs)"
                )
            ingrads = [jax.numpy.ones(s, np.float32) for s in out_shapes]
        env = dict(saved["env"])
        env.update(self.values)
        env.update({f"df[{i}]": g for i, g in enumerate(ingrads)})
        results = _as_list(prog(env))
        for pid, g in zip(used, results[: len(used)]):
            self.grads[pid] = g if pid not in self.grads else self.grads[pid] + g
        return results[len(used) :]

    def apply_gradients(self) -> None:
        pids = [p for p in self.trainable() if p in self.grads]
        if not pids:
            return
        self._sync_live()
        opts = [self.minimizer_of(p) for p in pids]
        transform = per_parameter(opts)
        specs = tuple(Spec(self.infos[p].shape, self.infos[p].dtype) for p in pids)

        def make() -> _Program:
            from fnnc.graph import GraphBuilder

            b = GraphBuilder()
            cmd = optax_update_command(transform, list(specs))
            grads = [b.input(s.shape, s.dtype, name=f"grad[{p}]") for p, s in zip(pids, specs)]
            state = [
                b.input(shape, dtype, name=f"opt_state[{i}]")
                for i, (shape, dtype) in enumerate(cmd.param("state_specs"))
            ]
            params = [b.input(s.shape, s.dtype, name=p) for p, s in zip(pids, specs)]
            outs = b.exec(cmd, *grads, *state, *params, name="optimizer")
            graph = b.build(list(outs) if isinstance(outs, tuple) else [outs])
            return _Program(compile(graph), _names(graph), 0, extra=cmd.param("state_tree").value)

        prog = self._compiled(("apply", tuple(pids), tuple(map(id, opts)), specs), make)
        states = tuple(self.store.get(p, o, self.values[p]) for p, o in zip(pids, opts))
        env = dict(self.values)
        env.update({f"grad[{p}]": self.grads[p] for p in pids})
        env.update({f"opt_state[{i}]": x for i, x in enumerate(jax.tree.leaves(states))})
        results = _as_list(prog(env))
        self._store_results(pids, opts, results, prog.extra)
        self.grads.clear()

    def fit(self, inputs: Sequence[Any], targets: Sequence[Any] = ()) -> Any:
        if self.default_minimizer is None and not self.minimizers:
            raise ModelError(
                f"model {self.model.describe()}: fit needs a minimizer; call "
                "compile(inputs, loss=..., minimizer=...) first"
            )
        specs = self._check_inputs(inputs)
        target_specs = _specs(targets)
        pids = self.trainable()
        opts = [self.minimizer_of(p) for p in pids]

        def make() -> _Program:
            ctx, _, outs = self._build(True, specs)
            b = ctx.b
            ts = [
                b.input(s.shape, s.dtype, name=f"target[{i}]") for i, s in enumerate(target_specs)
            ]
            loss = losses.build_loss(b, self.loss, outs, ts)
            updates = list(ctx.updates.items())
            graph = b.build([loss, *(s for _, s in updates)])
            step, layout = minimize(
                graph, loss, [ctx.symbols[p] for p in pids], per_parameter(opts)
            )
            step = dataclasses.replace(step, outputs=step.outputs + graph.outputs[1:])
            return _Program(
                compile(simplify(step)),
                _names(step),
                len(ctx.keys),
                extra=(layout, [pid for pid, _ in updates]),
            )

        key = ("fit", specs, target_specs, tuple(pids), tuple(map(id, opts)))
        prog = self._compiled(key, make)
        layout, update_ids = prog.extra
        if self._live is None or self._live[0] != key:
            self._sync_live()
            states = tuple(self.store.get(p, o, self.values[p]) for p, o in zip(pids, opts))
            self._live = (key, jax.tree.leaves(states), pids, opts, layout)
        env = self._env(prog, inputs)
        env.update({f"target[{i}]": t for i, t in enumerate(targets)})
        env.update({f"opt_state[{i}]": x for i, x in enumerate(self._live[1])})
        results = _as_list(prog(env))
        new_params, new_state, loss = layout.split(results)
        for pid, value in zip(pids, new_params):
            self.values[pid] = value
        self._live = (key, new_state, pids, opts, layout)
        n = layout.n_params + layout.n_state + 1
        for pid, value in zip(update_ids, results[n:]):
            self.values[pid] = value
        return loss

    def _sync_live(self) -> None:
        """Writes the state of the running fit program back to the per-parameter store."""
        if self._live is None:
            return
        _, leaves, pids, opts, layout = self._live
        for pid, opt, state in zip(pids, opts, layout.state(leaves)):
            self.store.put(pid, opt, self.values[pid], state)
        self._live = None

    def _store_results(
        self, pids: list[str], opts: list[Any], results: list[Any], tree: Any
    ) -> None:
        n = len(pids)
        for pid, value in zip(pids, results[:n]):
            self.values[pid] = value
        states = jax.tree.unflatten(tree, list(results[n:]))
        for pid, opt, state in zip(pids, opts, states):
            self.store.put(pid, opt, self.values[pid], state)

    def optimizer_state(self, pid: str) -> dict[str, Any]:
        """Every optimizer state kept for ``pid`` (by state structure)."""
        self._sync_live()
        return self.store.all_states(pid)


def _names(graph: Graph) -> tuple[str, ...]:
    return tuple(graph.symbols[i].name for i in graph.inputs)


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]
