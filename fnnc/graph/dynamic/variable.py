"""Variables: handles on the values of a dynamic graph, with NumPy-like operator sugar.

A variable names a *slot*, the storage NNC's tensor variable owns; the slot holds the
current SSA version. Aliases (``x[0]``, ``x.reshape(4, 2)``, :meth:`DynamicGraph.alias`)
are variables on the same slot with a view, so they see every new version of their
root, and an alias of an alias is a view of the root (NNC's rule). Writing through
an alias (``y[0] = z``) makes a new version of the whole slot.

Operators record commands: ``+`` is ``ewsum``, ``-`` ``add[q=-1]``, ``*`` ``ewprod``
(``scalar_mul`` with a Python number), ``/`` ``ewdiv`` (``scalar_mul`` where that
is exact, :func:`.operands.reciprocal`), ``@`` ``gemm`` (NumPy's ``matmul`` shapes,
:func:`.operands.matmul`), ``**`` the
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
from .views import index_view, reshape_view

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
_NEG = ops.scalar_mul(a=-1.0)
_ABS = ops.ewabs()


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

    def __bool__(self) -> bool:
        """NumPy's truth value: that of the one element (``__len__`` made ``[0.0]`` true
        and any ``[2, 2]`` true); several elements or none are ambiguous, a ShapeError."""
        if self.size != 1:
            raise ShapeError(
                f"the truth value of variable {self.label}, {list(self.shape)} "
                f"({self.size} elements), is ambiguous; use x.numpy().any() or .all()"
            )
        return bool(self.item())

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
        return operands.matmul(self, operands.operand(self, other, "@"))

    def __rmatmul__(self, other: Any) -> Variable:
        return operands.matmul(operands.operand(self, other, "@"), self)

    def __pow__(self, other: Any) -> Variable:
        return operands.power(self, other)

    def __rpow__(self, other: Any) -> Variable:
        return operands.rpower(self, other)

    def __neg__(self) -> Variable:
        return self._dg.exec(_NEG, self)

    def __abs__(self) -> Variable:
        """``abs(x)``: the elementwise absolute value (``ewabs``), as ``np.abs``."""
        return self._dg.exec(_ABS, self)

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
