"""NNC's tensor printer (``ccv_nnc_tensor_format_new``): an array as NNC's debug string.

The layout is NNC's, character for character (``lib/nnc/ccv_nnc_tensor.c``):

- every element is printed with C's ``printf`` format for its NNC datatype: ``%10.5g``
  for 32F, 64F and 16F, ``%10d`` for 32S, ``%12lld`` for 64S, ``%3d`` for 8U;
- a vector is 8 elements to a line; past 64 elements only its first 3 lines and its
  last 3 lines (counted from the end, aligned to 8) are printed, with ``...,`` between;
- a matrix row past 8 columns shows its first 3 and last 3 columns with ``...,``
  between; past 8 rows only the first 3 and last 3 rows are printed (NNC truncates
  those last 3 rows from 8 columns on, not 9: its own quirk, kept);
- an axis above the last two past 4 entries shows its first 2 and last 2 entries;
- each nesting level indents by one more space; the whole string is wrapped in
  ``[\\n`` ... ``\\n]``.

Where fnnc goes beyond NNC, it says so: bfloat16 prints as ``%10.5g`` of its value
(NNC's printer has no case for 16BF and prints nothing for it); a 0-d array prints as
the vector ``[x]`` (NNC stores a scalar as shape ``[1]``); an array with no elements
prints as the vector path does with none, ``"[\\n  \\n]"``; NaN prints ``nan`` whatever
its sign bit (glibc's ``printf`` writes ``-nan`` for a negative one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from fnnc.errors import DTypeError

_FLOAT, _INT32, _INT64, _UINT8 = "%10.5g", "%10d", "%12d", "%3d"
SPECIFIERS: dict[np.dtype, str] = {
    np.dtype(np.float32): _FLOAT,
    np.dtype(np.float64): _FLOAT,
    np.dtype(np.float16): _FLOAT,
    np.dtype(ml_dtypes.bfloat16): _FLOAT,
    np.dtype(np.int32): _INT32,
    np.dtype(np.int64): _INT64,
    np.dtype(np.uint8): _UINT8,
}
"""The ``printf`` format of each dtype, as NNC's ``_strv`` picks it per datatype."""

_VECTOR_LIMIT, _PER_LINE, _EDGE_LINES = 64, 8, 3
_MATRIX_LIMIT, _EDGE_ROWS = 8, 3
_OUTER_LIMIT, _EDGE_ENTRIES = 4, 2

_Value = Callable[[np.ndarray, int], str]


def format_tensor(array: Any) -> str:
    """Formats an array as NNC's ``ccv_nnc_tensor_format_new`` prints it.

    Args:
        array: a NumPy or JAX array (or anything ``np.asarray`` takes) of an NNC
            datatype: float32, float64, float16, bfloat16, int32, int64 or uint8.

    Returns:
        NNC's string, with the same numbers, truncation (``...,``), line breaks and
        indentation; see :mod:`fnnc.io.tensor_string` for the rules.

    Raises:
        DTypeError: the array's dtype is none of NNC's datatypes (e.g. bool, int8,
            complex); cast it first.

    >>> import numpy as np
    >>> from fnnc import io
    >>> print(io.format_tensor(np.arange(4, dtype=np.int32).reshape(2, 2)))
    [
      [         0,          1],
      [         2,          3]
    ]
    >>> print(io.format_tensor(np.array([0.5, -1e-7, 123456.0], np.float32)))
    [
             0.5,     -1e-07, 1.2346e+05
    ]
    """
    a = np.asarray(array)
    spec = SPECIFIERS.get(a.dtype)
    if spec is None:
        names = ", ".join(str(d) for d in SPECIFIERS)
        raise DTypeError(
            f"format_tensor: expected an array of one of NNC's datatypes ({names}), "
            f"got dtype {a.dtype} with shape {a.shape}; cast it first, e.g. "
            f"x.astype(np.float32) or x.astype(np.int32)"
        )
    convert = float if spec == _FLOAT else int

    def value(v: np.ndarray, i: int) -> str:
        return spec % convert(v[i])

    if a.ndim == 0:
        a = a.reshape(1)
    if a.size == 0:
        a = a.reshape(0)
    body = _vector(a, value) if a.ndim == 1 else _nested(a, 0, value)
    return "[\n  " + "".join(body) + "\n]"


def _vector(a: np.ndarray, value: _Value) -> list[str]:
    """NNC's vector path: 8 to a line; past 64, the first 3 and last 3 lines."""
    n = a.shape[0]
    out: list[str] = []

    def run(start: int, stop: int) -> None:
        for i in range(start, stop):
            out.append(value(a, i))
            if i < n - 1:
                out.append(",\n  " if (i + 1) % _PER_LINE == 0 else ", ")

    if n <= _VECTOR_LIMIT:
        run(0, n)
    else:
        run(0, _EDGE_LINES * _PER_LINE)
        out.append("...,\n  ")
        run(((n + _PER_LINE - 1) // _PER_LINE - _EDGE_LINES) * _PER_LINE, n)
    return out


def _row(row: np.ndarray, truncate: bool, value: _Value) -> str:
    """One matrix row without its brackets: all columns, or the first 3 and last 3."""
    n = row.shape[0]
    if not truncate:
        return ", ".join(value(row, j) for j in range(n))
    head = ", ".join(value(row, j) for j in range(_EDGE_ROWS))
    tail = ", ".join(value(row, j) for j in range(n - _EDGE_ROWS, n))
    return head + ",  ..., " + tail


def _nested(a: np.ndarray, spacer: int, value: _Value) -> list[str]:
    """NNC's ``_strt``: a rank >= 2 array at nesting depth ``spacer``; the caller has
    written the opening bracket and indentation of its first line."""
    pad = "  " + " " * spacer
    if a.ndim == 2:
        return _matrix(a, pad, value)
    out: list[str] = []
    n = a.shape[0]
    if n > _OUTER_LIMIT:
        for i in range(_EDGE_ENTRIES):
            out += ["[", *_nested(a[i], spacer + 1, value), "],\n" + pad]
        out.append("...,\n" + pad)
        shown = range(n - _EDGE_ENTRIES, n)
    else:
        shown = range(n)
    for i in shown:
        out += ["[", *_nested(a[i], spacer + 1, value)]
        if i < n - 1:
            out.append("],\n" + pad)
    out.append("]")
    return out


def _matrix(a: np.ndarray, pad: str, value: _Value) -> list[str]:
    """NNC's 2-d case of ``_strt``; the final ``]`` closes the last row (the caller
    closes the matrix)."""
    rows, columns = a.shape
    wide = columns > _MATRIX_LIMIT
    out: list[str] = []
    if rows <= _MATRIX_LIMIT:
        for i in range(rows):
            out += [pad if i else "", "[", _row(a[i], wide, value)]
            if i < rows - 1:
                out.append("],\n")
    else:
        for i in range(_EDGE_ROWS):
            out += [pad if i else "", "[", _row(a[i], wide, value), "],\n"]
        out.append(pad + "...,\n")
        for i in range(rows - _EDGE_ROWS, rows):
            # NNC tests ``dim[1] < 8`` here, not ``<= 8`` as everywhere else.
            out += [pad, "[", _row(a[i], columns >= _MATRIX_LIMIT, value)]
            if i < rows - 1:
                out.append("],\n")
    out.append("]")
    return out
