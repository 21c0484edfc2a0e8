"""Model: a functional graph of layers (NNC's cnnp model), and Sequential, and Flax modules.

>>> import numpy as np, optax
>>> from fnnc.models import Input, Dense, Model, ReLU
>>> x = Input()
>>> y = Dense(1, name="out")(ReLU()(Dense(8)(x)))
>>> model = Model([x], [y], name="mlp")
>>> model.compile([np.zeros((4, 3), np.float32)], loss="mse", minimizer=optax.sgd(0.1))
>>> loss = model.fit([np.ones((4, 3), np.float32)], [np.zeros((4, 1), np.float32)])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from fnnc.core.ir import Symbol
from fnnc.graph import trace
from fnnc.graph.inline import inline
from fnnc.models.engine import Engine
from fnnc.models.layer import BuildContext, Layer, ModelError, ModelIO


class Model(Layer):
    """A model from inputs to outputs through layers called on them.

    A layer object called twice shares its parameters. A model is itself a layer, so
    models nest. Training and inference methods (:meth:`compile`, :meth:`fit`,
    :meth:`evaluate`, ...) live on the model; see :class:`fnnc.models.engine.Engine`.
    """

    def __init__(
        self,
        inputs: Sequence[ModelIO],
        outputs: Sequence[ModelIO] | ModelIO,
        *,
        name: str = "",
        is_trainable: bool | None = None,
    ):
        super().__init__(name=name, is_trainable=is_trainable)
        self.inputs = list(inputs)
        self.outputs = [outputs] if isinstance(outputs, ModelIO) else list(outputs)
        self._order = _topological(self.inputs, self.outputs, self.describe())
        self._engine: Engine | None = None

    def num_outputs(self, num_inputs: int) -> int:
        return len(self.outputs)

    def build(self, ctx: BuildContext, *xs: Symbol, nested: bool = True) -> Any:
        """Builds every layer on ``xs``; a ``nested`` model prefixes its layers' ids."""
        if len(xs) != len(self.inputs):
            raise ModelError(
                f"model {self.describe()} takes {len(self.inputs)} inputs, got {len(xs)}"
            )
        with ctx.inside(self, prefix=nested):
            values: dict[int, Symbol] = {id(io): x for io, x in zip(self.inputs, xs)}
            built: dict[tuple[int, int], Any] = {}
            for io in self._order:
                key = (id(io.layer), id(io.args))
                if key not in built:
                    args = [values[id(a)] for a in io.args]
                    try:
                        out = io.layer.build(ctx, *args)
                    except ModelError:
                        raise
                    except (ValueError, TypeError) as e:
                        raise ModelError(f"layer {io.layer.describe()}: {e}") from e
                    built[key] = out if isinstance(out, tuple) else (out,)
                values[id(io)] = built[key][io.index]
            outs = tuple(values[id(o)] for o in self.outputs)
        return outs if len(outs) > 1 else outs[0]

    # -- Flax ------------------------------------------------------------------
    @staticmethod
    def from_flax(
        module: Any, variables: Any = None, *, name: str = "", is_trainable: bool | None = None
    ) -> Model:
        """Wraps a Flax module as a one-input model (NNX module, or Linen module + variables).

        Its parameters become model parameters ``t-<name>-<seq>-<i>`` (leaf order of the
        module's state), initialised with the module's current values.
        """
        layer = FlaxLayer(module, variables, name=name, is_trainable=is_trainable)
        x = ModelIO(None, (), 0)
        return Model([x], [layer(x)], name=name, is_trainable=is_trainable)

    # -- training and inference: see Engine ------------------------------------
    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise ModelError(
                f"model {self.describe()} is not compiled; call model.compile(input_specs, "
                "loss=..., minimizer=...) first"
            )
        return self._engine

    def compile(
        self, inputs: Sequence[Any], *, loss: Any = None, minimizer: Any = None, seed: int = 0
    ) -> None:
        """Fixes input specs (arrays or ShapeDtypeStructs), the loss and the minimizer,
        and initialises parameters. New input shapes later recompile, keeping weights
        and optimizer state."""
        if self._engine is None:
            self._engine = Engine(self, seed)
        self._engine.compile(inputs, loss=loss, minimizer=minimizer)

    def fit(self, inputs: Sequence[Any], targets: Sequence[Any] = ()) -> Any:
        """One fused training step (forward, loss, backward, update); returns the loss."""
        return self.engine.fit(inputs, targets)

    def evaluate(
        self, inputs: Sequence[Any], *, is_test: bool = True, requires_grad: bool = False
    ) -> Any:
        """The model's outputs; ``requires_grad`` keeps what :meth:`backward` needs."""
        return self.engine.evaluate(inputs, is_test=is_test, requires_grad=requires_grad)

    def backward(self, ingrads: Sequence[Any] | None = None) -> list[Any]:
        """Gradients w.r.t. the last evaluated inputs; parameter gradients accumulate."""
        return self.engine.backward(ingrads)

    def apply_gradients(self) -> None:
        """Applies the accumulated parameter gradients with the minimizers, then clears them."""
        self.engine.apply_gradients()

    def set_minimizer(
        self, minimizer: Any, *, reset: bool = False, params: Sequence[str] | None = None
    ) -> None:
        """Sets the minimizer of all (or some) parameters; state carries over unless ``reset``."""
        self.engine.set_minimizer(minimizer, reset=reset, params=params)

    def parameters(self) -> dict[str, Any]:
        """Parameter id -> array (internals ``r-...`` included)."""
        return self.engine.parameters()

    def set_parameters(self, values: dict[str, Any], *, strict: bool = True) -> None:
        """Sets parameters by id (e.g. from another model); ``strict`` rejects unknown ids."""
        self.engine.set_parameters(values, strict=strict)

    def write(self, target: Any, *, name: str | None = None) -> None:
        """Writes parameters (``<id>`` or ``__<name>__[<id>]``) and internals
        (``<id>(0)``) to an NNC tensor file, in one transaction (NNC's
        ``ccv_cnnp_model_write``).

        Args:
            target: a path or a :class:`fnnc.io.TensorFile`.
            name: the model name in the row names (``None`` for bare ids).
        """
        from fnnc.io import write_parameters

        values = self.parameters()
        infos = self.engine.infos
        params = {k: v for k, v in values.items() if not infos[k].internal}
        internals = {k: v for k, v in values.items() if infos[k].internal}
        write_parameters(target, params, name=name, internals=internals)

    def read(self, source: Any, *, name: str | None = None, strict: bool = True) -> list[str]:
        """Reads parameters written by :meth:`write` (or by NNC) into this compiled model.

        Raises :class:`fnnc.errors.ParameterError` listing every missing or mis-shaped
        parameter, unless ``strict=False``, which loads what matches and returns the ids
        that did not.
        """
        from fnnc.io import read_parameters

        infos = self.engine.infos
        expected = {k: (i.shape, i.dtype) for k, i in infos.items() if not i.internal}
        internals = {k: (i.shape, i.dtype) for k, i in infos.items() if i.internal}
        found = read_parameters(source, expected, name=name, internals=internals, strict=strict)
        self.set_parameters({**found, **found.internals})
        return [*found.missing, *(m if isinstance(m, str) else str(m) for m in found.mismatched)]

    def train(self, data: Any, **kwargs: Any) -> dict[str, list[float]]:
        """A training loop with a progress bar; see :func:`fnnc.models.train.train`."""
        from fnnc.models.train import train

        return train(self, data, **kwargs)


def Sequential(
    layers: Sequence[Layer], *, name: str = "", is_trainable: bool | None = None
) -> Model:
    """A model applying ``layers`` one after another."""
    x = ModelIO(None, (), 0)
    y = x
    for layer in layers:
        y = layer(y)
    return Model([x], [y], name=name, is_trainable=is_trainable)


class FlaxLayer(Layer):
    """A Flax module (NNX, or Linen with its variables) as a layer, traced and inlined."""

    def __init__(self, module: Any, variables: Any = None, **kw: Any):
        super().__init__(**kw)
        from flax import nnx

        if isinstance(module, nnx.Module):
            graphdef, state = nnx.split(module)
            self._fn = lambda leaves, x: nnx.merge(graphdef, jax.tree.unflatten(tree, leaves))(x)
            leaves, tree = jax.tree.flatten(state)
        elif variables is not None:
            leaves, tree = jax.tree.flatten(variables)
            self._fn = lambda leaves, x: module.apply(jax.tree.unflatten(tree, leaves), x)
        else:
            raise ModelError("from_flax: a Linen module needs its variables (module.init(...))")
        self._leaves = [np.asarray(v) for v in leaves]

    def build(self, ctx: BuildContext, x: Symbol) -> Symbol:
        params = [
            ctx.param(self, i, v.shape, _fixed(v), v.dtype) for i, v in enumerate(self._leaves)
        ]
        specs = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in self._leaves]
        graph = trace(self._fn, specs, jax.ShapeDtypeStruct(x.shape, x.dtype))
        (out,) = inline(ctx.b, graph, [*params, x], prefix=ctx.layer_id(self))
        return out


def _fixed(value: np.ndarray) -> Any:
    return lambda key, shape, dtype: jax.numpy.asarray(value, dtype)


def _topological(inputs: list[ModelIO], outputs: list[ModelIO], where: str) -> list[ModelIO]:
    """Every non-input ModelIO reachable from ``outputs``, dependencies first."""
    known = {id(i) for i in inputs}
    order: list[ModelIO] = []
    seen: set[int] = set()
    stack: list[tuple[ModelIO, bool]] = [(o, False) for o in reversed(outputs)]
    while stack:
        io, expanded = stack.pop()
        if id(io) in known or (id(io) in seen and not expanded):
            continue
        if io.layer is None:
            raise ModelError(
                f"model {where}: an output depends on an Input() that is not among "
                "the model's inputs"
            )
        if expanded:
            order.append(io)
            continue
        seen.add(id(io))
        stack.append((io, True))
        stack.extend((a, False) for a in reversed(io.args) if id(a) not in seen)
    return order
