"""Which kinds of value a command's hyper-parameters take: judged by each parameter's
default (an int for an int, a number for a float, ...), so that ``concat(axis="x")``
is refused where the command is made, with the kind it expects, instead of failing
in its shape rule. :func:`make_command` and the graph-file loader ask here.

>>> from fnnc.core.command import lookup
>>> param_fits(lookup("concat"), "axis", "x"), expected_kind(lookup("concat"), "axis")
(False, 'an int')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

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
}
"""What parameters of these names and kinds of default take besides: spatial ones
(convolution, pooling) one entry per axis (:mod:`fnnc.ops._spatial`), ``padding`` also
``"SAME"`` / ``"VALID"``; masked_fill's ``eq`` any number (NNC's is a float); scan's and
pipeline's ``checkpoint`` a :func:`fnnc.graph.remat` policy."""

FITS: dict[tuple[str, str, type], bool] = {}
"""``param_fits`` per (command, parameter, kind of value): commands are made often."""


def _accepted(opdef: OpDef, key: str) -> _Kinds | None:
    kind = type(opdef.param_defaults[key])
    kinds = _KINDS.get(kind)
    also = _ALSO.get((kind, key))
    if kinds is None or also is None:
        return kinds
    return kinds[0] + also[0], f"{kinds[1]} or {also[1]}"


def param_fits(opdef: OpDef, key: str, value: Any) -> bool:
    """Whether ``value`` is of a kind parameter ``key`` of ``opdef`` takes.

    The kind is judged by the parameter's default: a bool for a bool, an int (not a
    bool) for an int, a number for a float, a name or a dtype for a str, a sequence or
    one number for a tuple, and what ``_ALSO`` adds for some parameters. ``None`` fits
    any parameter (some give it a meaning: group_norm's ``reduce_axes=None``, all axes
    but the batch and the channels); so does any value of a parameter without a
    default or whose default is ``None``. The shape rules judge those.
    """
    kind = type(value)
    accepted = _accepted(opdef, key)
    if accepted is None or value is None:
        fits = True
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
