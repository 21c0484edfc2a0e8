"""A compiled cnnp model's forward as a pure JAX function of parameters and inputs.

:func:`model_function` builds the model's forward graph for some input specs (the
graph ``Model.evaluate`` compiles, ``compile``'s ``precision`` cast and ``passes``
included) and returns a :class:`ModelFunction`: a pure function
``f(inputs, params, keys) -> (outputs, internals)`` that JAX can ``jit``, ``grad``,
``vmap`` and nest in Flax code, with parameters passed by NNC id.

Its derivative is fnnc's, not JAX's: every node runs as a ``jax.custom_vjp`` whose
backward is the command's own NNC backward rule (what the ``backward`` pass emits node
by node; :func:`fnnc.ops._subgraph.run_graph_nnc`), so ``jax.grad`` of a loss of the
outputs equals what ``model.backward`` computes, and a step under ``jax.jit`` runs the
forward once and keeps what each rule needs.

Reverse mode only: ``jax.grad``, ``jax.vjp``, ``jax.jacrev``, ``jax.grad`` of
``jax.grad`` and ``jax.hessian`` (forward over reverse) work, but JAX has no forward
mode for a ``custom_vjp``, so ``jax.jvp``, ``jax.jacfwd`` and ``jax.linearize`` of the
function itself are a :class:`~fnnc.errors.ModelError` (JAX's own ``TypeError`` when
the call is inside a ``jax.jit`` that forward mode is applied to). For a forward-mode
derivative, trace the model's graph instead (:func:`fnnc.graph.compile` of
``model_function(...).graph`` on the ``"xla"`` backend).

>>> import jax, numpy as np, optax
>>> from fnnc.models import Dense, Input, Model, model_function
>>> x = Input()
>>> model = Model(x, Dense(2, name="fc")(x))
>>> model.compile(np.zeros((4, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
>>> fn = model_function(model, [jax.ShapeDtypeStruct((4, 3), np.float32)])
>>> params = fn.initial_parameters(model)
>>> (out,), _ = fn([np.ones((4, 3), np.float32)], params)
>>> bool(np.allclose(out, model.evaluate(np.ones((4, 3), np.float32))))
True
>>> grads = jax.grad(lambda p: fn([np.ones((4, 3), np.float32)], p)[0][0].sum())(params)
>>> sorted(grads)
['t-fc-0-0', 't-fc-0-1']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from fnnc.core.compiled import is_forward_mode_error
from fnnc.core.ir import Graph
from fnnc.core.keys import key_bits
from fnnc.errors import ModelError
from fnnc.models.checks import input_label
from fnnc.models.programs import evaluated_graph
from fnnc.ops._subgraph import run_graph_nnc


@dataclasses.dataclass(frozen=True, eq=False)
class ModelFunction:
    """One build of a model's forward as a pure function (see the module docstring).

    Attributes:
        graph: the forward graph; inputs are the model inputs, then ``params``, then
            ``n_keys`` random keys; outputs the model outputs, then the new values of
            the internals ``updates``.
        params: every parameter id the graph reads (internals included), in order.
        trainable: ids of the parameters that get gradients; the others (frozen with
            ``is_trainable=False``, and internals) pass through ``stop_gradient``.
        updates: ids of the internals a training-mode forward updates (BatchNorm
            running statistics); empty in test mode.
        n_inputs, n_outputs, n_keys: counts of model inputs, outputs and random keys.
        training: whether this is the training-mode forward (``evaluate(is_test=False)``).
        input_labels: how errors name each model input (``input 0 (x)``).
    """

    graph: Graph
    params: tuple[str, ...]
    trainable: frozenset[str]
    updates: tuple[str, ...]
    n_inputs: int
    n_outputs: int
    n_keys: int
    training: bool
    input_labels: tuple[str, ...] = ()

    def __call__(
        self,
        inputs: Sequence[Any],
        params: Mapping[str, Any],
        keys: Sequence[Any] = (),
    ) -> tuple[list[Any], dict[str, Any]]:
        """``(outputs, new internals by id)`` for model ``inputs`` and parameter values.

        Args:
            inputs: one array per model input, of the shapes and dtypes this function
                was built for (another batch size needs another :func:`model_function`).
            params: every id of :attr:`params` to its value (extra ids are ignored), of
                the parameter's shape; a value of another dtype is cast to the
                parameter's, as ``model.set_parameters`` does.
            keys: :attr:`n_keys` random keys (``jax.random.key_data`` of typed keys, or
                typed keys) for Dropout and other random layers.
        """
        if hasattr(inputs, "shape"):  # one array: its len() is its rows, not a count
            raise ModelError(
                f"model function: inputs is one array ({inputs.dtype}"
                f"{list(np.shape(inputs))}); pass a list of {self.n_inputs} (one per model "
                "input), fn([x], params)"
            )
        if len(inputs) != self.n_inputs:
            raise ModelError(
                f"model function: the model takes {self.n_inputs} inputs, got {len(inputs)}"
            )
        missing = [p for p in self.params if p not in params]
        if missing:
            raise ModelError(
                f"model function: parameters {missing} are missing; pass every id of "
                f"fn.params ({list(self.params)}), e.g. fn.initial_parameters(model)"
            )
        if hasattr(keys, "shape") or isinstance(keys, (int, np.integer)):
            raise ModelError(
                f"model function: keys is one value ({_shown(keys)}); pass a list of "
                f"{self.n_keys} random keys, fn(inputs, params, [key])"
            )
        if len(keys) != self.n_keys:
            raise ModelError(
                f"model function: the {'training' if self.training else 'test'}-mode forward "
                f"takes {self.n_keys} random keys (Dropout and other random layers), got "
                f"{len(keys)}"
            )
        inputs = [self._input(i, x) for i, x in enumerate(inputs)]
        values = [self._parameter(i, p, params[p]) for i, p in enumerate(self.params)]
        keys = [self._key(k, key) for k, key in enumerate(keys)]
        try:
            results = run_graph_nnc(self.graph, [*inputs, *values, *keys])
        except TypeError as e:
            if not is_forward_mode_error(e):
                raise
            raise ModelError(
                "model function: it has reverse-mode derivatives only (jax.grad, jax.vjp, "
                "jax.jacrev, grad of grad, jax.hessian): every node runs as a "
                "jax.custom_vjp with the command's NNC backward, and JAX has no forward "
                "mode (jax.jvp, jax.jacfwd, jax.linearize) for those. For forward mode, "
                "compile fn.graph with fnnc.graph.compile and differentiate that Program "
                "on the 'xla' backend"
            ) from None
        outs = list(results[: self.n_outputs])
        return outs, dict(zip(self.updates, results[self.n_outputs :]))

    def _input(self, i: int, x: Any) -> Any:
        """Model input ``i``, checked against the spec the graph was built for (a
        ModelError naming it, not a shape rule's failure deep in the graph)."""
        x = x if hasattr(x, "shape") and hasattr(x, "dtype") else np.asarray(x)
        want = self.graph.symbol(self.graph.inputs[i])
        got = (tuple(np.shape(x)), jax.dtypes.canonicalize_dtype(x.dtype))
        if got != (tuple(want.shape), jax.dtypes.canonicalize_dtype(want.dtype)):
            label = self.input_labels[i] if i < len(self.input_labels) else f"input {i}"
            raise ModelError(
                f"model function: {label} is {got[1]}{list(got[0])}, but this function was "
                f"built for {want.dtype}{list(want.shape)}; build one for these inputs, "
                "model_function(model, inputs) (the batch size and other sizes may change "
                "between builds, rank and dtype may not)"
            )
        return x

    def _parameter(self, i: int, pid: str, value: Any) -> Any:
        """Parameter ``pid`` of the right shape, in its dtype, without a gradient unless
        it is trainable."""
        want = self.graph.symbol(self.graph.inputs[self.n_inputs + i])
        value = value if hasattr(value, "dtype") else np.asarray(value)
        if tuple(np.shape(value)) != tuple(want.shape):
            raise ModelError(
                f"model function: parameter {pid} is {list(want.shape)}, the value given is "
                f"{list(np.shape(value))}; pass fn.initial_parameters(model) or values of "
                "those shapes"
            )
        if jax.dtypes.canonicalize_dtype(value.dtype) != want.dtype:
            value = jax.numpy.asarray(value, want.dtype)
        return value if pid in self.trainable else jax.lax.stop_gradient(value)

    def _key(self, k: int, key: Any) -> Any:
        """Random key ``k`` as its key data, checked against the graph's key input (a
        ModelError, not JAX's 'invalid PRNG key data' from inside a random node)."""
        bits = key_bits(key)
        bits = bits if hasattr(bits, "shape") and hasattr(bits, "dtype") else np.asarray(bits)
        want = self.graph.symbol(self.graph.inputs[self.n_inputs + len(self.params) + k])
        if (tuple(np.shape(bits)), np.dtype(bits.dtype)) != (tuple(want.shape), want.dtype):
            raise ModelError(
                f"model function: random key {k} is {_shown(key)}, but the forward takes "
                f"one key of {want.dtype}{list(want.shape)} key data; pass "
                "a threefry2x32 key, jax.random.key(seed) (JAX's default), or its "
                "jax.random.key_data, one per random key (split a key for several)"
            )
        return bits

    def initial_parameters(self, model: Any) -> dict[str, Any]:
        """The current values of :attr:`params` in ``model`` (copies)."""
        values = model.parameters()
        return {p: values[p] for p in self.params}


def _shown(value: Any) -> str:
    """How key errors show a value: a typed key by its shape and implementation."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return f"{type(value).__name__} {value!r:.40}"
    return f"{dtype}{list(np.shape(value))}"


def model_function(model: Any, inputs: Sequence[Any], *, training: bool = False) -> ModelFunction:
    """The forward of compiled ``model`` for inputs like ``inputs`` (arrays or
    ``jax.ShapeDtypeStruct``) as a :class:`ModelFunction`; ``training`` gives the
    training-mode forward (batch statistics, Dropout), which returns the updated
    internals too. Input rank and dtype must be those the model was compiled for. One
    array alone is a list of it, as in ``compile`` and ``evaluate``."""
    engine = model.engine
    # list(None) was a bare TypeError and list(array) its rows, one "input" each
    specs = engine._check_inputs(list(inputs) if isinstance(inputs, (list, tuple)) else [inputs])
    built = engine._build(training, specs)
    ctx = built.ctx
    # evaluate's graph: the precision cast and the compile passes (which fit, evaluate
    # and backward all run) included
    outputs = [*built.outputs, *ctx.updates.values()]
    graph, feed = evaluated_graph(built, outputs, engine.precision, engine.passes)
    infos = engine.infos
    return ModelFunction(
        graph=graph,
        params=feed.params,
        trainable=frozenset(p for p in feed.params if infos[p].trainable),
        updates=tuple(ctx.updates),
        n_inputs=len(built.inputs),
        n_outputs=len(built.outputs),
        n_keys=feed.n_keys,
        training=training,
        input_labels=tuple(input_label(model, i) for i in range(len(built.inputs))),
    )


class FunctionCache:
    """:func:`model_function` of one model, built once per (input specs, mode) and
    again when a later ``compile`` changes the model's ``precision`` or ``passes``."""

    def __init__(self, model: Any):
        self.model = model
        self._built: dict[tuple[Any, ...], ModelFunction] = {}

    def get(self, inputs: Sequence[Any], training: bool) -> ModelFunction:
        """The :class:`ModelFunction` for inputs like ``inputs`` in that mode."""
        specs = tuple((tuple(np.shape(x)), np.dtype(x.dtype)) for x in inputs)
        engine = self.model.engine
        key = (specs, training, engine.passes, engine.precision and engine.precision.key)
        if key not in self._built:
            self._built[key] = model_function(self.model, inputs, training=training)
        return self._built[key]
