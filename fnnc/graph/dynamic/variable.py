"""Variables: handles on the values of a dynamic graph, with NumPy-like operator sugar.

A variable names a *slot*, the storage NNC's tensor variable owns; the slot holds the
current SSA version. Aliases (``x[0]``, ``x.reshape(4, 2)``, :meth:`DynamicGraph.alias`)
are variables on the same slot with a view, so they see every new version of their
root, and an alias of an alias is a view of the root (NNC's rule). Writing through
an alias (``y[0] = z``) makes a new version of the whole slot.

Operators record commands: ``+`` is ``ewsum``, ``-`` ``add[q=-1]``, ``*`` ``ewprod``
(``scalar_mul`` with a Python number), ``/`` ``ewdiv`` (``scalar_mul`` where that
is exact, :func:`.operands.reciprocal`), ``@`` ``gemm``, ``**`` the
commands :mod:`.operands` lists; ``sum()`` is ``reduce_sum`` over every axis (kept as
size 1, NNC's convention), ``mean(axis)`` ``reduce_mean`` (axes dropped, as NumPy does),
``.T`` ``transpose``. The other operand may be a variable, a NumPy or JAX array or a
Python number, on either side (``np_arr + x`` is a variable too); anything else is a
:class:`~fnnc.errors.DTypeError` naming it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fnnc import ops
from fnnc.core.ir import contiguous_strides
from fnnc.errors import GraphError, ShapeError
from fnnc.graph._io import describe

from . import operands
from .record import Version, View

if TYPE_CHECKING:
    import jax

    from .graph import DynamicGraph

_SLOT_IDS = itertools.count()


class Slot:
    """The storage of a root variable: its current version and how many handles hold it."""

    __slots__ = ("handles", "id", "name", "trainable", "version")

    def __init__(self, version: Version, name: str, trainable: bool):
        self.version = version
        self.handles = 0
        self.name = name
        self.trainable = trainable
        self.id = next(_SLOT_IDS)  # for labels (#3); memoised results share versions
        version.pins += 1


_SUB = ops.add(q=-1.0)
_RSUB = ops.add(p=-1.0)
_ADD = ops.ewsum()
_MUL = ops.ewprod()
_DIV = ops.ewdiv()
_MATMUL = ops.gemm()
_NEG = ops.scalar_mul(a=-1.0)


class Variable:
    """A value of a :class:`~fnnc.graph.DynamicGraph` (NNC's tensor variable).

    Read it with :meth:`numpy` or ``np.asarray``; compute with commands through
    :meth:`DynamicGraph.exec` or the operators. A variable is freed when
    :meth:`DynamicGraph.free` is called on it or when Python drops it.
    """

    __slots__ = ("__weakref__", "_dg", "_slot", "_view", "name")

    def __init__(self, dg: DynamicGraph, slot: Slot, view: View | None, name: str):
        self._dg = dg
        self._slot: Slot | None = slot
        self._view = view
        self.name = name
        slot.handles += 1

    # -- what it is --------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._view.shape if self._view is not None else self._live().version.shape

    @property
    def dtype(self) -> np.dtype:
        return self._live().version.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def is_alias(self) -> bool:
        return self._view is not None

    @property
    def requires_grad(self) -> bool:
        """Whether a gradient can be taken with respect to it."""
        slot = self._live()
        return slot.trainable and slot.version.source

    @property
    def grad(self) -> Variable | None:
        """The gradient accumulated for it by :meth:`DynamicGraph.backward`, if any."""
        return self._dg.grad(self)

    @property
    def value(self) -> jax.Array:
        """The value as a JAX array (a sync point in lazy mode).

        The array is the variable's own buffer, not a copy: an optimizer step that updates
        the variable in place (``apply_gradients``, ``minimize``) spends it, and reading
        it afterwards raises JAX's "Array has been deleted". Keep values across a step
        with :meth:`numpy` (a copy) or ``jnp.array(v.value)``.
        """
        return self._dg.value_of(self)

    def numpy(self) -> np.ndarray:
        """The value as a NumPy array."""
        return np.asarray(self.value)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.asarray(self.value)
        return out if dtype is None else out.astype(dtype)

    def item(self) -> Any:
        return self.numpy().item()

    def __float__(self) -> float:
        return float(self.item())

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError(f"len() of the scalar variable {self.label}")
        return self.shape[0]

    def __iter__(self) -> Iterator[Variable]:
        return (self[i] for i in range(len(self)))

    @property
    def label(self) -> str:
        """How messages name it: ``'x'`` or ``#3`` (its slot) when unnamed."""
        slot = self._slot
        if self.name:
            return repr(self.name)
        return f"#{slot.id}" if slot is not None else "(unnamed)"

    def __repr__(self) -> str:
        if self._slot is None:
            return f"<Variable {self.label} (freed)>"
        kind = "alias of " + (self._slot.name or f"#{self._slot.id}") if self._view else "variable"
        dtype = self.dtype.name
        return f"<Variable {self.label}: {dtype}{list(self.shape)} {kind}>"

    def _live(self) -> Slot:
        if self._slot is None:
            self._dg.freed_error(self, "use")
        return self._slot  # type: ignore[return-value]

    # -- views -------------------------------------------------------------------
    def __getitem__(self, index: Any) -> Variable:
        return self._dg.view(self, index_view(self._root_view(), index, self.label))

    def __setitem__(self, index: Any, value: Any) -> None:
        self._dg.write(self[index], value)

    def reshape(self, *shape: Any) -> Variable:
        """A reshaped alias (the variable must cover consecutive elements)."""
        dims = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], Sequence) else shape
        return self._dg.view(self, reshape_view(self._root_view(), dims, self.label))

    def _root_view(self) -> View:
        if self._view is not None:
            return self._view
        shape = self._live().version.shape
        return View(shape, 0, contiguous_strides(shape))

    # -- operators ---------------------------------------------------------------
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        # ``np_arr + x`` asks here first; without this NumPy would read x as an array
        return operands.array_ufunc(ufunc, method, inputs, kwargs)

    def _binary(self, cmd: Any, other: Any, op: str, swap: bool = False) -> Variable:
        other = operands.operand(self, other, op)
        return self._dg.exec(cmd, other, self) if swap else self._dg.exec(cmd, self, other)

    def __add__(self, other: Any) -> Variable:
        return self._binary(_ADD, other, "+")

    def __radd__(self, other: Any) -> Variable:
        return self._binary(_ADD, other, "+", swap=True)

    def __sub__(self, other: Any) -> Variable:
        return self._binary(_SUB, other, "-")

    def __rsub__(self, other: Any) -> Variable:
        return self._binary(_RSUB, other, "-")

    def __mul__(self, other: Any) -> Variable:
        if operands.is_number(other) and not isinstance(other, (bool, np.bool_)):
            return operands.scale(self, other)
        return self._binary(_MUL, other, "*")

    def __rmul__(self, other: Any) -> Variable:
        return self.__mul__(other)

    def __truediv__(self, other: Any) -> Variable:
        operands.refuse_integer_division(self, "/")  # v / 1 too, not just v / 2
        if operands.is_number(other) and not isinstance(other, (bool, np.bool_)):
            a = operands.reciprocal(other, self.dtype)
            if a is not None:
                return self._dg.exec(ops.scalar_mul(a=a), self)
        return self._binary(_DIV, other, "/")

    def __rtruediv__(self, other: Any) -> Variable:
        operands.refuse_integer_division(self, "/")
        return self._binary(_DIV, other, "/", swap=True)

    def __matmul__(self, other: Any) -> Variable:
        return self._binary(_MATMUL, other, "@")

    def __rmatmul__(self, other: Any) -> Variable:
        return self._binary(_MATMUL, other, "@", swap=True)

    def __pow__(self, other: Any) -> Variable:
        return operands.power(self, other)

    def __rpow__(self, other: Any) -> Variable:
        return operands.rpower(self, other)

    def __neg__(self) -> Variable:
        return self._dg.exec(_NEG, self)

    @property
    def T(self) -> Variable:
        """The axes reversed (``transpose``); a variable of fewer than two axes itself."""
        return operands.transposed(self)

    def mean(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Variable:
        """The mean over ``axis`` (all by default), as ``np.mean`` (``reduce_mean``).

        Args:
            axis: an axis or axes (negative counts from the end); ``None``: every axis.
            keepdims: keep the reduced axes as size 1 (NNC's ``reduce_mean`` shape).
        """
        return operands.reduce(self, "mean", axis, keepdims)

    def sum(self, axis: int | Sequence[int] | None = None, keepdims: bool = True) -> Variable:
        """The sum over ``axis`` (all by default), as ``np.sum`` (``reduce_sum``).

        Args:
            axis: an axis or axes (negative counts from the end); ``None``: every axis.
            keepdims: keep the reduced axes as size 1, NNC's ``reduce_sum`` shape. The
                default is ``True`` (``x.sum()`` has always kept one element per axis,
                so a loss stays ``[1, ...]``); ``False`` drops them as ``np.sum`` and
                :meth:`mean` do.
        """
        return operands.reduce(self, "sum", axis, keepdims)

    def max(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Variable:
        """The largest element over ``axis`` (all by default), as ``np.max``
        (``reduce_max``); arguments as :meth:`mean`'s."""
        return operands.reduce(self, "max", axis, keepdims)

    def min(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Variable:
        """The smallest element over ``axis`` (all by default), as ``np.min``
        (``reduce_min``); arguments as :meth:`mean`'s."""
        return operands.reduce(self, "min", axis, keepdims)

    def __del__(self) -> None:
        slot = self._slot
        if slot is not None:
            self._slot = None
            # Plain try/except: at interpreter shutdown module globals (contextlib
            # included) may already be None, but the builtins are still there.
            try:  # noqa: SIM105 - contextlib may be gone at shutdown
                self._dg.release(slot)
            except Exception:
                pass


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


def require_variables(xs: Sequence[Any], what: str, role: str) -> None:
    """Each of ``xs`` is a :class:`Variable`, else a :class:`GraphError` naming ``role``
    (an array given where ``backward`` takes a variable was an AttributeError)."""
    for i, x in enumerate(xs):
        if not isinstance(x, Variable):
            at = f" {i}" if len(xs) > 1 else ""
            got = describe(x)
            if hasattr(x, "shape") and hasattr(x, "dtype"):
                got = f"an array {got}"
            raise GraphError(
                f"{what}: {role}{at} is {got}, not a Variable; pass the variables of this "
                "DynamicGraph (what dg.variable(...) or dg.exec(...) returned)"
            )
