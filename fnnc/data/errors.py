"""Messages of :class:`~fnnc.errors.DataError`, the error fnnc.data raises for a data
pipeline that cannot produce what was asked (re-exported by :mod:`fnnc.data`)."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import numpy as np

from fnnc.core.params import flag_value
from fnnc.errors import DataError


def unknown_columns(what: str, names: Iterable[str], columns: Iterable[str]) -> DataError:
    """The error for ``names`` that are not among ``columns``, listing the columns."""
    known = list(columns)
    missing = [n for n in names if n not in known]
    shown = ", ".join(repr(c) for c in known) or "none"
    plural = "s" if len(missing) > 1 else ""
    return DataError(
        f"{what}: no column{plural} {', '.join(repr(m) for m in missing)} "
        f"(the dataframe has {len(known)} column{'' if len(known) == 1 else 's'}: {shown})"
    )


def as_int(value: Any) -> int | None:
    """``value`` as a Python int: an ``int`` or a NumPy integer (``operator.index``),
    never a bool; ``None`` for anything else."""
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def integer(value: Any, what: str, low: int, name: str) -> int:
    """:func:`as_int` of ``value``, at least ``low``; else the error naming ``what`` and
    ``name``."""
    number = as_int(value)
    if number is not None and number >= low:
        return number
    need = "a positive integer" if low == 1 else f"an integer >= {low}"
    raise DataError(f"{what}: {name} must be {need}, got {value!r}")


def flag(value: Any, what: str, name: str) -> bool:
    """``value`` as a bool: a Python or NumPy bool, or NNC's int flag 0 / 1; else the
    error naming ``what`` and ``name`` (``bool("no")`` would be True)."""
    meant = flag_value(value)
    if meant is not None:
        return meant
    raise DataError(f"{what}: {name} must be True or False (or NNC's 1 / 0), got {value!r}")


def flat_rows(ids: Any) -> list[int]:
    """The source rows in ``ids``: one row index, or (nested) groups of them."""
    if isinstance(ids, (int, np.integer)):
        return [int(ids)]
    if isinstance(ids, np.ndarray):
        return ids.reshape(-1).tolist()
    return [r for member in ids for r in flat_rows(member)]


def rows_text(ids: Any, limit: int = 8) -> str:
    """``row 5`` for one source row, ``rows [5, 9, 2, ...]`` for a group of them."""
    if isinstance(ids, (int, np.integer)):
        return f"row {int(ids)}"
    flat = flat_rows(ids)
    shown = ", ".join(str(r) for r in flat[:limit]) + (", ..." if len(flat) > limit else "")
    return f"rows [{shown}]"
