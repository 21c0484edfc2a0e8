"""NNC's step-by-step training on a cnnp engine: ``evaluate`` (optionally keeping what
the gradient needs), ``backward`` (gradients of inputs; parameter gradients
accumulate) and ``apply_gradients`` (one optimizer update), as
``ccv_cnnp_model_evaluate``, ``ccv_cnnp_model_backward`` and
``ccv_cnnp_model_apply_gradients`` do. :class:`fnnc.models.engine.Engine` holds the
parameters, the program cache and the fused ``fit``; this mixin adds these methods.

>>> import numpy as np, optax
>>> from fnnc.models import Dense, Input, Model
>>> x = Input()
>>> model = Model(x, Dense(1, name="fc")(x))
>>> model.compile(np.zeros((2, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
>>> y = model.evaluate(np.ones((2, 3), np.float32), requires_grad=True)
>>> [g.shape for g in model.backward([np.ones((2, 1), np.float32)])]
[(2, 3)]
>>> model.apply_gradients()
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax

from fnnc.models import checks, residuals
from fnnc.models.interrupts import deferred_interrupt
from fnnc.models.layer import ModelError
from fnnc.models.memory import MemoryOptions, memory_key
from fnnc.models.optim import Minimizers
from fnnc.models.programs import apply_program, forward_program, gradient_program

Spec = jax.ShapeDtypeStruct


@dataclasses.dataclass(frozen=True)
class _Saved:
    """What ``evaluate(..., requires_grad=True)`` keeps for ``backward``."""

    specs: tuple[Spec, ...]
    training: bool
    inputs: tuple[Any, ...]
    keys: tuple[Any, ...]


class StepsMixin:
    """``evaluate``, ``backward`` and ``apply_gradients`` of an engine (module doc)."""

    model: Any
    parallel: Any
    precision: Any
    passes: Any
    values: dict[str, Any]
    grads: dict[str, Any]
    infos: dict[str, Any]
    _saved: Any

    def evaluate(self, inputs: Sequence[Any], *, is_test: bool, requires_grad: bool) -> Any:
        """The outputs for ``inputs``; in training mode internals update; with
        ``requires_grad`` the inputs and keys are kept for :meth:`backward`."""
        if not is_test:  # a training-mode step on 0 rows would make running stats NaN
            checks.nonempty_batch(self, inputs, (), "evaluate(..., is_test=False)")
        par = self.parallel
        if par is not None:
            inputs = par.batch(inputs, f"model {self.model.describe()} evaluate", lenient=True)
        specs = self._check_inputs(inputs)
        training = not is_test
        if requires_grad and par is None:  # one program; keeps residuals for backward
            key = ("evaluate", specs, training, tuple(self.trainable()), memory_key(self.model))
            prog = self._compiled(key, lambda: self._residual_forward(training, specs))
            keys = self._keys(prog.feed.n_keys)
            outputs, updates, kept = prog.run(inputs, self.values, keys)
            self._saved = residuals.Kept(prog, key, specs, tuple(inputs), tuple(keys), tuple(kept))
        else:
            prog = self._compiled(
                ("evaluate", specs, training),
                lambda: forward_program(
                    self._build(training, specs),
                    par,
                    self.trainable(),
                    self.precision,
                    self.passes,
                ),
            )
            keys = self._keys(prog.feed.n_keys)
            outputs, updates = prog(inputs, self.values, keys)
            if requires_grad:
                self._saved = _Saved(specs, training, tuple(inputs), tuple(keys))
        for pid, value in zip(prog.updates, updates):
            self.values[pid] = value
        if par is not None and jax.process_count() > 1:
            outputs = [par.gather(o) for o in outputs]
        return outputs[0] if prog.n_outputs == 1 else outputs

    def backward(
        self, ingrads: Sequence[Any] | None, outgrad: bool | Sequence[int] = True
    ) -> list[Any]:
        """Gradients w.r.t. the model inputs ``outgrad`` selects (see
        :func:`fnnc.models.residuals.outgrad_inputs`), seeded with ``ingrads`` (ones shaped
        as the outputs, as NNC's); parameter gradients accumulate. Runs from the residuals the
        last ``evaluate(..., requires_grad=True)`` kept (:mod:`fnnc.models.residuals`)."""
        if self._saved is None:
            raise ModelError(
                f"model {self.model.describe()}: backward needs a preceding "
                "evaluate(..., requires_grad=True)"
            )
        saved = self._saved
        wrt_inputs = residuals.outgrad_inputs(outgrad, saved.specs)
        if isinstance(saved, residuals.Kept):
            fwd, floats = saved.forward, residuals.outgrad_inputs(True, saved.specs)
            prog = self._compiled(
                ("backward", saved.key, tuple(wrt_inputs)),
                lambda: residuals.backward_program(fwd, [floats.index(i) for i in wrt_inputs]),
            )
            seeds = residuals.seeds(ingrads, prog.out_shapes, prog.out_dtypes)
            values = self.values
            if self.parallel is not None:  # evaluated before set_data_parallel: one device
                values = {pid: self.parallel.gather(v) for pid, v in values.items()}
            param_grads, input_grads = prog(saved.feed_args(values), saved.residuals, seeds)
        else:  # on a mesh: a program that runs the forward again
            prog = self._gradient_program(saved, tuple(wrt_inputs))
            seeds = residuals.seeds(ingrads, prog.out_shapes, prog.out_dtypes)
            param_grads, input_grads = prog(saved.inputs, self.values, saved.keys, seeds)
        for pid, g in zip(prog.params, param_grads):
            old = self.grads.get(pid)
            if isinstance(old, jax.Array) and old.sharding != g.sharding:
                old = jax.device_put(old, g.sharding)  # kept from before a layout change
            self.grads[pid] = g if old is None else old + g
        if self.parallel is not None and jax.process_count() > 1:
            input_grads = [self.parallel.gather(g) for g in input_grads]
        return input_grads

    def _residual_forward(self, training: bool, specs: tuple[Spec, ...]) -> Any:
        built = self._build(training, specs)
        memory = MemoryOptions.of(self.model, built.ctx)
        floats = residuals.outgrad_inputs(True, specs)
        return residuals.residual_forward(
            built, self.trainable(), floats, memory, self.precision, self.passes
        )

    def _gradient_program(self, saved: _Saved, wrt_inputs: tuple[int, ...]) -> Any:
        specs, training, wrt_params = saved.specs, saved.training, self.trainable()

        def make() -> Any:
            built = self._build(training, specs)
            memory = MemoryOptions.of(self.model, built.ctx)
            return gradient_program(
                built, wrt_params, wrt_inputs, memory, self.parallel, self.passes, self.precision
            )

        key = ("backward", specs, training, tuple(wrt_params), memory_key(self.model), wrt_inputs)
        return self._compiled(key, make)

    def apply_gradients(self) -> None:
        """Updates parameters with the accumulated gradients, then clears them."""
        pids = [p for p in self.trainable() if p in self.grads]
        if not pids:
            return
        self._sync_live()
        mins = self.minimizers_of(pids)  # keyed by structure; hyper-parameters are inputs
        specs = tuple(Spec(self.infos[p].shape, self.infos[p].dtype) for p in pids)

        def make() -> Any:
            return apply_program(mins.transform(), pids, specs, self.parallel, mins.n_hyper)

        prog = self._compiled(("apply", tuple(pids), mins.key, specs), make)
        grads = [self.grads[p] for p in pids]
        with deferred_interrupt():  # the call deletes the donated parameters and state
            new_params, new_state = prog(grads, self._state_leaves(mins), self.values)
            for pid, value in zip(pids, new_params):
                self.values[pid] = value
            self._keep(mins, Minimizers.inner(new_state))
            self.grads.clear()
