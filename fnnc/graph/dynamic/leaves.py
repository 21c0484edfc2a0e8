"""Where user values meet a dynamic graph's record: a value becomes a leaf version
(a variable's, a constant's, an array passed to ``exec``, a cached scalar), and a
variable given to a command becomes a read (its slot's version and view), with the
errors for a value that is no array and for a variable freed or of another graph.
:class:`~.graph.DynamicGraph`'s ``_leaf``, ``_scalar_array``, ``_read``, ``_slot`` and
``_view_value`` call these with the graph as first argument."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from fnnc.errors import DTypeError, GraphError

from .execute import reader
from .record import Read, Version, View
from .variable import Slot, Variable

if TYPE_CHECKING:
    from .graph import DynamicGraph


def leaf(dg: DynamicGraph, value: Any, grad: bool, name: str = "", where: str = "") -> Version:
    """A new version holding ``value``; ``where`` (``"variable"``, ``"exec relu:
    input 0"``) names it in the :class:`DTypeError` for a value that is no array."""
    if isinstance(value, Variable):  # of this graph or another: a copy of its value
        value = value._dg.value_of(value)
    label = f"{where} {name!r}" if name else where or "value"
    try:
        arr = value if isinstance(value, jax.Array) else np.asarray(value)
        if not isinstance(arr, jax.Array):
            arr = jax.device_put(_fits(arr, label))
    except (TypeError, ValueError) as e:
        if isinstance(e, DTypeError):  # _fits's own
            raise
        raise DTypeError(
            f"{label}: got {value!r:.40} ({type(value).__name__}), which is not an "
            f"array of numbers ({e}); pass a number, a NumPy or JAX array, or a list "
            "of numbers, e.g. np.asarray(x, np.float32)"
        ) from None
    v = dg._record.version(tuple(arr.shape), np.dtype(arr.dtype), arr, grad)
    v.name = name
    return v


def _fits(host: np.ndarray, label: str) -> np.ndarray:
    """``host`` itself; 64-bit integers that JAX (64-bit types off) would hold wrapped in
    32 bits (``np.int64(2**40)`` as 0, with a warning only) are a :class:`DTypeError`."""
    if host.dtype.kind in "iu" and host.dtype.itemsize == 8:
        held = jax.dtypes.canonicalize_dtype(host.dtype)
        if held != host.dtype and not np.array_equal(host.astype(held), host):
            info = np.iinfo(held)
            raise DTypeError(
                f"{label}: {host.dtype.name} values outside [{info.min}, {info.max}] (e.g. "
                f"{host[host.astype(held) != host].flat[0]}) do not fit in {held.name}, the "
                "type the graph holds them in (JAX's 64-bit types are off); pass values in "
                f"that range, floats, or enable jax_enable_x64"
            )
    return host


def scalar_array(dg: DynamicGraph, value: Any, dtype: np.dtype) -> Any:
    """``value`` as a device scalar of ``dtype``, cached per graph (bounded)."""
    key = (value, dtype)
    arr = dg._scalars.get(key)
    if arr is None:
        if len(dg._scalars) > 1024:
            dg._scalars.clear()
        arr = dg._scalars[key] = jax.device_put(np.asarray(value, dtype))
    return arr


def read(dg: DynamicGraph, x: Any, where: str, i: int) -> Read:
    """Input ``i`` of a command at ``where``: a variable's version and view, or an
    array taken as a constant leaf."""
    if isinstance(x, Variable):
        slot = x._slot
        if slot is None or x._dg is not dg:
            if slot is None:
                dg.freed_error(x, where)
            raise GraphError(f"{where}: input {i} {x.label} belongs to another DynamicGraph")
        return slot.version, x._view
    return leaf(dg, x, grad=False, where=f"{where}: input {i}"), None


def slot_of(dg: DynamicGraph, x: Any, where: str) -> Slot:
    """The slot of variable ``x`` (errors for anything else, for a freed one and for
    one of another graph)."""
    if not isinstance(x, Variable):
        raise GraphError(f"{where}: expected a Variable, got {type(x).__name__}")
    if x._slot is None:
        dg.freed_error(x, where)
    if x._dg is not dg:  # its slot is another graph's: set, free, grad would corrupt it
        raise GraphError(
            f"{where}: variable {x.label} belongs to another DynamicGraph; use it with the "
            "graph that made it, or copy its value in: dg.variable(x) or dg.constant(x)"
        )
    return x._slot  # type: ignore[return-value]


def view_value(dg: DynamicGraph, v: Version, view: View) -> Any:
    """The value ``view`` sees of version ``v`` (computed once, kept on ``v``)."""
    if v.views is None:
        v.views = {}
    got = v.views.get(view)
    if got is None:
        if v.value is None:
            dg.flush()
        got = v.views[view] = reader(view, v.shape, v.dtype)(v.value)
    return got
