"""Layers and the symbolic model inputs/outputs they are called on.

A cnnp model, as in NNC, is a *graph generator*: every layer, when built, emits fnnc
commands into a :class:`~fnnc.graph.GraphBuilder` (a dense layer is one
``gemm[transpose_b=True]``, a layer norm one ``layer_norm``), so the compiled graph is
made of commands that passes, fusion and kernels understand. Parameters are graph
inputs named by NNC's ids (``t-linear-0-0``: weight 0 of the first layer named
"linear"; ``t-1-0``: weight 0 of the second unnamed layer with parameters; see
:class:`BuildContext`, in :mod:`fnnc.models.build_context`); internals such as running
statistics use ``r-``.

Layers are called on :class:`ModelIO` values (from :func:`Input` or other layers) to
describe a model functionally, Keras-style; nothing is computed until a model is
compiled.

The build context (:class:`BuildContext`, :class:`ParamInfo`, :class:`Checkpoint`, the
:data:`Initializer` type and :func:`is_int`) lives in :mod:`fnnc.models.build_context`;
this module re-exports it for layer authors.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.core.dtypes import at_least_float32, is_floating
from fnnc.core.ir import Symbol
from fnnc.core.params import flag_value
from fnnc.errors import ModelError as ModelError  # re-exported here for layer authors
from fnnc.models.build_context import BuildContext as BuildContext
from fnnc.models.build_context import Checkpoint as Checkpoint
from fnnc.models.build_context import Initializer as Initializer
from fnnc.models.build_context import ParamInfo as ParamInfo
from fnnc.models.build_context import is_int as is_int


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


def shape_of(
    layer: Layer, arg: str, value: Any, example: str, inferred: bool = False, sizes: bool = True
) -> tuple:
    """``value`` as a tuple of sizes: ints >= 0 (and ``-1`` once, if ``inferred``); else a
    :class:`ModelError` naming ``layer`` and its argument ``arg`` (``Reshape(None)`` was
    ``TypeError: 'NoneType' object is not iterable``). ``sizes=False``: any sequence, its
    entries checked later (at build)."""
    if isinstance(value, np.ndarray) and value.ndim == 1:  # NumPy's shapes, as tuple() took
        value = value.tolist()
    many = isinstance(value, Sequence) and not isinstance(value, str)
    got = tuple(value) if many else ()
    if many and not sizes:
        return got
    low = -1 if inferred else 0
    if not many or not all(is_int(n) and n >= low for n in got) or got.count(-1) > 1:
        what = "sizes >= 0" + (" (and one -1 for a size inferred)" if inferred else "")
        raise ModelError(
            f"layer {layer.describe()}: {arg} is {value!r:.40} ({type(value).__name__}); "
            f"expected a tuple of {what}, e.g. {example}"
        )
    return tuple(int(n) for n in got)


def flag(layer: Layer, arg: str, value: Any) -> bool:
    """``value`` as a bool when it is one (Python or NumPy) or NNC's int flag 0 / 1; else
    a :class:`ModelError` naming ``layer`` and its argument ``arg``, so a misplaced
    ``Dropout(0.1, entirety=0.5)`` or ``elementwise_affine="no"`` is refused instead of
    being true."""
    meant = flag_value(value)
    if meant is not None:
        return meant
    raise ModelError(
        f"layer {layer.describe()}: {arg} is {value!r:.40} ({type(value).__name__}); "
        "expected True or False (or NNC's 1 / 0)"
    )


def real_in(
    layer: Layer, arg: str, value: Any, low: float, high: float, *, open_high: bool = False,
    open_low: bool = False, hint: str = "",
) -> float:  # fmt: skip
    """``value`` as a float when it is a real number (not a bool, not NaN) in ``[low,
    high]`` (open at ``high`` with ``open_high``, at ``low`` with ``open_low``: ``low=-inf,
    high=inf`` and both open is any finite number); else a :class:`ModelError` naming
    ``layer``, its argument ``arg`` and ``hint`` (what the number means). Layer
    constructors check probabilities and rates with it, so ``BatchNorm(momentum=2.0)``
    is refused instead of making running statistics diverge."""
    if real_scalar(value):  # a NumPy or JAX 0-d array of a real number is one too
        value = float(value)
    ok = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    above = ok and (low < value if open_low else low <= value)
    if not above or not (value < high if open_high else value <= high):
        span = f"{'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"
        raise ModelError(
            f"layer {layer.describe()}: {arg} is {value!r:.40} ({type(value).__name__}); "
            f"expected a number in {span}{'; ' + hint if hint else ''}"
        )
    return float(value)


def real_scalar(value: Any) -> bool:
    """Whether ``value`` is a 0-d array (NumPy's or JAX's) of an int or a real float."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or getattr(value, "ndim", None) != 0:
        return False
    return np.dtype(dtype).kind in "iu" or is_floating(dtype)


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


class Layer:
    """Base of every cnnp layer.

    Subclasses implement :meth:`build`, which emits commands for given input symbols.

    Attributes:
        name: the layer's name (parameter ids use it); may be empty.
        is_trainable: True, False, or None to inherit from the enclosing model (also
            given as ``"inherit"`` or NNC's ``-1``; NNC's ints 1 and 0 are True and
            False); anything else is a :class:`ModelError`.
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

    @property
    def is_trainable(self) -> bool | None:
        """True, False, or None (inherit from the enclosing model)."""
        return self._is_trainable

    @is_trainable.setter
    def is_trainable(self, value: Any) -> None:
        inherit = isinstance(value, str) and value == "inherit"
        if value is None or inherit or (is_int(value) and value == -1):  # NNC's -1 too
            self._is_trainable = None
        elif flag_value(value) is not None:  # a bool, or NNC's 1 / 0
            self._is_trainable = flag_value(value)
        else:
            raise ModelError(
                f"layer {self.describe()}: is_trainable={value!r:.40} "
                f"({type(value).__name__}); expected True, False, or None (or 'inherit') "
                "to inherit from the enclosing model"
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

    def _node_label(self) -> str:
        """The name of the nodes of an unnamed layer with no parameters: its kind in
        lower case (``flatten``). It numbers nothing, so parameter ids never hold it."""
        return self._kind().lower()

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
        return uniform_draw(key, shape, dtype, limit)

    return _drawn(init)


def constant_init(value: float) -> Initializer:
    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
        return jnp.full(shape, value, dtype)

    return init


zeros = constant_init(0.0)
ones = constant_init(1.0)


def normal_init(std: float) -> Initializer:
    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
        return (std * jax.random.normal(key, shape, _draw_type(dtype))).astype(dtype)

    return _drawn(init)


def _draw_type(dtype: Any) -> Any:
    """The type to draw ``dtype``'s values in: float32 for a 16- or 8-bit float, else itself."""
    return at_least_float32(dtype) if is_floating(dtype) else dtype


def uniform_init(bound: float) -> Initializer:
    """Uniform in ``[-bound, bound)``, NNC's ``CMD_RANDOM_UNIFORM_FORWARD(-bound, bound)``."""

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
        return uniform_draw(key, shape, dtype, bound)

    return _drawn(init)


def uniform_draw(key: jax.Array, shape: tuple[int, ...], dtype: Any, bound: float) -> jax.Array:
    """``shape`` draws uniform in ``[-bound, bound)`` as ``dtype``, drawn in float32 (or
    wider) and rounded, as NNC's kernels draw a float and write it into a 16-bit tensor:
    drawn in bfloat16 itself, JAX's uniform takes only 128 values (float16: 1024)."""
    return jax.random.uniform(key, shape, _draw_type(dtype), -bound, bound).astype(dtype)


def _drawn(init: Initializer) -> Initializer:
    """``init`` marked as drawing at random: :meth:`BuildContext.param` requires a
    floating-point dtype of its parameters (an integer one cannot be drawn)."""
    init.draws = True  # type: ignore[attr-defined]
    return init
