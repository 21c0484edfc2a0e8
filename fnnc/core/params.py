"""Which kinds of value a command's hyper-parameters take: judged by each parameter's
default (an int for an int, a number for a float, ...), so that ``concat(axis="x")``
is refused where the command is made, with the kind it expects, instead of failing
in its shape rule. :func:`make_command` and the graph-file loader ask here. It also
holds :func:`freeze`, which makes a hyper-parameter hashable.

>>> from fnnc.core.command import lookup
>>> param_fits(lookup("concat"), "axis", "x"), expected_kind(lookup("concat"), "axis")
(False, 'an int')
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from fnnc.errors import CommandError

if TYPE_CHECKING:
    from fnnc.core.command import OpDef

_Kinds = tuple[tuple[type, ...], str]  # the kinds of value, and them in words

_KINDS: dict[type, _Kinds] = {
    bool: ((bool, np.bool_), "a bool"),
    int: ((int, np.integer), "an int"),
    float: ((int, float, np.integer, np.floating), "a number"),
    str: ((str, np.dtype, type), "a name or a dtype"),  # a dtype name takes np.float32 too
    tuple: (
        (tuple, list, jax.sharding.PartitionSpec, int, float, np.integer, np.floating),
        "a tuple or one number",  # one axis, or upsample's scale=1.5
    ),
}
"""Per kind of default, the kinds of value a parameter takes (``True`` is not an int)."""

_PER_AXIS = ((tuple, list), "one int per spatial axis")
_ALSO: dict[tuple[type, str], _Kinds] = {
    (int, "strides"): _PER_AXIS,
    (int, "dilation"): _PER_AXIS,
    (int, "output_padding"): _PER_AXIS,
    (int, "padding"): ((tuple, list, str), "one per spatial axis or 'SAME' or 'VALID'"),
    (int, "eq"): ((float, np.floating), "a float"),
    (bool, "checkpoint"): ((str, Callable), "a remat policy (a name or a function)"),
    (str, "format"): ((int, np.integer), "NNC's format int (1 NCHW, 2 NHWC)"),
}
"""What parameters of these names and kinds of default take besides: spatial ones
(convolution, pooling) one entry per axis (:mod:`fnnc.ops._spatial`), ``padding`` also
``"SAME"`` / ``"VALID"``; a ``format`` (upsample's) NNC's ints too; masked_fill's
``eq`` any number (NNC's is a float); scan's and pipeline's ``checkpoint`` a
:func:`fnnc.graph.remat` policy."""

FITS: dict[tuple[str, str, type], bool] = {}
"""``param_fits`` per (command, parameter, kind of value): commands are made often."""


def _accepted(opdef: OpDef, key: str) -> _Kinds | None:
    kind = type(opdef.param_defaults[key])
    kinds = _KINDS.get(kind)
    also = _ALSO.get((kind, key))
    if kinds is None or also is None:
        return kinds
    return kinds[0] + also[0], f"{kinds[1]} or {also[1]}"


def flag_value(value: Any) -> bool | None:
    """The bool an NNC flag means: a Python or NumPy bool, or NNC's ``int`` flag ``0`` /
    ``1``; ``None`` for anything else (``bool("no")`` would be True). Commands, layers,
    model switches and dataframe options all read flags through this."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    return None


def require_flag(value: Any, what: str, error: type[Exception]) -> bool:
    """:func:`flag_value` of ``value``, or ``error`` saying that ``what`` (e.g.
    ``"CSVLogger(append=...)"``) takes True or False: a ``"no"`` is not read as True."""
    meant = flag_value(value)
    if meant is None:
        raise error(
            f"{what} takes True or False (or NNC's 1 / 0), got {type(value).__name__} {value!r:.40}"
        )
    return meant


def is_count(value: Any, least: int = 0) -> bool:
    """Whether ``value`` is an int (Python or NumPy, not a bool) of at least ``least``:
    a count or a size a caller gives (``2.0``, ``'2'`` and ``True`` are not)."""
    return (
        isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
    ) and value >= least


def param_fits(opdef: OpDef, key: str, value: Any) -> bool:
    """Whether ``value`` is of a kind parameter ``key`` of ``opdef`` takes.

    The kind is judged by the parameter's default: a bool for a bool, an int (not a
    bool) for an int, a number for a float, a name or a dtype for a str, a sequence or
    one number for a tuple, and what ``_ALSO`` adds for some parameters. ``None`` fits
    a parameter whose default is a tuple or a str (some give it a meaning: group_norm's
    ``reduce_axes=None``, all axes but the batch and the channels), not one whose default
    is a bool or a number: it reached the forward there (``gemm(transpose_a=None)`` a
    ``KeyError``, ``layer_norm(epsilon=None)`` a ``TypeError`` on a tracer) or was read as
    ``False`` or NaN (``masked_fill(fill=None)`` filled NaNs). Any value fits a parameter
    without a default or whose default is ``None``. The shape rules judge those.
    """
    kind = type(value)
    accepted = _accepted(opdef, key)
    if accepted is None:
        fits = True
    elif value is None:
        fits = type(opdef.param_defaults[key]) not in (bool, int, float)
    elif kind is bool or kind is np.bool_:  # a subclass of int, but no int
        fits = bool in accepted[0]
    else:
        fits = issubclass(kind, accepted[0])
    FITS[(opdef.name, key, kind)] = fits
    return fits


def expected_kind(opdef: OpDef, key: str) -> str:
    """What :func:`param_fits` accepts for ``key``, in words (``"an int"``)."""
    accepted = _accepted(opdef, key)
    return "any value" if accepted is None else accepted[1]


_NAN = float("nan")


class _NegativeZero(float):
    """``-0.0`` as a hyper-parameter. Python holds ``0.0 == -0.0`` (one hash), yet
    ``scalar_mul(a=-0.0)`` gives ``-0.0`` where ``a=0.0`` gives ``0.0`` and ``1 / x``
    tells them apart: as equal commands they shared compiled programs, kernels and CSE
    nodes, so whichever ran first answered for both. This value is equal only to a
    negative zero (JAX takes it as the float it is)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, float) and other == 0.0 and math.copysign(1.0, other) < 0

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash((float, "-0.0"))

    def __repr__(self) -> str:
        return "-0.0"

    def __reduce__(self) -> tuple[Any, tuple[float]]:
        return (freeze, (-0.0,))


_NEGATIVE_ZERO = _NegativeZero(-0.0)


def freeze(value: Any) -> Hashable:
    """Makes a hyper-parameter hashable: lists become tuples, dtypes become np.dtype, and
    NumPy integer, bool and float scalars (``np.int64(2)`` from ``np.arange`` or ``shape //
    2``, ``np.float32(2)`` from an array) the Python ``int`` / ``bool`` / ``float`` they
    equal, so every rule that takes an int takes them and listings print ``strides=2``
    (a float32 scalar against a tuple default, ``(2, 2) != np.float32(2)``, compared as an
    array and broke printing the command, so every eager call)."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        value = float(value)  # exact; NaN and -0.0 are then frozen as Python floats below
    if isinstance(value, np.ndarray):
        raise CommandError("array hyper-parameters are not allowed; use fnnc.ops.constant")
    if isinstance(value, np.dtype):
        return value
    if isinstance(value, float) and value != value:
        return _NAN  # one NaN object: NaN != NaN, but equal tuples compare items by identity
    if isinstance(value, float) and value == 0.0 and math.copysign(1.0, value) < 0:
        return _NEGATIVE_ZERO
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value)
    if hasattr(value, "dtype") and not hasattr(value, "shape"):  # jnp.float32 and kin
        return np.dtype(value.dtype)
    try:
        hash(value)
    except TypeError:
        raise CommandError(f"hyper-parameter {value!r} is not hashable") from None
    return value
