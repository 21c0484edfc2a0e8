"""The context a model is built in: the builder, parameter ids, internals, random keys.

A :class:`BuildContext` lives for one build of one model. Layers emit commands into its
:class:`~fnnc.graph.GraphBuilder` (``ctx.b``) and ask it for their parameters
(:meth:`BuildContext.param`), which become graph inputs named by NNC's ids (``t-linear-0-0``:
weight 0 of the first layer named "linear"; ``r-`` for internals such as running
statistics), for updates of internals and for random keys. It also records what
gradient-checkpointed sub-models made (:class:`Checkpoint`). :class:`ParamInfo` is what
the model knows of a parameter before it has a value.

:mod:`fnnc.models.layer` re-exports every name here.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from fnnc.core.dtypes import is_floating
from fnnc.core.ir import Node, Symbol
from fnnc.errors import ModelError
from fnnc.graph import GraphBuilder

if TYPE_CHECKING:
    from fnnc.models.layer import Layer

Initializer = Callable[[jax.Array, tuple[int, ...], Any], jax.Array]


def is_int(n: Any) -> bool:
    """Whether ``n`` is a whole number given as one: a Python or NumPy integer, not a bool."""
    return isinstance(n, (int, np.integer)) and not isinstance(n, (bool, np.bool_))


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
        self._owners: dict[str, tuple[int, bool, int]] = {}  # id -> the _pids key that made it
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
        label (its kind, a command layer its command's name: ``relu``) that numbers
        nothing."""
        if id(layer) in self._paths:
            return self._paths[id(layer)]
        call = self._current(layer)
        if call is not None and (call.pushed or type(layer).owns_parameters):
            return self._label(layer)
        levels = [label for label, _ in self._levels]
        return "-".join([*levels, layer.name or layer._node_label()])

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
    def nodes(self) -> tuple[Node, ...]:
        """The nodes built so far, in order (their output ids are what a
        :class:`Checkpoint` counts)."""
        return tuple(self.b._nodes)

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
        update and Flax NNX's shared module do (else only the last update survived).

        Sharing is by layer object: another layer whose id comes out the same (an
        unnamed layer in a Sequential named ``block`` and a layer named ``block-1``)
        is a ModelError naming both, never a silent tie of their weights."""
        key = (id(layer), info.internal, index)
        pid = self._pids.setdefault(key, info.id)
        if self._owners.setdefault(pid, key) != key:
            self._collision(pid, layer)
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

    def _collision(self, pid: str, second: Layer) -> None:
        chain = self.params[pid].owners  # declared with the id: the first layer and its parents
        where = " in ".join(o.describe() for o in reversed(chain[-3:]))
        raise ModelError(
            f"layer {second.describe()}: its parameter id {pid} is already the id of a "
            f"parameter of another layer, {where}; two layers with one id would silently "
            "share weights. Rename one of them (or the Sequential/Model holding it) so the "
            "ids differ (an unnamed layer's id is its parent's name and a number, which a "
            "layer named '<parent>-<number>' repeats); to share weights on purpose, call "
            "one layer object twice or pass layer.parameter(i)"
        )

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
