"""The steps a dataframe description is made of, and what each does to columns and rows.

A :class:`~fnnc.data.DataFrame` is its source columns plus a tuple of these immutable
records, in the order they were asked for. Each record knows the columns and row count
it leaves behind, so a mistake (an unknown column, a batch larger than the data, a
shard left without rows) is reported when the step is added, not when the first batch
is read.

- :class:`Map`: derive columns from columns, row by row (NNC's
  ``ccv_cnnp_dataframe_map``).
- :class:`Shuffle`: reorder rows (NNC's ``ccv_cnnp_dataframe_shuffle``).
- :class:`Shard`: keep every ``count``-th row starting at ``index``.
- :class:`Group`: turn ``size`` consecutive rows into one (NNC's
  ``ccv_cnnp_dataframe_sample_new``; stacking them is NNC's ``combine``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

from fnnc.data.errors import DataError, integer, unknown_columns


def names(value: str | Sequence[str], what: str) -> tuple[str, ...]:
    """``value`` as a tuple of column names (one name may be given as a string)."""
    try:
        out = (value,) if isinstance(value, str) else tuple(value)
    except TypeError:  # None, a number: not iterable
        out = ()
    if not out or not all(isinstance(n, str) and n for n in out):
        raise DataError(f"{what}: expected column names (non-empty strings), got {value!r}")
    if len(set(out)) != len(out):
        raise DataError(f"{what}: a column is named twice in {list(out)}")
    return out


def check_known(what: str, wanted: Sequence[str], columns: Sequence[str]) -> None:
    """Raises :class:`DataError` listing ``columns`` if any of ``wanted`` is not one."""
    if any(n not in columns for n in wanted):
        raise unknown_columns(what, wanted, columns)


def function_name(fn: Any) -> str:
    """A short name for ``fn`` in messages (``Aug.__call__``, ``<lambda>``; a
    ``functools.partial`` by the function it wraps)."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name is None and isinstance(fn, functools.partial):
        return function_name(fn.func)
    if name is None:
        return type(fn).__name__
    return name.rsplit("<locals>.", 1)[-1]


@dataclasses.dataclass(frozen=True)
class Map:
    """``outputs = fn(*inputs)`` for every row; with ``random``, ``fn`` also gets
    ``rng=``, a NumPy generator seeded from (seed, epoch, row)."""

    fn: Callable[..., Any]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    random: bool = False
    seed: int | None = None

    def columns(self, before: tuple[str, ...]) -> tuple[str, ...]:
        check_known(f"map {function_name(self.fn)}", self.inputs, before)
        return before + tuple(o for o in self.outputs if o not in before)

    def rows(self, before: int) -> int:
        return before

    def describe(self) -> str:
        return f"map({','.join(self.inputs)}->{','.join(self.outputs)})"


@dataclasses.dataclass(frozen=True)
class Shuffle:
    """A permutation of the rows, new every epoch; ``seed=None`` takes the iterator's."""

    seed: int | None = None

    def columns(self, before: tuple[str, ...]) -> tuple[str, ...]:
        return before

    def rows(self, before: int) -> int:
        return before

    def describe(self) -> str:
        return f"shuffle({self.seed})"


@dataclasses.dataclass(frozen=True)
class Shard:
    """Rows ``index, index + count, ...``; with ``drop_remainder`` the last
    ``rows % count`` rows are left out first, so every shard has the same length."""

    index: int
    count: int
    drop_remainder: bool

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise DataError(
                f"shard: index must be in [0, count), got index={self.index}, count={self.count}"
            )

    def columns(self, before: tuple[str, ...]) -> tuple[str, ...]:
        return before

    def usable(self, before: int) -> int:
        """How many rows are dealt out among the shards."""
        return before - before % self.count if self.drop_remainder else before

    def rows(self, before: int) -> int:
        after = len(range(self.index, self.usable(before), self.count))
        if before and not after:
            dropped = f" (drop_remainder leaves out the last {before % self.count})"
            raise DataError(
                f"{self.describe()}: the dataframe has {before} row{'s' if before != 1 else ''}, "
                f"none for shard {self.index} of {self.count}"
                f"{dropped if self.drop_remainder else ''}; "
                f"every shard needs rows: give at least {self.count} rows or shard fewer ways"
            )
        return after

    def describe(self) -> str:
        return f"shard({self.index}/{self.count}{',drop' if self.drop_remainder else ''})"


@dataclasses.dataclass(frozen=True)
class Group:
    """``size`` consecutive rows become one (the last group may be shorter unless
    ``drop_remainder``, or is filled up with its own rows again by ``wrap``).

    Without ``fn`` the group keeps the ``inputs`` columns: each value is the rows'
    values stacked into one array (``stack``, NNC's combine) or their list. With ``fn``
    it has the one column ``output = fn(*lists)``, a list of each input's values (NNC's
    sample function, which reduces n rows to one).
    """

    size: int
    drop_remainder: bool
    inputs: tuple[str, ...]
    stack: bool = True
    fn: Callable[..., Any] | None = None
    output: str | None = None
    wrap: bool = False

    def __post_init__(self) -> None:
        size = integer(self.size, "batch/sample", 1, "size")
        object.__setattr__(self, "size", size)  # a NumPy integer becomes a Python int

    def columns(self, before: tuple[str, ...]) -> tuple[str, ...]:
        check_known(self.describe(), self.inputs, before)
        return (self.output,) if self.fn is not None else self.inputs  # type: ignore[return-value]

    def rows(self, before: int) -> int:
        if not self.drop_remainder:
            return math.ceil(before / self.size)
        if 0 < before < self.size:
            kind = "batch" if self.stack else "sample"
            raise DataError(
                f"{self.describe()}: the dataframe has {before} row{'s' if before != 1 else ''}, "
                f"fewer than one {kind} of {self.size}, and drop_remainder leaves out a part "
                f"{kind}, so no {kind} is left; give at "
                f"least {self.size} rows, a {kind} size of at most {before}, or "
                "drop_remainder=False"
            )
        return before // self.size

    def describe(self) -> str:
        kind = "batch" if self.stack else "sample"
        how = ",drop" if self.drop_remainder else ",wrap" if self.wrap else ""
        return f"{kind}({self.size}{how})"


Stage = Map | Shuffle | Shard | Group


def levels(stages: Sequence[Stage]) -> tuple[list[list[Any]], list[Group]]:
    """``stages`` cut at each :class:`Group`: the steps of level 0 (rows), the group
    that ends it, the steps of level 1 (groups of rows), ... Each step comes with its
    position in ``stages`` (it seeds default-seeded shuffles and random maps)."""
    out: list[list[Any]] = [[]]
    groups: list[Group] = []
    for position, stage in enumerate(stages):
        if isinstance(stage, Group):
            groups.append(stage)
            out.append([])
        else:
            out[-1].append((position, stage))
    return out, groups
