"""DataFrame: NNC's dataframe (``ccv_cnnp_dataframe_t``) as an immutable description.

A dataframe is named columns over a number of rows, plus the steps that derive new
columns and reorder or group rows. Building one reads nothing; every method returns a
new dataframe and leaves the old one as it was, so one base can feed several pipelines
(a training frame with shuffle and augmentation, an evaluation frame without). Rows
are read when an iterator asks for them, through Grain (see :mod:`fnnc.data.plan`).

Where NNC's calls went:

======================================  ===============================================
NNC                                     fnnc.data
======================================  ===============================================
``ccv_cnnp_dataframe_new`` (data_enum)  :meth:`DataFrame.from_function`,
                                        :meth:`DataFrame.from_sequence`
``ccv_cnnp_dataframe_from_array_new``   :meth:`DataFrame.from_arrays`
``ccv_cnnp_dataframe_from_csv_new``     :meth:`DataFrame.from_csv`
``ccv_nnc_tensor_read`` row by row      :meth:`DataFrame.from_tensor_file`,
                                        :meth:`DataFrame.from_tensor_slices`
``ccv_cnnp_dataframe_map``              :meth:`DataFrame.map`
``ccv_cnnp_dataframe_shuffle``          :meth:`DataFrame.shuffle` (seeded, per epoch)
``ccv_cnnp_dataframe_sample_new``       :meth:`DataFrame.sample`
``ccv_cnnp_dataframe_combine_new``      :meth:`DataFrame.batch`
``ccv_cnnp_dataframe_iter_new``         :meth:`DataFrame.iterator`
``ccv_cnnp_dataframe_iter_prefetch``    :meth:`DataIterator.prefetch`; reading ahead in
                                        the background: ``iterator(threads=, workers=)``
``ccv_cnnp_dataframe_one_hot`` ...      :mod:`fnnc.data.addons` (``df.one_hot(...)``)
``ccv_cnnp_dataframe_iter_set_cursor``  :meth:`DataIterator.set_state`
======================================  ===============================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grain

from fnnc.data import plan
from fnnc.data.addons import AddOns
from fnnc.data.constructors import Constructors
from fnnc.data.errors import DataError, as_int, flag, integer
from fnnc.data.iterator import DataIterator
from fnnc.data.sources import (
    Column,
    as_column,
)
from fnnc.data.stages import Group, Map, Shard, Shuffle, Stage, check_known
from fnnc.data.stages import names as column_names


def _seed(seed: Any, what: str) -> int | None:
    if seed is None:
        return None
    return integer(seed, what, 0, "seed (or None)")


class DataFrame(Constructors, AddOns):
    """Named columns over rows, and the steps that derive, reorder and group them.

    Make one with a ``from_*`` constructor (or ``DataFrame(columns)`` from
    :class:`~fnnc.data.sources.Column` objects); read it with :meth:`iterator` or
    ``for row in df``; ``df[i]`` is row ``i`` of epoch 0 with seed 0.

    >>> import numpy as np
    >>> from fnnc.data import DataFrame
    >>> df = DataFrame.from_arrays(x=np.arange(10.0), y=np.arange(10) % 2)
    >>> df = df.map(lambda x: x * x, "x", "x2").shuffle().batch(4)
    >>> df
    DataFrame(3 rows; columns x, y, x2; map(x->x2) shuffle(None) batch(4))
    >>> batch = df[0]
    >>> batch["x2"].shape, bool((batch["x2"] == batch["x"] ** 2).all())
    ((4,), True)
    """

    __slots__ = ("_columns", "_read", "_rows", "_source", "_source_rows", "_stages")

    def __init__(self, columns: Mapping[str, Column | Any]):
        if not isinstance(columns, Mapping):
            raise DataError(
                f"DataFrame(columns): expected a mapping {{name: column}}, got "
                f"{type(columns).__name__}; e.g. DataFrame({{'x': array}}) or "
                "DataFrame.from_arrays(x=array)"
            )
        source = {name: as_column(value, name) for name, value in columns.items()}
        column_names(tuple(source), "DataFrame")
        lengths = {name: len(column) for name, column in source.items()}
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{n}: {k}" for n, k in lengths.items())
            raise DataError(f"DataFrame: columns have different numbers of rows ({detail})")
        self._source: dict[str, Column] = source
        self._stages: tuple[Stage, ...] = ()
        self._columns: tuple[str, ...] = tuple(source)
        self._rows: int = next(iter(lengths.values()))
        self._source_rows = self._rows
        self._read: dict[str, int] = {}

    # -- looking at one ----------------------------------------------------------------
    @property
    def columns(self) -> tuple[str, ...]:
        """The column names, in order (a map's new columns come last)."""
        return self._columns

    def __len__(self) -> int:
        """Rows per epoch (after shard, batch and sample)."""
        return self._rows

    def __repr__(self) -> str:
        steps = "".join(f" {s.describe()}" for s in self._stages)
        if self._read:
            steps += f" read_with({', '.join(f'{k}={v}' for k, v in self._read.items())})"
        columns = ", ".join(self._columns)
        return f"DataFrame({self._rows} rows; columns {columns}{';' if steps else ''}{steps})"

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Row ``index`` of epoch 0 with seed 0, as a dict (for looking, not for training)."""
        row = as_int(index)
        if isinstance(index, str):
            raise DataError(
                f"df[{index!r}]: a dataframe is indexed by row number; read a column with "
                f"df[i][{index!r}] or df.iterator({index!r}) (columns: {', '.join(self._columns)})"
            )
        if row is None or not -self._rows <= row < self._rows:
            raise IndexError(f"row {index!r} of a dataframe with {self._rows} rows")
        return self.to_grain()[row % self._rows]

    def _then(self, stage: Stage) -> DataFrame:
        out = object.__new__(DataFrame)
        out._source, out._source_rows, out._read = self._source, self._source_rows, self._read
        out._stages = (*self._stages, stage)
        out._columns = stage.columns(self._columns)
        out._rows = stage.rows(self._rows)
        return out

    # -- deriving ----------------------------------------------------------------------
    def map(
        self,
        fn: Callable[..., Any],
        inputs: str | Sequence[str],
        output: str | Sequence[str],
        *,
        random: bool = False,
        seed: int | None = None,
    ) -> DataFrame:
        """A new column ``output = fn(*inputs)``, computed row by row when read (NNC's
        ``ccv_cnnp_dataframe_map``). An existing name is replaced; several outputs take a
        tuple from ``fn``. With ``random=True`` ``fn`` also gets ``rng=``, a
        ``np.random.Generator`` seeded from (``seed`` or the iterator's seed, epoch,
        row), so augmentation differs each epoch and replays exactly. After
        :meth:`batch` the inputs are whole batches. A raising ``fn`` becomes a
        :class:`DataError` naming the column and the row."""
        if not callable(fn):
            raise DataError(f"map: fn must be callable, got {type(fn).__name__}")
        random = flag(random, "map", "random")
        if seed is not None and not random:
            raise DataError(
                f"map: seed={seed!r} seeds the rng= a random map's fn gets; give random=True "
                "too (fn(..., rng=...)), or no seed"
            )
        stage = Map(
            fn,
            column_names(inputs, "map inputs"),
            column_names(output, "map output"),
            random,
            _seed(seed, "map"),
        )
        return self._then(stage)

    def shuffle(self, seed: int | None = None) -> DataFrame:
        """Rows in a random order, a different one each epoch, the same for the same
        (seed, epoch). ``seed=None`` derives it from the iterator's ``seed`` and this
        step's position in the description (as Grain's ``ds.seed``), so adding a step
        before it changes its order; give a seed to pin it."""
        return self._then(Shuffle(_seed(seed, "shuffle")))

    def shard(
        self, index: int | None = None, count: int | None = None, *, drop_remainder: bool = True
    ) -> DataFrame:
        """This process's share of the rows: every ``count``-th from ``index``.

        Without arguments: ``jax.process_index()`` of ``jax.process_count()`` (Grain's
        ``ShardByJaxProcess``). Shard after :meth:`shuffle` (all processes shuffle alike,
        then split) and before :meth:`batch`. ``drop_remainder`` (default) first leaves out
        the last ``rows % count`` rows so every process reads as many batches as the
        others; a process with one batch fewer would leave the rest waiting in a
        collective. Shards are disjoint; without ``drop_remainder`` they cover every row;
        a shard left without rows (fewer rows than shards) is a :class:`DataError`."""
        if (index is None) != (count is None):
            raise DataError("shard: give both index and count, or neither (JAX's process)")
        if index is None:
            options = grain.sharding.ShardByJaxProcess(drop_remainder=drop_remainder)
            index, count = options.shard_index, options.shard_count
        assert count is not None
        count = integer(count, "shard", 1, "count")
        index = integer(index, "shard", 0, "index")
        return self._then(Shard(index, count, flag(drop_remainder, "shard", "drop_remainder")))

    def batch(
        self,
        batch_size: int,
        *,
        drop_remainder: bool = False,
        columns: Sequence[str] | None = None,
        wrap: bool = False,
    ) -> DataFrame:
        """Every ``batch_size`` rows become one whose columns are the rows' values stacked
        along a new first axis (NNC's ``ccv_cnnp_dataframe_combine_new``). The last batch
        is shorter unless ``drop_remainder`` (a fixed shape keeps ``jit`` from compiling
        twice; a :class:`DataError` if it leaves no batch) or ``wrap``: NNC's combine
        fills it up with its own rows again, row ``k`` of it being its ``k % n``-th of
        ``n`` (8 rows in batches of 3: rows 6, 7, 6 last), so every batch has one shape
        and no row is left out. ``columns`` keeps only those. Rows of different shapes
        raise :class:`DataError` naming column, rows and shapes.

        >>> import numpy as np
        >>> from fnnc.data import DataFrame
        >>> df = DataFrame.from_arrays(x=np.arange(5))
        >>> [b.tolist() for b in df.batch(2, wrap=True).iterator("x")]
        [[0, 1], [2, 3], [4, 4]]
        """
        inputs = self._columns if columns is None else column_names(columns, "batch columns")
        drop, wrap = flag(drop_remainder, "batch", "drop_remainder"), flag(wrap, "batch", "wrap")
        if drop and wrap:
            raise DataError(
                "batch: drop_remainder leaves out a short last batch and wrap fills it up; "
                "give one of them"
            )
        group = Group(batch_size, drop, inputs, stack=True, wrap=wrap)
        return self._then(group)

    def sample(
        self,
        size: int,
        fn: Callable[..., Any] | None = None,
        *,
        inputs: str | Sequence[str] | None = None,
        output: str = "sample",
        drop_remainder: bool = False,
    ) -> DataFrame:
        """Every ``size`` rows become one (NNC's ``ccv_cnnp_dataframe_sample_new``).

        Without ``fn`` the columns (``inputs``, default all) hold Python lists of the
        rows' values, for rows that do not stack (pad them in a later :meth:`map`). With
        ``fn`` the result is one column ``output = fn(*lists)``, one list per input
        column, as NNC's sample function reduces n rows to one.
        """
        cols = self._columns if inputs is None else column_names(inputs, "sample inputs")
        check_known("sample", cols, self._columns)
        if fn is None:
            drop = flag(drop_remainder, "sample", "drop_remainder")
            return self._then(Group(size, drop, cols, stack=False))
        if not callable(fn):
            raise DataError(f"sample: fn must be callable, got {type(fn).__name__}")
        out = column_names(output, "sample output")[0]
        drop = flag(drop_remainder, "sample", "drop_remainder")
        return self._then(Group(size, drop, cols, stack=False, fn=fn, output=out))

    # -- reading -----------------------------------------------------------------------
    def read_with(
        self, *, workers: int | None = None, threads: int | None = None, prefetch: int | None = None
    ) -> DataFrame:
        """This dataframe, read by default with these :meth:`iterator` options (what
        is not given keeps its default): how a loop that makes the iterators itself
        reads with worker processes, e.g. ``model.train(df.read_with(workers=2))``.
        Workers start once per run, not once per epoch (:mod:`fnnc.data.workers`). The
        rows and their order do not depend on these options.

        >>> import numpy as np
        >>> from fnnc.data import DataFrame
        >>> DataFrame.from_arrays(x=np.arange(4)).batch(2).read_with(workers=2)
        DataFrame(2 rows; columns x; batch(2) read_with(workers=2))
        """
        given = {"workers": workers, "threads": threads, "prefetch": prefetch}
        for name, value in given.items():
            if value is not None:
                given[name] = integer(value, "read_with", 0, name)
        out = object.__new__(DataFrame)
        for slot in DataFrame.__slots__:
            setattr(out, slot, getattr(self, slot))
        out._read = {**self._read, **{k: v for k, v in given.items() if v is not None}}
        return out

    def _output(self, columns: str | Sequence[str] | None) -> tuple[tuple[str, ...], str]:
        if columns is None:
            return self._columns, "dict"
        chosen = column_names(columns, "columns")
        check_known("iterator", chosen, self._columns)
        return chosen, "one" if isinstance(columns, str) else "tuple"

    def to_grain(
        self, columns: str | Sequence[str] | None = None, *, seed: int = 0
    ) -> grain.MapDataset:
        """One epoch as a ``grain.MapDataset`` (index ``i + e * len(df)`` reads epoch
        ``e``), for composing with Grain directly. ``columns`` as in :meth:`iterator`;
        Grain's iterators drop ``None`` elements (its filter), so one column that may hold
        ``None`` (a CSV's missing field) is safer read as a tuple, ``to_grain(["b"])``."""
        chosen, kind = self._output(columns)
        return self._build(chosen, kind)(_seed(seed, "to_grain") or 0)

    def _build(self, chosen: tuple[str, ...], kind: str) -> Callable[[int], grain.MapDataset]:
        source, rows, stages = self._source, self._source_rows, self._stages
        return lambda seed: plan.build(source, rows, stages, chosen, kind, seed)

    def iterator(
        self,
        columns: str | Sequence[str] | None = None,
        *,
        seed: int = 0,
        epoch: int = 0,
        epochs: int | None = 1,
        workers: int | None = None,
        threads: int | None = None,
        prefetch: int | None = None,
    ) -> DataIterator:
        """An iterator over the rows (NNC's ``ccv_cnnp_dataframe_iter_new``).

        Args:
            columns: ``None``: each row is a dict of every column. A list of names: a
                tuple of those. One name: that column's value alone.
            seed: seeds every shuffle and random map without a seed of its own.
            epoch: the first epoch; epoch ``e`` is shuffled from (seed, e), so calling
                ``iterator(epoch=e)`` for ``e = 0, 1, ...`` continues one sequence.
            epochs: how many epochs to run through (``None``: without end).
            workers: processes reading ahead (Grain's ``mp_prefetch``); the stream is the
                same for any number. Default 0, or what :meth:`read_with` set (as for
                ``threads`` and ``prefetch``). Functions and columns are sent to them pickled
                (memory maps by file name). Starting them takes seconds: worth it when
                maps are heavy Python.
            threads: threads reading in each process (Grain's ``ReadOptions``). Default:
                0 when every column is in memory (threads only contend for the GIL), 4
                when columns read files, memory maps or call functions.
            prefetch: elements (batches, after :meth:`batch`) read ahead per process.
                Default ``2 * threads``; with ``threads=0`` a positive value reads ahead
                on one background thread (Grain's ``ThreadPrefetchIterDataset``).

        The iterator's ``get_state()`` is a JSON-able dict; ``set_state`` on a new
        iterator of the same dataframe resumes with exactly the rows that would have come
        next.
        """
        chosen, kind = self._output(columns)
        read = self._read
        # One column's values go through Grain boxed in a tuple: its threads and workers
        # would drop a None value (Grain's filter), and with it a row of the stream.
        return DataIterator(
            build=self._build(chosen, "boxed" if kind == "one" else kind),
            boxed=kind == "one",
            signature=self._signature(),
            seed=_seed(seed, "iterator") or 0,
            epoch=epoch,
            epochs=epochs,
            workers=read.get("workers", 0) if workers is None else workers,
            threads=read.get("threads") if threads is None else threads,
            prefetch=read.get("prefetch") if prefetch is None else prefetch,
            in_memory=all(c.in_memory for c in self._source.values()),
            pipeline=(id(self._source), self._stages, chosen, kind),
        )

    def __iter__(self) -> DataIterator:
        """``iterator()``: one epoch of dict rows, seed 0."""
        return self.iterator()

    def _signature(self) -> str:
        """What a saved iterator position depends on: rows, columns and steps (not the
        functions' code)."""
        source = ",".join(self._source) + f":{self._source_rows}"
        return f"{source}|{' '.join(s.describe() for s in self._stages)}|{self._rows}"
