"""Columns: where a dataframe's rows come from (NNC's ``ccv_cnnp_column_data_t``).

A column reads one row by index (NNC's ``data_enum``) and, where it can, many rows at
once into one stacked array (``gather``), which is what makes batching NumPy arrays
cheap: one fancy-indexing copy per batch instead of one Python call per row.

Nothing is copied when a column is made. NumPy arrays and ``np.memmap`` arrays are
kept as they are and read a row (or a batch of rows) per access, so a memory-mapped
data set larger than memory streams from the page cache. A row read alone is a
read-only view of the array (as an array row of a list is): a map that changed its
input in place would change the data set itself, so later epochs, and worker
processes with their own copies, would see other values. When an iterator runs worker
processes, columns travel to them by pickling: a memory-mapped array travels as its
file name, offset and layout (each worker maps the same file), never as its data; an
in-memory array is copied into each worker, so memory-map large ones
(``np.load(path, mmap_mode="r")``).
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fnnc.data.errors import DataError, integer


def read_only(value: Any) -> np.ndarray:
    """``value`` as an ``np.ndarray``: a read-only view when it is (a view of) the
    column's data, so that a map writing into its input fails instead of changing the
    data set (the data itself is left writable); a fresh array (a NumPy scalar's) as is."""
    out = np.asarray(value)
    if out is not value and out.base is None:
        return out
    out = out.view(np.ndarray)
    out.flags.writeable = False
    return out


class Column:
    """One column's rows: ``len(column)`` rows, ``read(i)`` for row ``i``.

    Subclasses override :meth:`gather` when they can read several rows at once.
    """

    def __len__(self) -> int:
        raise NotImplementedError

    def read(self, row: int) -> Any:
        """Row ``row``'s value."""
        raise NotImplementedError

    def gather(self, rows: np.ndarray) -> np.ndarray | None:
        """Rows ``rows`` stacked along a new first axis, or ``None`` to read them one by one."""
        del rows
        return None

    @property
    def can_gather(self) -> bool:
        """Whether a batch's rows are read at once with :meth:`gather`, not read and
        stacked one by one."""
        return type(self).gather is not Column.gather

    def describe(self) -> str:
        """A few words for error messages and ``repr``."""
        return type(self).__name__

    @property
    def in_memory(self) -> bool:
        """Whether reading never waits on a file (iterators read these without threads)."""
        return False


class ArrayColumn(Column):
    """Rows along the first axis of a NumPy array (``np.memmap`` included), never copied:
    a row is a read-only view, a gathered batch a copy.

    >>> import numpy as np
    >>> c = ArrayColumn(np.arange(6).reshape(3, 2))
    >>> len(c), c.read(1), c.gather(np.array([2, 0])).tolist()
    (3, array([2, 3]), [[4, 5], [0, 1]])
    """

    def __init__(self, array: np.ndarray):
        if array.ndim == 0:
            raise DataError(
                f"a 0-d array ({array!r}) has no rows; give an array of shape [rows, ...]"
            )
        self.array = array

    def __len__(self) -> int:
        return self.array.shape[0]

    def read(self, row: int) -> Any:
        out = self.array[row]
        if type(out) is np.ndarray and self.array.ndim > 1:
            out.flags.writeable = False  # a new view of one row: locking it locks no one's
            return out
        return read_only(out)  # a view; drops the memmap subclass

    def gather(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.array[rows])

    @property
    def can_gather(self) -> bool:
        """An object array's rows are Python objects (arrays of a ragged data set): a
        batch stacks them one by one as a list's, not into an array of objects."""
        return not self.array.dtype.hasobject

    @property
    def in_memory(self) -> bool:
        return _memmap_root(self.array) is None

    def describe(self) -> str:
        a = self.array
        kind = "memmap" if isinstance(a, np.memmap) else "array"
        return f"{kind} {a.dtype}{list(a.shape)}"

    def __reduce__(self) -> tuple[Any, ...]:
        spec = _memmap_spec(self.array)
        if spec is None:
            return ArrayColumn, (self.array,)
        return _reopen_memmap_column, spec


class SequenceColumn(Column):
    """Rows of any random-access sequence (a list, a tuple, an HDF5 dataset...), read with
    ``sequence[i]`` (an array element as a read-only view).

    >>> SequenceColumn(["a", "b"]).read(1)
    'b'
    """

    def __init__(self, sequence: Sequence[Any]):
        self.sequence = sequence

    def __len__(self) -> int:
        return len(self.sequence)

    def read(self, row: int) -> Any:
        value = self.sequence[row]
        return read_only(value) if isinstance(value, np.ndarray) else value

    @property
    def in_memory(self) -> bool:
        return isinstance(self.sequence, (list, tuple, range))

    def describe(self) -> str:
        return f"{type(self.sequence).__name__} of {len(self.sequence)}"


class FunctionColumn(Column):
    """Rows computed by ``fn(i)`` for ``i`` in ``range(rows)`` (NNC's ``data_enum``).

    >>> FunctionColumn(lambda i: i * i, 4).read(3)
    9
    """

    def __init__(self, fn: Callable[[int], Any], rows: int):
        if not callable(fn):
            raise DataError(f"expected a function of the row index, got {type(fn).__name__}")
        self.fn, self.rows = fn, integer(rows, "from_function", 0, "rows")

    def __len__(self) -> int:
        return self.rows

    def read(self, row: int) -> Any:
        return self.fn(row)

    def describe(self) -> str:
        return f"function {getattr(self.fn, '__qualname__', repr(self.fn))} of {self.rows} rows"


class _LastRow(threading.local):
    row: int | None = None
    value: Any = None


class SharedRows:
    """Rows of ``base``, each read once while the fields of one element are taken (per
    thread), however many of its fields are: the reader calls :meth:`forget` when the
    element's fields are read, so the next read of the row (the next epoch, a row repeated
    by ``wrap``) calls ``base`` again and gets fresh values, not ones a map changed."""

    def __init__(self, base: Column):
        self.base, self._last = base, _LastRow()

    def read(self, row: int) -> Any:
        last = self._last
        if last.row != row:
            last.value, last.row = self.base.read(row), row
        return last.value

    def forget(self) -> None:
        """Drops this thread's row (its next :meth:`read` calls ``base`` again)."""
        self._last.row, self._last.value = None, None

    def __getstate__(self) -> dict[str, Any]:
        return {"base": self.base}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.base, self._last = state["base"], _LastRow()


class FieldColumn(Column):
    """One field of each row of a shared base: ``row[name]`` when the row is a mapping,
    else ``row[position]`` (a tuple or list).

    >>> rows = SharedRows(SequenceColumn([{"a": 1, "b": 2}, (3, 4)]))
    >>> FieldColumn(rows, "b", 1).read(0), FieldColumn(rows, "b", 1).read(1)
    (2, 4)
    """

    def __init__(self, rows: SharedRows, name: str, position: int):
        self.rows, self.name, self.position = rows, name, position

    def __len__(self) -> int:
        return len(self.rows.base)

    def read(self, row: int) -> Any:
        value = self.rows.read(row)
        value = value[self.name] if isinstance(value, Mapping) else value[self.position]
        held = isinstance(value, np.ndarray) and isinstance(self.rows.base, SequenceColumn)
        return read_only(value) if held else value  # a function's fresh rows stay writable

    @property
    def in_memory(self) -> bool:
        return self.rows.base.in_memory

    def describe(self) -> str:
        return f"field {self.name!r} of {self.rows.base.describe()}"


def as_column(value: Any, name: str | None = None) -> Column:
    """The column for ``value``: a :class:`Column` as is; NumPy arrays (``np.memmap``
    included) as :class:`ArrayColumn` without copying; JAX arrays copied to host once;
    other sequences (lists, tuples, array-likes with ``len`` and ``[i]``) as
    :class:`SequenceColumn`. Anything else raises :class:`DataError` (naming the
    column ``name`` when given).
    """
    try:
        return _as_column(value)
    except DataError as e:
        if name is None:
            raise
        raise DataError(f"column {name!r}: {e}") from None


def _as_column(value: Any) -> Column:
    if isinstance(value, Column):
        return value
    if isinstance(value, np.ndarray):
        return ArrayColumn(value)
    if type(value).__module__.startswith(("jax", "jaxlib")):
        return ArrayColumn(np.asarray(value))
    if isinstance(value, (str, bytes)):
        raise DataError("a string is not a column; wrap it in a list to make one row of it")
    if hasattr(value, "__len__") and hasattr(value, "__getitem__"):
        return SequenceColumn(value)
    raise DataError(
        f"cannot make a column of {type(value).__name__}: give a NumPy array, np.memmap, "
        "list, or anything with len() and [i]"
    )


# -- memory maps travel by name --------------------------------------------------------
def _memmap_root(array: np.ndarray) -> np.memmap | None:
    """The memmap that owns ``array``'s memory (``array`` itself or a view's base)."""
    node: Any = array
    while isinstance(node, np.ndarray):
        if isinstance(node, np.memmap) and isinstance(node.base, mmap.mmap):
            return node
        node = node.base
    return None


def _memmap_spec(array: np.ndarray) -> tuple[Any, ...] | None:
    root = _memmap_root(array)
    if root is None or root.filename is None:
        return None
    order = "C" if root.flags.c_contiguous else "F"
    delta = array.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    where = (root.filename, root.dtype, int(root.offset), root.shape, order)
    return (*where, array.shape, array.dtype, array.strides, delta)


def _reopen_memmap_column(
    filename: str,
    root_dtype: np.dtype,
    offset: int,
    root_shape: tuple[int, ...],
    order: str,
    shape: tuple[int, ...],
    dtype: np.dtype,
    strides: tuple[int, ...],
    delta: int,
) -> ArrayColumn:
    root = np.memmap(filename, root_dtype, "r", offset, root_shape, order)  # type: ignore[call-overload]
    view = np.ndarray(shape, dtype, buffer=root, offset=delta, strides=strides)
    return ArrayColumn(view)
