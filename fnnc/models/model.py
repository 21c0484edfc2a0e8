"""Model: a functional graph of layers (NNC's cnnp model), and Sequential, and Flax modules.

>>> import numpy as np, optax
>>> from fnnc.models import Input, Dense, Model, ReLU
>>> x = Input()
>>> y = Dense(1, name="out")(ReLU()(Dense(8)(x)))
>>> model = Model([x], [y], name="mlp")
>>> model.compile([np.zeros((4, 3), np.float32)], loss="mse", minimizer=optax.sgd(0.1))
>>> loss = model.fit([np.ones((4, 3), np.float32)], [np.zeros((4, 1), np.float32)])

This module holds a model's structure: its layers, how it builds, Flax wrapping. Its
methods live beside it in mixins: training and inference (``compile``, ``fit``,
``evaluate``, ``train``, ...) in :mod:`fnnc.models.model_training`, parameters and files
in :mod:`fnnc.models.model_files`, bare graphs in :mod:`fnnc.models.model_graphs`, data
parallelism and precision in :mod:`fnnc.models.scale`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fnnc.core.ir import Symbol
from fnnc.models import checks
from fnnc.models.engine import Engine
from fnnc.models.layer import BuildContext, Layer, ModelError, ModelIO
from fnnc.models.model_files import FilesMixin
from fnnc.models.model_gradients import GradientsMixin
from fnnc.models.model_graphs import GraphsMixin
from fnnc.models.model_memory import MemoryMixin
from fnnc.models.model_training import TrainingMixin
from fnnc.models.scale import ScaleMixin
from fnnc.models.wiring import ios, layers_of, topological


class Model(FilesMixin, ScaleMixin, GraphsMixin, TrainingMixin, MemoryMixin, GradientsMixin, Layer):
    """A model from inputs to outputs through layers called on them.

    A layer object called twice shares its parameters. A model is itself a layer, so
    models nest. Training and inference methods (:meth:`compile`, :meth:`fit`,
    :meth:`evaluate`, ...) live on the model (:mod:`fnnc.models.model_training`); see
    :class:`fnnc.models.engine.Engine`.
    """

    def __init__(
        self,
        inputs: Sequence[ModelIO] | ModelIO,
        outputs: Sequence[ModelIO] | ModelIO,
        *,
        name: str = "",
        is_trainable: bool | None = None,
        **unknown: Any,
    ):
        super().__init__(name=name, is_trainable=is_trainable, **unknown)
        self.inputs = ios(inputs, "inputs", self.describe())
        self.outputs = ios(outputs, "outputs", self.describe())
        if not self.outputs:
            raise ModelError(
                f"model {self.describe()}: outputs is empty; a model needs at least one "
                "output: x = Input(); Model(x, Dense(3)(x))"
            )
        self._order = topological(self.inputs, self.outputs, self.describe())
        self._engine: Engine | None = None
        self.gradient_checkpointing = False
        self.memory_compression = False
        self.memory_reduction = False

    def num_outputs(self, num_inputs: int) -> int:
        return len(self.outputs)

    def build(self, ctx: BuildContext, *xs: Symbol, nested: bool = True) -> Any:
        """Builds every layer on ``xs``; a ``nested`` model prefixes its layers' ids."""
        if len(xs) != len(self.inputs):
            raise ModelError(
                f"model {self.describe()} takes {len(self.inputs)} inputs, got {len(xs)}"
            )
        with (
            ctx.checkpointed(self, self.gradient_checkpointing) as region,
            ctx.inside(self, prefix=nested),
        ):
            outs = self.build_layers(ctx, xs)
            region.extend(outs)
        return outs if len(outs) > 1 else outs[0]

    def build_layers(
        self,
        ctx: BuildContext,
        xs: Sequence[Symbol],
        on_layer: Callable[[Any, tuple[Any, ...], list[Any], bool], None] | None = None,
        where: str = "",
    ) -> tuple[Symbol, ...]:
        """Builds each layer call once, in order, on ``xs``; returns the outputs.

        ``on_layer(call, outputs, new parameters, built before)`` sees each first build
        (``summary`` tabulates them); ``where`` prefixes the errors.
        """
        for i, (io, x) in enumerate(zip(self.inputs, xs)):
            checks.declared_input(self, i, io, x, where)
        values: dict[int, Symbol] = {id(io): x for io, x in zip(self.inputs, xs)}
        built: dict[tuple[int, int], tuple[Any, ...]] = {}
        owners: set[int] = set()  # layers (nested models too) whose first call here made parameters
        for io in self._order:
            key = (id(io.layer), id(io.args))
            if key not in built:
                before = set(ctx.params) if on_layer is not None else set()
                # built before: its parameters exist (a nested model has no path of its own)
                made = id(io.layer) in ctx._paths or id(io.layer) in owners
                args = [values[id(a)] for a in io.args]
                try:
                    out = io.layer.build(ctx, *args)
                except ModelError:
                    raise
                except (ValueError, TypeError) as e:
                    raise ModelError(f"{where}layer {io.layer.describe()}: {e}") from e
                except IndexError as e:  # x.shape[-1] of a rank-0 input, a missing axis
                    raise checks.too_few_axes(io.layer, args, e, where) from e
                built[key] = out if isinstance(out, tuple) else (out,)
                checks.output_count(io.layer, len(args), len(built[key]), where)
                if on_layer is not None:
                    new = [info for pid, info in ctx.params.items() if pid not in before]
                    if new:
                        owners.add(id(io.layer))
                    on_layer(io, built[key], new, made)
            values[id(io)] = built[key][io.index]
        return tuple(values[id(o)] for o in self.outputs)

    # -- Flax ------------------------------------------------------------------
    @staticmethod
    def from_flax(
        module: Any, variables: Any = None, *, name: str = "", is_trainable: bool | None = None
    ) -> Model:
        """Wraps a Flax module as a one-input model (NNX module, or Linen module + variables).

        Its ``nnx.Param`` s become parameters ``t-<name>-<seq>-<i>``, its other variables
        (``nnx.BatchStat``) internals ``r-<name>-<seq>-<j>`` that training-mode steps
        update, initialised with the module's current values; ``nnx.Rngs`` keys are not
        parameters: each training step draws fresh ones (:mod:`fnnc.models.flax_bridge`).
        :meth:`parameter_paths` maps ids to Flax paths.
        """
        from fnnc.models.flax_bridge import FlaxLayer

        layer = FlaxLayer(module, variables, name=name, is_trainable=is_trainable)
        x = ModelIO(None, (), 0)
        return Model([x], [layer(x)], name=name, is_trainable=is_trainable)

    def parameter_paths(self) -> dict[str, str]:
        """Parameter id -> Flax path (``"layers.0.kernel"``, ``"bn.mean"``) of every
        parameter and internal of this compiled model that comes from a Flax module
        (:meth:`from_flax`); see :func:`fnnc.models.flax_bridge.parameter_paths`."""
        from fnnc.models.flax_bridge import parameter_paths

        return parameter_paths(self)

    def parameter_id(self, path: str) -> str:
        """The parameter id of Flax path ``path`` (the reverse of :meth:`parameter_paths`)."""
        from fnnc.models.flax_bridge import parameter_id

        return parameter_id(self, path)

    def __repr__(self) -> str:
        from fnnc.models.summary import describe_model

        return describe_model(self)


class _Sequential(Model):
    """:func:`Sequential`'s model: its inputs, however many a call gives, all go to the
    first layer (NNC's sequential model), so it is wired again for a new count."""

    def __init__(self, layers: Sequence[Layer], *, name: str, is_trainable: bool | None):
        self.layers = layers_of(layers, f"Sequential({name!r})" if name else "Sequential")
        super().__init__(*self._wire(1), name=name, is_trainable=is_trainable)

    def _wire(self, n: int) -> tuple[list[ModelIO], list[ModelIO]]:
        xs = [ModelIO(None, (), 0) for _ in range(n)]
        if not self.layers:
            return xs, xs
        y = self.layers[0](*xs)
        for layer in self.layers[1:]:
            y = layer(y)
        return xs, [y]

    def _kind(self) -> str:
        return "Model"  # in messages and node names, as any other model

    def build(self, ctx: BuildContext, *xs: Symbol, nested: bool = True) -> Any:
        if xs and len(xs) != len(self.inputs) and self.layers:
            self.inputs, self.outputs = self._wire(len(xs))
            self._order = topological(self.inputs, self.outputs, self.describe())
        return super().build(ctx, *xs, nested=nested)


def Sequential(
    layers: Sequence[Layer] | Layer, *, name: str = "", is_trainable: bool | None = None
) -> Model:
    """A model applying ``layers`` (a list, or one layer) one after another.

    Every input of the model goes to the first layer (a ``Sequential`` that starts with
    :class:`~fnnc.models.Concat` takes as many inputs as it is given, as NNC's
    sequential model does); each later layer takes the output of the one before.

    >>> import numpy as np
    >>> from fnnc.models import Concat, Dense, Sequential
    >>> model = Sequential([Concat(axis=-1), Dense(1, name="fc")])
    >>> model.compile([np.ones((2, 1), np.float32), np.ones((2, 2), np.float32)])
    >>> model.parameters()["t-fc-0-0"].shape
    (1, 3)
    """
    return _Sequential(layers, name=name, is_trainable=is_trainable)
