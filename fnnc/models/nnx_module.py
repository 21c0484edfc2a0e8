"""A compiled cnnp model inside Flax NNX code: :class:`FnncModule` (``model.to_nnx()``).

The module holds the model's parameters as NNX variables in ``module.parameters``, a
``nnx.Dict`` keyed by NNC ids (``"t-fc1-0-0"``), and its ``__call__`` runs the model's
forward graph as a pure function of them (:mod:`fnnc.models.model_function`), so it
nests in larger NNX modules, trains with ``nnx.Optimizer`` and any Optax
transformation under ``nnx.jit``, and saves with Orbax like any NNX state. Gradients
follow fnnc's per-command backward rules (what ``model.backward`` computes).

Variables by kind:

==============================  =================================================
parameter                       NNX variable
==============================  =================================================
trainable                       ``nnx.Param`` (what ``wrt=nnx.Param`` optimizes)
``is_trainable=False``          :class:`Frozen` (an ``nnx.Variable``, not a Param)
internal (BatchNorm statistic)  ``nnx.BatchStat``, updated by training-mode calls
==============================  =================================================

Modes follow NNX: ``module.train()`` (the default, as ``nnx.BatchNorm``) runs the
training-mode forward (batch statistics, updating the ``BatchStat`` s; Dropout drawing
from ``rngs``' ``dropout`` stream), ``module.eval()`` the test-mode one, equal to
``model.evaluate(x)``. :meth:`FnncModule.write_back` puts trained values back into the
model (``model.set_parameters``), to write NNC files or keep training with ``fit``.
The module computes as the model does (its mixed precision included) on JAX's default
device; a mesh layout set on the model (``set_data_parallel``) is not carried over:
shard the module's state with JAX/Flax sharding as for any NNX module.

>>> import numpy as np, optax
>>> from flax import nnx
>>> from fnnc.models import Dense, Input, Model, ReLU
>>> x = Input()
>>> model = Model(x, Dense(2, name="out")(ReLU()(Dense(4, name="fc1")(x))))
>>> model.compile(np.zeros((8, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
>>> module = model.to_nnx()
>>> sorted(module.parameters)
['t-fc1-0-0', 't-fc1-0-1', 't-out-0-0', 't-out-0-1']
>>> opt = nnx.Optimizer(module, optax.adam(1e-2), wrt=nnx.Param)
>>> @nnx.jit
... def step(module, opt, x, y):
...     loss, grads = nnx.value_and_grad(lambda m: ((m(x) - y) ** 2).mean())(module)
...     opt.update(module, grads)
...     return loss
>>> xs, ys = np.ones((8, 3), np.float32), np.zeros((8, 2), np.float32)
>>> first = step(module, opt, xs, ys)
>>> bool(step(module, opt, xs, ys) < first)
True
>>> module.write_back()   # the model now has the trained weights
>>> module.eval()
>>> bool(np.allclose(model.evaluate(xs), module(xs), atol=1e-6))
True
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flax import nnx

from fnnc.errors import ModelError
from fnnc.models.model_function import FunctionCache


class Frozen(nnx.Variable):
    """A parameter the cnnp model does not train (``is_trainable=False``): an NNX
    variable that ``nnx.Optimizer(..., wrt=nnx.Param)`` leaves alone."""


class FnncModule(nnx.Module):
    """A compiled cnnp model as an ``nnx.Module`` (see the module docstring).

    Args:
        model: a compiled :class:`fnnc.models.Model` (its parameters are copied in).
        rngs: an ``nnx.Rngs`` whose ``dropout`` stream (or default) feeds the model's
            random layers in training mode; needed only if the model has Dropout.
        deterministic: start in test mode (``module.eval()``); NNX's default is training.

    Attributes:
        parameters: ``nnx.Dict`` of NNC id -> ``nnx.Param`` / :class:`Frozen` /
            ``nnx.BatchStat``.
        deterministic: test mode (``True``) or training mode (``False``).
    """

    def __init__(self, model: Any, *, rngs: nnx.Rngs | None = None, deterministic: bool = False):
        infos = model.engine.infos
        values = model.parameters()
        self.parameters = nnx.Dict({pid: _variable(infos[pid], v) for pid, v in values.items()})
        self.rngs = rngs
        self.deterministic = deterministic
        self._functions = FunctionCache(model)

    @property
    def model(self) -> Any:
        """The cnnp model this module runs."""
        return self._functions.model

    def __call__(self, *inputs: Any) -> Any:
        """The model's outputs for ``inputs`` (one array per model input): one array for
        a one-output model, else a tuple; an input may be nested lists of numbers, as
        ``jnp.asarray`` takes. In training mode the ``BatchStat`` s update."""
        inputs = tuple(x if hasattr(x, "dtype") else np.asarray(x) for x in inputs)
        fn = self._functions.get(inputs, training=not self.deterministic)
        keys = [self._key() for _ in range(fn.n_keys)]
        values = {pid: self.parameters[pid][...] for pid in fn.params}
        outs, updates = fn(list(inputs), values, keys)
        for pid, value in updates.items():
            self.parameters[pid][...] = value
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _key(self) -> Any:
        if self.rngs is None:
            raise ModelError(
                f"FnncModule: model {self.model.describe()} has random layers (Dropout); "
                "in training mode it needs random keys: FnncModule(model, "
                "rngs=nnx.Rngs(dropout=0)), or call module.eval() for the test-mode forward"
            )
        return self.rngs.dropout()

    def set_view(self, deterministic: bool | None = None) -> None:
        """What ``nnx.view(module, deterministic=...)`` sets (``True``: test mode), as
        for ``nnx.Dropout``; ``module.eval()``/``train()`` set the same attribute."""
        if deterministic is not None:
            self.deterministic = deterministic

    def write_back(self, model: Any = None) -> None:
        """Writes every parameter and internal into ``model`` (default: the model this
        module was made from) with ``model.set_parameters``."""
        target = self.model if model is None else model
        target.set_parameters({pid: var[...] for pid, var in self.parameters.items()})


def _variable(info: Any, value: Any) -> nnx.Variable:
    """The NNX variable kind for one parameter (see the table in the module docstring)."""
    if info.internal:
        return nnx.BatchStat(value)
    if info.trainable:
        return nnx.Param(value)
    return Frozen(value)
