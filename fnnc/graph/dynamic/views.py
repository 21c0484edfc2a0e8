"""Views of a dynamic graph's variables: NNC's alias arithmetic on (shape, base, stride).

A variable's alias (``x[0]``, ``x[1:, ::2]``, ``x.reshape(4, 2)``,
:meth:`DynamicGraph.alias`) is a :class:`~.record.View` of its slot's root value. These
functions compute such views from an index, a new shape or NNC's alias arguments, and
refuse, naming the variable, what no view of the root can be (negative steps, strided
reshapes, views past the end). An empty view sits at base 0: it reads nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fnnc.core.ir import contiguous_strides
from fnnc.errors import ShapeError

from .record import View


def index_view(parent: View, index: Any, label: str) -> View:
    """The view ``parent[index]`` for ints, slices (positive steps) and ``...``."""
    items = list(index) if isinstance(index, tuple) else [index]
    if any(i is Ellipsis for i in items):
        at = items.index(Ellipsis)
        fill = len(parent.shape) - (len(items) - 1)
        items[at : at + 1] = [slice(None)] * fill
    if len(items) > len(parent.shape):
        raise ShapeError(
            f"variable {label}: index {index!r} has {len(items)} entries for a "
            f"{len(parent.shape)}-d variable {list(parent.shape)}"
        )
    items += [slice(None)] * (len(parent.shape) - len(items))
    base, shape, stride = parent.base, [], []
    for d, (item, n, s) in enumerate(zip(items, parent.shape, parent.stride)):
        if isinstance(item, slice):
            start, stop, step = item.indices(n)
            if step <= 0:
                raise ShapeError(
                    f"variable {label}: slice {item} on axis {d} has a negative step; views "
                    "step forward only"
                )
            base += start * s
            shape.append(len(range(start, stop, step)))
            stride.append(s * step)
        elif isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            i = int(item) + (n if item < 0 else 0)
            if not 0 <= i < n:
                raise ShapeError(
                    f"variable {label}: index {int(item)} is out of range for axis {d} of size {n}"
                )
            base += i * s
        else:
            raise ShapeError(
                f"variable {label}: index {item!r} is not supported; use ints, slices and "
                "`...` (views), or a command such as ops.index_select"
            )
    return _at(View(tuple(shape), base, tuple(stride)))


def _at(view: View) -> View:
    """``view``, at base 0 when it is empty: it reads no element, and one that starts
    past the end (``x[6:]`` of 6 elements) was read there, a bare ValueError."""
    return view._replace(base=0) if 0 in view.shape and view.base else view


def reshape_view(parent: View, shape: tuple[int, ...], label: str) -> View:
    """``parent`` seen with another shape (``-1`` fills in); it must be consecutive."""
    size = math.prod(parent.shape)
    whole = (int, np.integer)
    if not all(isinstance(n, whole) and not isinstance(n, (bool, np.bool_)) for n in shape):
        raise ShapeError(  # int("a") was a bare ValueError, int(2.5) a silent 2
            f"variable {label}: reshape takes ints (one -1 for a size inferred), got "
            f"{list(shape)}; e.g. x.reshape(2, -1)"
        )
    dims = [int(n) for n in shape]
    if dims.count(-1) == 1:
        rest = math.prod(n for n in dims if n != -1)
        if rest == 0:  # any size fits: NumPy refuses, [0, 3] to (0, -1) is not [0, 0]
            raise ShapeError(
                f"variable {label}: cannot reshape {list(parent.shape)} to {list(shape)}: "
                "with another axis of size 0 the -1 could be any size; give it"
            )
        dims[dims.index(-1)] = size // rest
    if math.prod(dims) != size or any(n < 0 for n in dims):
        raise ShapeError(
            f"variable {label}: cannot reshape {list(parent.shape)} ({size} elements) to "
            f"{list(shape)}"
        )
    want = contiguous_strides(parent.shape)
    if any(s != w for n, s, w in zip(parent.shape, parent.stride, want) if n != 1):
        raise ShapeError(
            f"variable {label}: a reshape of the strided view {list(parent.shape)} (stride "
            f"{list(parent.stride)}) is not a view of consecutive elements; copy it first "
            "(ops.data_transfer)"
        )
    return _at(View(tuple(dims), parent.base, contiguous_strides(tuple(dims))))


def alias_view(
    parent: View,
    root_shape: tuple[int, ...],
    is_alias: bool,
    shape: Sequence[int],
    offset: Sequence[int] | None,
    stride: Sequence[int] | None,
    base: int | None,
    label: str,
) -> View:
    """NNC's alias rule, as :meth:`GraphBuilder.alias` applies it, on a variable's view."""
    bad = [n for n in shape if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0]
    if bad:  # -1 was a raw TypeError from JAX, 2.5 a silent 2
        raise ShapeError(
            f"alias of variable {label}: shape {list(shape)} has {bad[0]!r}; give sizes "
            "as ints >= 0 (an alias has no -1)"
        )
    shape = tuple(int(n) for n in shape)
    if stride is None:
        if len(shape) == len(parent.shape):
            stride = parent.stride if is_alias else contiguous_strides(root_shape)
        else:
            if is_alias:
                reshape_view(parent, parent.shape, label)  # raises unless consecutive
            stride = contiguous_strides(shape)
    stride = tuple(int(s) for s in stride)
    offset = tuple(int(o) for o in (offset or (0,) * len(shape)))
    if not len(offset) == len(stride) == len(shape):
        raise ShapeError(
            f"alias of variable {label}: shape {list(shape)}, offset {list(offset)} and "
            f"stride {list(stride)} must have one entry per view axis"
        )
    start = parent.base + sum(o * s for o, s in zip(offset, stride))
    view = View(shape, start if base is None else int(base), stride)
    size = math.prod(root_shape)
    last = view.base + sum((n - 1) * s for n, s in zip(shape, stride) if n > 0)
    if view.base < 0 or (0 not in shape and last >= size):
        raise ShapeError(
            f"alias of variable {label}: view {list(shape)} at base {view.base} with stride "
            f"{list(stride)} reaches element {last}, but the variable has {size} elements"
        )
    return _at(view)
