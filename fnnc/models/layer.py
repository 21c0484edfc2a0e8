"""Layers, symbolic model inputs/outputs, and the context a model is built in.

A cnnp model, as in NNC, is a *graph generator*: every layer, when built, emits fnnc
commands into a :class:`~fnnc.graph.GraphBuilder` (a dense layer is one
``gemm[transpose_b=True]``, a layer norm one ``layer_norm``), so the compiled graph is
made of commands that passes, fusion and kernels understand. Parameters are graph
inputs named by NNC's ids (``t-linear-0-0``: weight 0 of the first layer named
"linear"; ``t-1-0``: weight 0 of the second unnamed layer with parameters; see
:class:`BuildContext`); internals such as running statistics use ``r-``.

Layers are called on :class:`ModelIO` values (from :func:`Input` or other layers) to
describe a model functionally, Keras-style; nothing is computed until a model is
compiled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.core.dtypes import is_floating
from fnnc.core.ir import Symbol
from fnnc.graph import GraphBuilder

Initializer = Callable[[jax.Array, tuple[int, ...], Any], jax.Array]


from fnnc.errors import ModelError  # noqa: E402  (re-exported here for layer authors)


def is_int(n: Any) -> bool:
    """Whether ``n`` is a whole number given as one: a Python or NumPy integer, not a bool."""
    return isinstance(n, (int, np.integer)) and not isinstance(n, (bool, np.bool_))


def positive_int(layer: Layer, arg: str, value: Any) -> int:
    """``value`` as an int when it is a positive whole number (a Python or NumPy integer,
    not a bool); else a :class:`ModelError` naming ``layer`` and its argument ``arg``.
    Layer constructors check their sizes (units, filters, heads) with it, so
    ``Dense(2.5)`` is refused instead of building 2 units."""
    if not is_int(value) or value < 1:
        raise ModelError(
            f"layer {layer.describe()}: {arg} is {value!r:.40} ({type(value).__name__}); "
            "expected a positive int, e.g. 16"
        )
    return int(value)


@dataclasses.dataclass(frozen=True, eq=False)
class ModelIO:
    """A symbolic value in a functional model: input ``index`` of a model, or output
    ``index`` of ``layer`` applied to ``args``; an input's declared ``shape`` and
    ``dtype`` (``None``: any)."""

    layer: Layer | None
    args: tuple[ModelIO, ...]
    index: int = 0
    name: str = ""
    shape: tuple[int | None, ...] | None = None
    dtype: Any = None


def Input(shape: Sequence[int | None] | None = None, dtype: Any = None, name: str = "") -> ModelIO:
    """A model input. ``shape`` and ``dtype`` are optional: compile takes the real input
    specs, and each build checks them against what is declared (``None`` in ``shape``:
    any size on that axis), a :class:`ModelError` naming the input otherwise.

    >>> from fnnc.models import Input, Dense, Model
    >>> x = Input((None, 4), "float32", name="features")
    >>> model = Model([x], [Dense(3, name="linear")(x)])
    """
    declared = None if dtype is None else np.dtype(dtype)
    return ModelIO(None, (), 0, name, None if shape is None else tuple(shape), declared)


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
    blocks: tuple[str, ...] = ()
    """For a parameter stacked by :class:`fnnc.models.Repeat` (``[n, *shape]``): the ids
    block ``0..n-1`` of the unrolled model gives each slice; empty otherwise."""

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


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """What building one gradient-checkpointed sub-model made.

    Attributes:
        layer: the sub-model, described (for messages).
        first, last: the symbol ids made while it was built are ``first <= id < last``
            (ids survive ``backward``/``minimize``, which only append).
        outputs: the root ids of its outputs (kept for the backward, not recomputed).
    """

    layer: str
    first: int
    last: int
    outputs: frozenset[int]


class _Call:
    """One build of one layer (NNC pushes a model on its id stack once per build)."""

    __slots__ = ("label", "layer", "pushed")

    def __init__(self, layer: Layer):
        self.layer = layer
        self.label: str | None = None  # "<name>-<seq>" or "<seq>" once numbered
        self.pushed = False  # named: on the id stack for the whole build


class BuildContext:
    """The state of one model build: the builder, parameters, internals, random keys.

    Parameter ids follow NNC's ``ccv_cnnp_model_build`` (``lib/nnc/_ccv_cnnp_model.h``):
    every *named* layer or model is pushed on an id stack for the whole of each of its
    builds; an *unnamed* one is pushed only if its kind owns parameters or internals,
    after it is built, just to name them, so unnamed models and parameter-free layers
    add no level and take no number. A push numbers the layer in its parent's bank, one
    counter per name (unnamed ones share the counter of ``""``), from 0, once per build:
    a layer called twice takes two numbers, but its parameters keep the ids of its first
    build. An id is ``t-`` (``r-`` for internals), each level's ``<name>-<seq>`` or
    ``<seq>``, then the parameter's index in its layer, joined with ``-``.
    """

    def __init__(self, training: bool):
        self.b = GraphBuilder()
        self.training = training
        self.params: dict[str, ParamInfo] = {}
        self.symbols: dict[str, Symbol] = {}
        self.updates: dict[str, Symbol] = {}
        self.keys: list[Symbol] = []
        self._pids: dict[tuple[int, bool, int], str] = {}  # (layer, internal, index) -> id
        self._paths: dict[int, str] = {}  # layer -> its id path at its first parameter
        self._root: dict[str, int] = {}  # NNC's name bank of the outermost level
        self._levels: list[tuple[str, dict[str, int]]] = []  # (label, bank) per level
        self._calls: list[_Call] = []
        self._layers: list[Layer] = []
        self._began: list[bool] = []
        self.checkpoints: list[Checkpoint] = []  # gradient-checkpointed sub-models built
        self._checkpointing = 0  # > 0 while inside a checkpointed sub-model

    # -- naming ------------------------------------------------------------------
    def _number(self, layer: Layer) -> str:
        """Pushes ``layer`` in the current bank: ``<name>-<seq>`` or ``<seq>``."""
        bank = self._levels[-1][1] if self._levels else self._root
        seq = bank[layer.name] = bank.get(layer.name, -1) + 1
        return f"{layer.name}-{seq}" if layer.name else str(seq)

    def begin(self, layer: Layer) -> bool:
        """Starts a build of ``layer`` (False, doing nothing, if it is the build under
        way, e.g. a ``super().build``): a named layer is numbered and pushed now."""
        if self._calls and self._calls[-1].layer is layer:
            return False
        call = _Call(layer)
        if layer.name:
            call.label, call.pushed = self._number(layer), True
            self._levels.append((call.label, {}))
        self._calls.append(call)
        return True

    def end(self) -> None:
        """Ends the build last begun; an unnamed layer whose kind owns parameters
        (``Layer.owns_parameters``) is numbered even if this one made none."""
        call = self._calls.pop()
        if call.pushed:
            self._levels.pop()
        elif call.label is None and type(call.layer).owns_parameters:
            self._number(call.layer)

    def _current(self, layer: Layer) -> _Call | None:
        return self._calls[-1] if self._calls and self._calls[-1].layer is layer else None

    def _label(self, layer: Layer) -> str:
        """The id path of ``layer`` in the build under way, numbering it if unnamed
        (once per build; a layer asked for outside its own build, once per context)."""
        levels = [label for label, _ in self._levels]
        call = self._current(layer)
        if call is None:
            if id(layer) in self._paths:
                return self._paths[id(layer)]
            return "-".join([*levels, self._number(layer)])
        if not call.pushed and call.label is None:
            call.label = self._number(layer)
        return "-".join(levels if call.pushed else [*levels, str(call.label)])

    def layer_id(self, layer: Layer) -> str:
        """The id path of ``layer`` (``fc1-0``, ``mlp-0-1``): what its parameter ids
        start with; used for graph node names too. A parameter-free unnamed layer gets a
        label (its kind) that numbers nothing."""
        if id(layer) in self._paths:
            return self._paths[id(layer)]
        call = self._current(layer)
        if call is not None and (call.pushed or type(layer).owns_parameters):
            return self._label(layer)
        levels = [label for label, _ in self._levels]
        return "-".join([*levels, layer.name or layer._kind().lower()])

    def enter(self, layer: Layer, *, prefix: bool = True) -> None:
        """Builds inside ``layer`` until :meth:`leave`: parameters made meanwhile count it
        among their owners (for ``is_trainable``), and it is pushed on the id stack if
        named (:meth:`begin`). ``prefix`` is kept for callers: NNC names the outermost
        model in ids too when it has a name, so it changes nothing."""
        self._began.append(self.begin(layer))
        self._layers.append(layer)

    def leave(self) -> None:
        """Leaves the layer last entered."""
        self._layers.pop()
        if self._began.pop():
            self.end()

    @contextlib.contextmanager
    def inside(self, layer: Layer, *, prefix: bool = True) -> Iterator[None]:
        """:meth:`enter` ``layer`` for the ``with`` block, then :meth:`leave` it."""
        self.enter(layer, prefix=prefix)
        try:
            yield
        finally:
            self.leave()

    # -- gradient checkpointing -----------------------------------------------------
    @contextlib.contextmanager
    def checkpointed(self, layer: Layer, enabled: bool) -> Iterator[list[Symbol]]:
        """Records ``layer`` as a :class:`Checkpoint` if ``enabled`` and not already inside
        one (an inner checkpointed model is part of the outer region, as in NNC); the
        ``with`` body appends the sub-model's output symbols to the list it gets."""
        outputs: list[Symbol] = []
        if not enabled or self._checkpointing:
            yield outputs
            return
        first = len(self.b._symbols)  # ids made from here on belong to the region
        self._checkpointing += 1
        try:
            yield outputs
        finally:
            self._checkpointing -= 1
        roots = frozenset(getattr(o, "root", o.id) for o in outputs)
        self.checkpoints.append(Checkpoint(layer.describe(), first, len(self.b._symbols), roots))

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
        """The symbol of parameter (or internal) ``index`` of ``layer``: a graph input
        named by its NNC id, the same symbol on every build of a shared layer, except
        that an internal an earlier call :meth:`update` d is that new value (see
        :meth:`declare`). An ``init`` that draws at random (:func:`glorot_uniform`,
        :func:`normal_init`) needs a floating-point ``dtype``: else a ModelError naming
        the layer (layers give their weights the input's type, so an integer input is
        the usual cause)."""
        if not all(is_int(n) and n >= 0 for n in shape):
            raise ModelError(
                f"layer {layer.describe()}: parameter {index} has the shape {list(shape)}; "
                "expected whole sizes >= 0 (a layer size is an int, not a float or str)"
            )
        shape = tuple(int(n) for n in shape)
        path = self._paths.setdefault(id(layer), self._label(layer))
        kind = "r" if internal else "t"
        pid = self._pids.setdefault((id(layer), internal, index), f"{kind}-{path}-{index}")
        if getattr(init, "draws", False) and not is_floating(dtype):
            raise ModelError(
                f"layer {layer.describe()}: parameter {pid} {list(shape)} is drawn at random, "
                f"so it needs a floating-point dtype, got {np.dtype(dtype).name}; layers give "
                "their weights their input's type: pass a floating-point input (look integer "
                "ids up with an Embedding, or convert the input first: "
                "CommandLayer(ops.datatype_conversion(dtype=np.float32)))"
            )
        info = ParamInfo(pid, shape, np.dtype(dtype), init, (*self._layers, layer), internal)
        return self.declare(layer, index, info)

    def declare(self, layer: Layer, index: int, info: ParamInfo) -> Symbol:
        """The graph input of parameter ``info`` (index ``index`` of ``layer``) under the
        id ``info.id`` as first declared for that index: the same symbol on every build
        of a shared layer. :meth:`param` names the id; a layer that forms ids itself
        (:class:`fnnc.models.Repeat`) declares them here.

        An internal already given a new value by :meth:`update` in this build is that
        value: a layer with state (a batch norm) called twice chains its updates, the
        second call reading the statistics the first one updated, as NNC's in-place
        update and Flax NNX's shared module do (else only the last update survived)."""
        pid = self._pids.setdefault((id(layer), info.internal, index), info.id)
        if pid in self.params:
            known = self.params[pid]
            if known.shape != info.shape:
                raise ModelError(
                    f"layer {layer.describe()}: parameter {pid} was built as {list(known.shape)} "
                    f"and is now asked for as {list(info.shape)}; a shared layer must see "
                    "inputs of one shape"
                )
            return self.updates.get(pid, self.symbols[pid])
        self.params[pid] = dataclasses.replace(info, id=pid) if pid != info.id else info
        self.symbols[pid] = self.b.input(info.shape, info.dtype, name=pid)
        return self.symbols[pid]

    def level(self) -> tuple[list[str], dict[str, int]]:
        """The id stack now (the labels of the levels pushed) and the name bank new
        numbers are drawn from (NNC's per-name counters of the current level)."""
        bank = self._levels[-1][1] if self._levels else self._root
        return [label for label, _ in self._levels], bank

    @property
    def owners(self) -> tuple[Layer, ...]:
        """The layers entered now, outermost first (the owners of a parameter made now)."""
        return tuple(self._layers)

    def update(self, layer: Layer, index: int, value: Symbol) -> None:
        """Records the new value of internal ``index`` of ``layer`` (e.g. running mean)."""
        pid = self._pids.get((id(layer), True, index))
        if pid is None:
            raise ModelError(
                f"layer {layer.describe()}: update of internal {index} before "
                "ctx.param(..., internal=True) made it"
            )
        self.updates[pid] = value

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
        owns_parameters: (class) whether layers of this kind own parameters or
            internals, as NNC's model kinds with ``add_to_parameter``: an unnamed one
            then takes a number in ids even when an instance makes none (a layer norm
            without affine parameters). Layers that call ``ctx.param`` are numbered
            either way.

    Every subclass's ``build`` runs as one build in the :class:`BuildContext`
    (:meth:`BuildContext.begin` / :meth:`BuildContext.end`), which is how ids are
    scoped.
    """

    owns_parameters: bool = False

    def __init__(self, *, name: str = "", is_trainable: bool | None = None, **unknown: Any):
        self.name = name
        self.is_trainable = is_trainable
        if unknown:
            given = ", ".join(f"{k}={v!r:.40}" for k, v in unknown.items())
            hint = (
                " An activation is a layer of its own, placed after this one: ReLU(), "
                "Activation('gelu')."
                if "activation" in unknown
                else ""
            )
            raise ModelError(
                f"layer {self.describe()}: unknown keyword argument(s) {given}; "
                f"{type(self).__name__} takes {', '.join(self.keyword_arguments())}.{hint}"
            )

    @classmethod
    def keyword_arguments(cls) -> list[str]:
        """The keyword arguments this layer's constructor accepts, its own then its bases'
        (``name``, ``is_trainable``), for messages."""
        names: list[str] = []
        for klass in cls.__mro__:
            init = klass.__dict__.get("__init__")
            if init is None or klass is object:
                continue
            for p in inspect.signature(init).parameters.values():
                named = p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                if named and p.name != "self" and p.name not in names:
                    names.append(p.name)
        return names

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        build = cls.__dict__.get("build")
        if build is not None and not getattr(build, "_scoped", False):
            cls.build = _scoped(build)  # type: ignore[method-assign]

    def __call__(self, *inputs: ModelIO) -> Any:
        for i, x in enumerate(inputs):
            if x is None:
                raise ModelError(
                    f"layer {self.describe()}: input {i} is None; a layer's inputs are all "
                    "given (a model graph has no empty input slot): leave out trailing "
                    "optional inputs, or feed a neutral value (a Parameter or constant "
                    "layer holding zeros for an additive mask)"
                )
            if not isinstance(x, ModelIO):
                raise ModelError(
                    f"layer {self.describe()}: input {i} is a {type(x).__name__}; call layers on "
                    "fnnc.models.Input() or on other layers' outputs, then compile the model"
                )
        n = self.num_outputs(len(inputs))
        outs = tuple(ModelIO(self, tuple(inputs), i) for i in range(n))
        self._applied = outs[0]  # what parameter() follows
        return outs[0] if n == 1 else outs

    def parameter(self, index: int = 0) -> ModelIO:
        """Parameter ``index`` of this layer as a value other layers take (NNC's
        ``ccv_cnnp_model_parameters`` as a model input; a Dense's 0 is its weight, 1 its
        bias). Apply the layer first; see :mod:`fnnc.models.parameter_of`."""
        from fnnc.models.parameter_of import parameter_of

        return parameter_of(self, index)

    def num_outputs(self, num_inputs: int) -> int:
        return 1

    def build(self, ctx: BuildContext, *xs: Symbol) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement build()")

    def _kind(self) -> str:
        """The layer's kind in messages and unnamed node names: its class's name."""
        return type(self).__name__

    def describe(self) -> str:
        return f"{self._kind()}({self.name!r})" if self.name else self._kind()


def _scoped(build: Callable[..., Any]) -> Callable[..., Any]:
    """``build`` run as one build of its layer in the :class:`BuildContext`."""

    @functools.wraps(build)
    def scoped(self: Layer, ctx: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(ctx, BuildContext) or not ctx.begin(self):
            return build(self, ctx, *args, **kwargs)
        try:
            return build(self, ctx, *args, **kwargs)
        finally:
            ctx.end()

    scoped._scoped = True  # type: ignore[attr-defined]
    return scoped


# -- initialisers ---------------------------------------------------------------
def glorot_uniform(fan_in_axes: Sequence[int], fan_out_axes: Sequence[int]) -> Initializer:
    """Xavier/Glorot uniform over the given axes of the weight shape."""

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
        fan_in = int(np.prod([shape[a] for a in fan_in_axes]))
        fan_out = int(np.prod([shape[a] for a in fan_out_axes]))
        limit = float(np.sqrt(6.0 / max(1, fan_in + fan_out)))
        return jax.random.uniform(key, shape, dtype, -limit, limit)

    return _drawn(init)


def constant_init(value: float) -> Initializer:
    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
        return jnp.full(shape, value, dtype)

    return init


zeros = constant_init(0.0)
ones = constant_init(1.0)


def normal_init(std: float) -> Initializer:
    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
        return std * jax.random.normal(key, shape, dtype)

    return _drawn(init)


def _drawn(init: Initializer) -> Initializer:
    """``init`` marked as drawing at random: :meth:`BuildContext.param` requires a
    floating-point dtype of its parameters (an integer one cannot be drawn)."""
    init.draws = True  # type: ignore[attr-defined]
    return init
