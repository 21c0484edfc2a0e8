"""Compiling a dataframe description into one epoch of a Grain ``MapDataset``.

The Grain pipeline orders *row indices*, and a reader turns each final element's
indices into values:

    RowIndices(rows)                      # row indices 0..rows-1, each epoch
      shuffled(seed) / .slice(shard)      # level-0 steps that move rows
      GroupMapDataset(size)               # a batch: an array of row indices
      shuffled(...) / .slice(...)         # level-1 steps move whole batches
      .map_with_index(Reader)             # read rows, run maps, stack, run maps...

Moving indices instead of data keeps every ordering decision (shuffle, shard, batch,
epochs, checkpoints, worker slices) in Grain ``MapDataset`` nodes (the index nodes of
:mod:`fnnc.data.indices`, Grain's ``slice``), and lets a batch of NumPy rows be read
with one fancy-indexing copy (``Column.gather``) instead of one Python call per row.
Row maps commute with moving rows, so running them in the reader is the same as
running them where they were declared.

Only what the selected columns need is computed: maps whose outputs nobody reads are
skipped, and source columns nobody reads are never opened (NNC derives a column only
when an iterator asks for it, too).

Seeds: a shuffle or random map with its own seed uses ``SeedSequence([seed])``;
without one it uses ``SeedSequence([iterator seed, position in the description])``, so
adding an iterator seed never makes two steps share a stream. Epoch ``e`` of a shuffle
draws from ``SeedSequence([that, e])``; a random map's generator for a row from
``[that, e, row]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from fnnc.data.errors import DataError, flat_rows, rows_text
from fnnc.data.indices import GroupMapDataset, RowIndices, shuffled
from fnnc.data.sources import Column, FieldColumn
from fnnc.data.stages import Map, Shard, Shuffle, Stage, function_name, levels


def _hint(error: Exception) -> str:
    """What to do about a function writing into a row it was given (a read-only view)."""
    if "read-only" not in str(error):
        return ""
    return (
        " (rows of an array or list column arrive as read-only views, so that a function "
        "cannot change the data set; write into a copy: v = v.copy(), or return a new array)"
    )


def derive_seed(seed: int | None, pipeline_seed: int, position: int) -> int:
    """The 32-bit seed of the step at ``position`` (see the module docstring)."""
    entropy = [seed] if seed is not None else [pipeline_seed, position]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint32)[0])


def _live(steps: list[Any], want: set[str]) -> tuple[list[Any], set[str]]:
    """The maps in ``steps`` that ``want`` needs, and the columns needed before them."""
    need, live = set(want), []
    for position, step in reversed(steps):
        if isinstance(step, Map) and need & set(step.outputs):
            live.append((position, step))
            need = (need - set(step.outputs)) | set(step.inputs)
    return live[::-1], need


def _shape(name: str, value: Any, member: Any) -> tuple[int, ...]:
    """``np.shape(value)``; a :class:`DataError` naming the column and row for a value
    that is no array (a tuple or list of unequal parts: NumPy's inhomogeneous shape)."""
    try:
        return np.shape(value)
    except ValueError as e:
        raise DataError(
            f"batch: column {name!r} holds a {type(value).__name__} on {rows_text(member)} "
            f"that makes no array ({e}); batch stacks each column into one array: split "
            "its parts into columns (map(fn, inputs, [name, ...]) with fn returning a "
            "tuple, or from_sequence(..., names=[...])), or group rows unstacked with sample()"
        ) from e


def stack(name: str, values: list[Any], members: Sequence[Any]) -> np.ndarray:
    """``values`` stacked along a new first axis; :class:`DataError` naming the column and
    the rows when their shapes differ or a value makes no array."""
    first = _shape(name, values[0], members[0])
    for member, value in zip(members, values):
        if _shape(name, value, member) != first:
            raise DataError(
                f"batch: column {name!r} changes shape within an epoch: {rows_text(member)} "
                f"has shape {np.shape(value)}, {rows_text(members[0])} (first of its batch) "
                f"has {first}. Make rows one shape with map before batch, or group them "
                "unstacked with sample()"
            )
    return np.stack(values)


class Reader:
    """Grain's ``map_with_index`` transform: a final element's row indices -> its values."""

    def __init__(
        self,
        source: dict[str, Column],
        stages: Sequence[Stage],
        output: tuple[str, ...],
        kind: str,
        pipeline_seed: int,
        length: int,
    ):
        self.source, self.output, self.kind, self.length = source, output, kind, length
        steps, self.groups = levels(stages)
        top = len(self.groups)
        self.maps: list[list[Any]] = [[] for _ in steps]
        self.members: list[set[str]] = [set() for _ in steps]  # per level: from members
        self.combined = [False for _ in steps]  # per level: whether its group is read
        self.gathered: list[str] = []
        want = set(output)
        for k in range(top, 0, -1):
            self.maps[k], need = _live(steps[k], want)
            group = self.groups[k - 1]
            if group.fn is not None:
                want = set(group.inputs) if group.output in need else set()
            else:
                want = need & set(group.inputs)
            self.combined[k] = bool(want)
            if k == 1:  # batch and sample read source columns a group at a time
                raw = set(want) - {o for _, m in _live(steps[0], want)[0] for o in m.outputs}
                self.gathered = sorted(c for c in raw if source[c].can_gather)
                want -= set(self.gathered)
            self.members[k] = want
        self.maps[0], self.read0 = _live(steps[0], want)
        shared = (source[c].rows for c in self.read0 if isinstance(source[c], FieldColumn))
        self.shared = list({id(rows): rows for rows in shared}.values())
        self.seeds = {
            position: derive_seed(step.seed, pipeline_seed, position)
            for level in self.maps
            for position, step in level
            if step.random
        }

    def __call__(self, index: int, ids: Any) -> Any:
        epoch = index // self.length
        values = self._level(len(self.groups), ids, epoch)
        if self.kind == "dict":
            return {c: values[c] for c in self.output}
        if self.kind == "tuple":
            return tuple(values[c] for c in self.output)
        if self.kind == "boxed":  # Grain's iterators drop None elements (its filter)
            return (values[self.output[0]],)
        return values[self.output[0]]

    def _level(self, k: int, ids: Any, epoch: int) -> dict[str, Any]:
        if k == 0:
            row = int(ids)
            try:
                values = {c: self._read(c, row) for c in self.read0}
            finally:  # fields of one element share a read; the next element reads anew
                for rows in self.shared:
                    rows.forget()
            return self._maps(0, values, ids, epoch)
        members, values = ids, {}
        if k == 1:
            values = {c: self._read(c, members) for c in self.gathered}
            for c in [c for c, v in values.items() if v is None]:  # gather: one by one
                rows = [self._read(c, int(r)) for r in members]
                values[c] = stack(c, rows, members) if self.groups[0].stack else rows
            if not self.groups[0].stack:  # a sample's columns are lists of rows
                values = {c: list(v) for c, v in values.items()}
        if self.combined[k]:
            rows = [self._level(k - 1, m, epoch) for m in members] if self.members[k] else []
            values = self._combine(k, rows, members, values)
        return self._maps(k, values, ids, epoch)

    def _read(self, column: str, ids: Any) -> Any:
        """Row ``ids`` (an index) or rows (an array, gathered) of a source column."""
        source = self.source[column]
        try:
            return source.gather(ids) if isinstance(ids, np.ndarray) else source.read(ids)
        except DataError:
            raise
        except Exception as e:
            raise DataError(
                f"reading column {column!r} ({source.describe()}) failed on {rows_text(ids)}: "
                f"{type(e).__name__}: {e}"
            ) from e

    def _combine(
        self, k: int, rows: list[dict[str, Any]], members: Any, gathered: dict[str, Any]
    ) -> dict[str, Any]:
        """The group's columns from its member rows, plus ``gathered`` (the columns
        already read for the whole group through ``Column.gather``)."""
        group, wanted = self.groups[k - 1], self.members[k]
        if group.fn is None:
            if group.stack:
                return {**gathered, **{c: stack(c, [r[c] for r in rows], members) for c in wanted}}
            return {**gathered, **{c: [r[c] for r in rows] for c in wanted}}
        lists = [gathered[c] if c in gathered else [r[c] for r in rows] for c in group.inputs]
        try:
            out = group.fn(*lists)
        except DataError:
            raise
        except Exception as e:
            raise DataError(
                f"sample {function_name(group.fn)} -> column {group.output!r} failed on "
                f"{rows_text(members)}: {type(e).__name__}: {e}{_hint(e)}"
            ) from e
        return {group.output: out}  # type: ignore[dict-item]

    def _maps(self, k: int, values: dict[str, Any], ids: Any, epoch: int) -> dict[str, Any]:
        for position, step in self.maps[k]:
            args = [values[c] for c in step.inputs]
            try:
                if step.random:
                    key = [self.seeds[position], epoch, flat_rows(ids)[0]]
                    out = step.fn(*args, rng=np.random.default_rng(key))
                else:
                    out = step.fn(*args)
            except DataError:
                raise
            except Exception as e:
                raise DataError(
                    f"map {function_name(step.fn)} -> column "
                    f"{', '.join(repr(o) for o in step.outputs)} failed on "
                    f"{rows_text(ids)} (epoch {epoch}): "
                    f"{type(e).__name__}: {e}{_hint(e)}"
                ) from e
            if len(step.outputs) == 1:
                values[step.outputs[0]] = out
                continue
            if not isinstance(out, (tuple, list)) or len(out) != len(step.outputs):
                got = f"{len(out)} values" if isinstance(out, (tuple, list)) else type(out).__name__
                raise DataError(
                    f"map {function_name(step.fn)} must return {len(step.outputs)} values "
                    f"for columns {list(step.outputs)}, returned {got} on {rows_text(ids)}"
                )
            values.update(zip(step.outputs, out))
        return values


def build(
    source: dict[str, Column],
    rows: int,
    stages: Sequence[Stage],
    output: tuple[str, ...],
    kind: str,
    pipeline_seed: int,
) -> grain.MapDataset:
    """One epoch of the dataframe as a Grain ``MapDataset`` of output elements.

    Indexing it past its length reads later epochs (Grain's epoch-aware indexing), which
    is how :class:`~fnnc.data.DataIterator` continues from one epoch into the next.
    """
    ds: grain.MapDataset = RowIndices(rows)
    steps, groups = levels(stages)
    for k, level in enumerate(steps):
        for position, step in level:
            if isinstance(step, Shuffle):
                ds = shuffled(ds, derive_seed(step.seed, pipeline_seed, position))
            elif isinstance(step, Shard):
                if step.drop_remainder:
                    ds = ds.slice(slice(0, step.usable(len(ds))))
                ds = ds.slice(slice(step.index, None, step.count))
        if k < len(groups):
            group = groups[k]
            ds = GroupMapDataset(
                ds, group.size, drop_remainder=group.drop_remainder, rows=k == 0, wrap=group.wrap
            )
    reader = Reader(source, stages, output, kind, pipeline_seed, max(len(ds), 1))
    return ds.map_with_index(reader)
