"""Layers, symbolic model inputs/outputs, and the context a model is built in.

A cnnp model, as in NNC, is a *graph generator*: every layer, when built, emits fnnc
commands into a :class:`~fnnc.graph.GraphBuilder` (a dense layer is one
``gemm[transpose_b=True]``, a layer norm one ``layer_norm``), so the compiled graph is
made of commands that passes, fusion and kernels understand. Parameters are graph
inputs named by NNC's ids (``t-linear-0-0``: weight 0 of the first layer named
"linear"); internals such as running statistics use ``r-``.

Layers are called on :class:`ModelIO` values (from :func:`Input` or other layers) to
describe a model functionally, Keras-style; nothing is computed until a model is
compiled.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.core.ir import Symbol
from fnnc.graph import GraphBuilder

Initializer = Callable[[jax.Array, tuple[int, ...], Any], jax.Array]


from fnnc.errors import ModelError  # noqa: E402  (re-exported here for layer authors)


@dataclasses.dataclass(frozen=True, eq=False)
class ModelIO:
    """A symbolic value in a functional model: input ``index`` of a model, or output
    ``index`` of ``layer`` applied to ``args``."""

    layer: Layer | None
    args: tuple[ModelIO, ...]
    index: int = 0
    name: str = ""
    shape: tuple[int | None, ...] | None = None
    dtype: Any = np.float32


def Input(
    shape: Sequence[int | None] | None = None, dtype: Any = np.float32, name: str = ""
) -> ModelIO:
    """A model input. ``shape`` is optional (compile takes the real input specs).

    >>> from fnnc.models import Input, Dense, Model
    >>> x = Input()
    >>> model = Model([x], [Dense(3, name="linear")(x)])
    """
    return ModelIO(None, (), 0, name, None if shape is None else tuple(shape), np.dtype(dtype))


@dataclasses.dataclass
class ParamInfo:
    """What the model knows of one parameter or internal before it has a value.

    ``owners`` is the chain of layers from the outermost enclosing model to the layer
    that owns the parameter; :attr:`trainable` resolves ``is_trainable`` along it *now*,
    so toggling ``layer.is_trainable`` between steps takes effect.
    """

    id: str
    shape: tuple[int, ...]
    dtype: np.dtype
    init: Initializer
    owners: tuple[Layer, ...]
    internal: bool = False

    @property
    def layer(self) -> str:
        return self.owners[-1].describe()

    @property
    def trainable(self) -> bool:
        if self.internal:
            return False
        for layer in reversed(self.owners):
            if layer.is_trainable is not None:
                return bool(layer.is_trainable)
        return True


class BuildContext:
    """The state of one model build: the builder, parameters, internals, random keys."""

    def __init__(self, training: bool):
        self.b = GraphBuilder()
        self.training = training
        self.params: dict[str, ParamInfo] = {}
        self.symbols: dict[str, Symbol] = {}
        self.updates: dict[str, Symbol] = {}
        self.keys: list[Symbol] = []
        self._ids: dict[int, str] = {}
        self._seq: dict[tuple[str, str], int] = {}
        self._prefix: list[str] = []
        self._layers: list[Layer] = []
        self._prefixed: list[bool] = []

    # -- naming ------------------------------------------------------------------
    def layer_id(self, layer: Layer) -> str:
        """``<prefix>-<name>-<seq>`` (or ``<prefix>-<seq>`` unnamed), fixed at first use."""
        key = id(layer)
        if key not in self._ids:
            prefix = "-".join(self._prefix)
            count_key = (prefix, layer.name)
            seq = self._seq.get(count_key, 0)
            self._seq[count_key] = seq + 1
            parts = [*self._prefix, *([layer.name] if layer.name else []), str(seq)]
            self._ids[key] = "-".join(parts)
        return self._ids[key]

    def enter(self, layer: Layer, *, prefix: bool = True) -> None:
        """Builds inside ``layer`` until :meth:`leave`: parameters made meanwhile count it
        among their owners (for ``is_trainable``); with ``prefix`` (a nested model) its
        id also prefixes the ids of the layers inside. The outermost model enters with
        ``prefix=False``: NNC's ids do not name it."""
        if prefix:
            self._prefix.append(self.layer_id(layer))
        self._layers.append(layer)
        self._prefixed.append(prefix)

    def leave(self) -> None:
        """Leaves the layer last entered."""
        self._layers.pop()
        if self._prefixed.pop():
            self._prefix.pop()

    @contextlib.contextmanager
    def inside(self, layer: Layer, *, prefix: bool = True) -> Iterator[None]:
        """:meth:`enter` ``layer`` for the ``with`` block, then :meth:`leave` it."""
        self.enter(layer, prefix=prefix)
        try:
            yield
        finally:
            self.leave()

    # -- parameters ---------------------------------------------------------------
    def param(
        self,
        layer: Layer,
        index: int,
        shape: Sequence[int],
        init: Initializer,
        dtype: Any = np.float32,
        *,
        internal: bool = False,
    ) -> Symbol:
        """The symbol of parameter ``index`` of ``layer`` (a graph input, shared on reuse)."""
        pid = f"{'r' if internal else 't'}-{self.layer_id(layer)}-{index}"
        shape = tuple(int(n) for n in shape)
        if pid in self.params:
            known = self.params[pid]
            if known.shape != shape:
                raise ModelError(
                    f"layer {layer.describe()}: parameter {pid} was built as {list(known.shape)} "
                    f"and is now asked for as {list(shape)}; a shared layer must see inputs of "
                    "one shape"
                )
            return self.symbols[pid]
        owners = (*self._layers, layer)
        self.params[pid] = ParamInfo(pid, shape, np.dtype(dtype), init, owners, internal)
        self.symbols[pid] = self.b.input(shape, dtype, name=pid)
        return self.symbols[pid]

    def update(self, layer: Layer, index: int, value: Symbol) -> None:
        """Records the new value of internal ``index`` of ``layer`` (e.g. running mean)."""
        self.updates[f"r-{self.layer_id(layer)}-{index}"] = value

    def key(self) -> Symbol:
        """A fresh random key input (uint32[2]) for a random layer such as Dropout."""
        sym = self.b.input((2,), np.uint32, name=f"key[{len(self.keys)}]")
        self.keys.append(sym)
        return sym


class Layer:
    """Base of every cnnp layer.

    Subclasses implement :meth:`build`, which emits commands for given input symbols.

    Attributes:
        name: the layer's name (parameter ids use it); may be empty.
        is_trainable: True, False, or None to inherit from the enclosing model.
    """

    def __init__(self, *, name: str = "", is_trainable: bool | None = None):
        self.name = name
        self.is_trainable = is_trainable

    def __call__(self, *inputs: ModelIO) -> Any:
        for i, x in enumerate(inputs):
            if not isinstance(x, ModelIO):
                raise ModelError(
                    f"layer {self.describe()}: input {i} is a {type(x).__name__}; call layers on "
                    "fnnc.models.Input() or on other layers' outputs, then compile the model"
                )
        n = self.num_outputs(len(inputs))
        outs = tuple(ModelIO(self, tuple(inputs), i) for i in range(n))
        return outs[0] if n == 1 else outs

    def num_outputs(self, num_inputs: int) -> int:
        return 1

    def build(self, ctx: BuildContext, *xs: Symbol) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement build()")

    def describe(self) -> str:
        return f"{type(self).__name__}({self.name!r})" if self.name else type(self).__name__


# -- initialisers ---------------------------------------------------------------
def glorot_uniform(fan_in_axes: Sequence[int], fan_out_axes: Sequence[int]) -> Initializer:
    """Xavier/Glorot uniform over the given axes of the weight shape."""

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
        fan_in = int(np.prod([shape[a] for a in fan_in_axes]))
        fan_out = int(np.prod([shape[a] for a in fan_out_axes]))
        limit = float(np.sqrt(6.0 / max(1, fan_in + fan_out)))
        return jax.random.uniform(key, shape, dtype, -limit, limit)

    return init


def constant_init(value: float) -> Initializer:
    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
        return jnp.full(shape, value, dtype)

    return init


zeros = constant_init(0.0)
ones = constant_init(1.0)


def normal_init(std: float) -> Initializer:
    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
        return std * jax.random.normal(key, shape, dtype)

    return init
