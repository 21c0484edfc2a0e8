"""The ways to make a :class:`~fnnc.data.DataFrame` (NNC's dataframe constructors):
from arrays, a Python sequence, a function of the row index, an NNC tensor file (a
tensor a row, or rows along tensors' first axis) and a CSV file. Each reads nothing
yet: it makes the frame's source columns (:mod:`fnnc.data.sources`,
:mod:`fnnc.data.files`), which are read when an iterator asks for rows."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

from fnnc.data import files
from fnnc.data.errors import DataError
from fnnc.data.sources import Column, FieldColumn, FunctionColumn, SequenceColumn, SharedRows
from fnnc.data.stages import names as column_names


class Constructors:
    """:class:`~fnnc.data.DataFrame`'s ``from_*`` class methods (a mixin: the frame is
    ``cls``, made from ``{name: column}``)."""

    __slots__ = ()

    @classmethod
    def from_arrays(cls, **arrays: Any) -> Self:
        """Columns from arrays, rows along their first axis, nothing copied: NumPy arrays,
        ``np.memmap`` (streamed from disk; ``np.load(path, mmap_mode="r")``), lists, or
        anything with ``len`` and ``[i]``. JAX arrays are copied to host once."""
        if not arrays:
            raise DataError("from_arrays: give at least one column, e.g. from_arrays(x=array)")
        return cls(arrays)

    @classmethod
    def from_sequence(cls, sequence: Sequence[Any], names: str | Sequence[str] = "row") -> Self:
        """Rows from a Python sequence. ``names`` a string: one column holding each
        element. A list of names: each element is a dict (read by those keys) or a
        tuple (read by position), split into those columns."""
        if not (hasattr(sequence, "__len__") and hasattr(sequence, "__getitem__")):
            raise DataError(
                f"from_sequence: expected a sequence of rows (a list, a tuple, anything with "
                f"len() and [i]), got {type(sequence).__name__}; wrap an iterator in list()"
            )
        return cls._split(SequenceColumn(sequence), names)

    @classmethod
    def from_function(
        cls, fn: Callable[[int], Any], rows: int, names: str | Sequence[str] = "row"
    ) -> Self:
        """Row ``i`` is ``fn(i)`` for ``i < rows`` (NNC's column ``data_enum``), called
        when the row is read. ``names`` splits results as in :meth:`from_sequence`;
        ``fn`` runs once per row however many columns are read."""
        return cls._split(FunctionColumn(fn, rows), names)

    @classmethod
    def _split(cls, base: Column, columns: str | Sequence[str]) -> Self:
        if isinstance(columns, str):
            return cls({columns: base})
        shared = SharedRows(base)
        wanted = column_names(columns, "names")
        return cls({name: FieldColumn(shared, name, i) for i, name in enumerate(wanted)})

    @classmethod
    def from_tensor_file(
        cls,
        path: str | os.PathLike[str],
        names: str | Sequence[str] | None = None,
        *,
        column: str = "tensor",
        columns: Mapping[str, str | Sequence[str]] | None = None,
    ) -> Self:
        """Rows that are tensors of an NNC tensor file, one tensor a row, read lazily.

        Args:
            path: the file, opened read-only.
            names: which tensors, in row order: a list of names; a pattern with ``{}``
                for a row number (``"x-{}"`` -> ``x-0, x-1, ...`` in numeric order);
                ``None`` for every tensor, sorted by name.
            column: the column's name.
            columns: instead of ``names``/``column``, several columns
                ``{column: names or pattern}``, aligned row by row.
        """
        path = os.fspath(path)
        specs = dict(columns) if columns is not None else {column: names}
        if columns is not None and names is not None:
            raise DataError("from_tensor_file: give names= (one column) or columns=, not both")
        return cls(
            {c: files.TensorRowsColumn(path, files.tensor_names(path, s)) for c, s in specs.items()}
        )

    @classmethod
    def from_tensor_slices(cls, path: str | os.PathLike[str], **tensors: str) -> Self:
        """Rows along the first axis of tensors in an NNC tensor file,
        ``from_tensor_slices(path, x="images", y="labels")``: each row is read from the
        stored bytes when needed, so a tensor larger than memory streams."""
        if not tensors:
            raise DataError("from_tensor_slices: name the tensors, e.g. x='images'")
        return cls({c: files.TensorSliceColumn(path, name) for c, name in tensors.items()})

    @classmethod
    def from_csv(
        cls,
        path: str | os.PathLike[str],
        *,
        delimiter: str = ",",
        quote: str = '"',
        header: bool = True,
        encoding: str = "utf-8",
    ) -> Self:
        """The rows of a CSV file as string columns (``None`` for a missing field), named
        by the first line when ``header`` else ``"0"``, ``"1"``, ... (NNC's CSV reader:
        RFC 4180 with a chosen delimiter and quote). The bytes are text in ``encoding``
        (``"latin-1"`` reads any bytes; ``"utf-8-sig"`` drops a byte-order mark). Convert
        with :meth:`map`."""
        options = dict(delimiter=delimiter, quote=quote, header=header, encoding=encoding)
        return cls(files.read_csv(path, **options))
