"""NNC's built-in dataframe add-ons (``ccv_cnnp_dataframe_addons.c``) as derived columns.

Each add-on is a :meth:`~fnnc.data.DataFrame.map` with a ready-made function, under the
name NNC gives it; they work on a row or, after ``batch``, on a whole batch:

========================================  ==========================================
NNC                                       fnnc.data
========================================  ==========================================
``ccv_cnnp_dataframe_one_hot``            :meth:`AddOns.one_hot`
``ccv_cnnp_dataframe_copy_scalar``        :meth:`AddOns.copy_scalar`
``ccv_cnnp_dataframe_one_squared``        :meth:`AddOns.one_squared`
``ccv_cnnp_dataframe_truncate``           :meth:`AddOns.truncate`
``ccv_cnnp_dataframe_image_random_jitter``  :meth:`AddOns.image_random_jitter`
========================================  ==========================================

The functions themselves (:func:`one_hot`, ...) are plain NumPy and usable alone.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fnnc.data.errors import DataError, flag, integer
from fnnc.data.jitter import Jitter


def one_hot(label: Any, depth: int, on: float, off: float, dtype: Any) -> np.ndarray:
    """``label`` (an integer or an array of them) as vectors of ``depth`` entries, ``on``
    at the label and ``off`` elsewhere: shape ``label.shape + (depth,)``."""
    label = np.asarray(label)
    if not np.issubdtype(label.dtype, np.integer):
        raise ValueError(f"one_hot expects integer labels, got dtype {label.dtype}")
    if label.size and (label.min() < 0 or label.max() >= depth):
        raise ValueError(
            f"one_hot labels must be in [0, {depth}), got {label.min()}..{label.max()}"
        )
    out = np.full((*label.shape, depth), off, dtype=dtype)
    np.put_along_axis(out, label[..., None], np.asarray(on, dtype), axis=-1)
    return out


def copy_scalar(value: Any, dtype: Any) -> np.ndarray:
    """A scalar as a tensor of shape ``[1]`` in ``dtype`` (an array of them: ``[..., 1]``)."""
    value = np.asarray(value)
    return value.astype(dtype).reshape((*value.shape, 1))


def _lengths(lengths: Any, what: str) -> np.ndarray:
    lengths = np.asarray(lengths)
    if not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(f"{what} expects integer lengths, got dtype {lengths.dtype}")
    return lengths


def _longest(lengths: np.ndarray) -> int:
    return int(lengths.max()) if lengths.size else 0


def _mask(lengths: np.ndarray, size: int) -> np.ndarray:
    inside = np.arange(size) < lengths[..., None]
    return (inside[..., :, None] & inside[..., None, :]).astype(np.int32)


def one_squared(lengths: Any, max_length: int, variable_size: bool) -> np.ndarray:
    """Square masks ``[..., L, L]`` (int32): 1 where row and column are both below the
    length. ``L`` is ``max_length``, or with ``variable_size`` the largest length."""
    return one_squared_columns(lengths, max_length=max_length, variable_size=variable_size)


def one_squared_columns(
    *columns: Any, max_length: int, variable_size: bool
) -> np.ndarray | tuple[np.ndarray, ...]:
    """:func:`one_squared` of each column of lengths, all of one size ``L`` (NNC's
    ``_ccv_cnnp_one_squared``): ``max_length``, or with ``variable_size`` the largest
    length of all the columns. One column gives its mask, several a tuple."""
    lengths = [_lengths(c, "one_squared") for c in columns]
    longest = max(_longest(n) for n in lengths)
    low = min((int(n.min()) for n in lengths if n.size), default=0)
    if low < 0 or longest > max_length:
        raise ValueError(f"lengths must be in [0, {max_length}], got {low}..{longest}")
    masks = tuple(_mask(n, longest if variable_size else max_length) for n in lengths)
    return masks[0] if len(masks) == 1 else masks


def truncate(vector: Any, lengths: Any) -> np.ndarray:
    """``vector`` cut to the largest of ``lengths`` along the sequence axis: axis 0 for a
    row (``lengths`` a scalar), axis 1 for a batch (``lengths`` of shape ``[batch]``).
    Entries past a shorter sequence's own length stay, as NNC leaves them."""
    return truncate_columns(vector, lengths)  # type: ignore[return-value]


def truncate_columns(*columns: Any) -> np.ndarray | tuple[np.ndarray, ...]:
    """The vectors ``columns[:n]``, each paired with the lengths ``columns[n:]``, all
    cut to the largest length of all the length columns (NNC's ``_ccv_cnnp_truncate``),
    as :func:`truncate` cuts one. One pair gives its vector, several a tuple."""
    half = len(columns) // 2
    pairs = [(np.asarray(v), np.asarray(n)) for v, n in zip(columns[:half], columns[half:])]
    keep = max(_longest(n) for _, n in pairs)
    cut = []
    for vector, lengths in pairs:
        axis = lengths.ndim
        if vector.ndim <= axis or (axis and vector.shape[0] != lengths.shape[0]):
            raise ValueError(
                f"truncate: lengths of shape {list(lengths.shape)} do not fit a sequence of "
                f"shape {list(vector.shape)} (one length per row, sequence on the next axis)"
            )
        if keep > vector.shape[axis]:
            raise ValueError(f"truncate: length {keep} exceeds the sequence's {vector.shape[axis]}")
        cut.append(vector[(slice(None),) * axis + (slice(0, keep),)])
    return cut[0] if len(cut) == 1 else tuple(cut)


def _fill(value: Any, dtype: np.dtype, name: str) -> Any:
    """``value`` as a ``dtype`` number, or a :class:`DataError` when ``dtype`` cannot hold
    it: a fraction in an integer or bool type, a number out of its range."""
    try:
        wanted = float(value)
    except (TypeError, ValueError):
        raise DataError(f"one_hot: {name} must be a number, got {value!r}") from None
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            number = np.asarray(value, dtype=dtype)[()]
        got = float(number)
    except (OverflowError, TypeError, ValueError):  # a Python int out of the type's range
        number, got = None, None
    exact = np.issubdtype(dtype, np.integer) or dtype == np.bool_
    if got is None or (got != wanted if exact else math.isinf(got) > math.isinf(wanted)):
        became = "" if got is None else f" (it would be {got:g})"
        raise DataError(
            f"one_hot: {name}={value!r} does not fit dtype {dtype}{became}; give a value "
            f"{dtype} holds, or a float dtype"
        )
    return number


def _pairs(inputs: str | Sequence[str], outputs: Any, suffix: str) -> tuple[tuple[str, ...], Any]:
    names = (inputs,) if isinstance(inputs, str) else tuple(inputs)
    if outputs is None:
        outputs = tuple(f"{n}_{suffix}" for n in names)
    elif isinstance(outputs, str):
        outputs = (outputs,)
    if len(outputs) != len(names):
        raise DataError(f"{suffix}: {len(names)} inputs {list(names)} but outputs {outputs!r}")
    return names, tuple(outputs)


def _spread(*values: Any, fn: Any, where: list[int]) -> Any:
    return fn(*(values[i] for i in where))


def _map_columns(
    frame: Any, name: str, fn: Any, inputs: str | tuple[str, ...], outputs: Any, **kwargs: Any
) -> Any:
    """``frame.map(fn, inputs, outputs)``, with ``kwargs`` bound and the map named
    ``name`` in errors (the add-on's name, not ``partial``); ``inputs`` may name a
    column twice (NNC's column lists may: two vectors sharing one length column)."""
    inputs = (inputs,) if isinstance(inputs, str) else inputs
    unique = tuple(dict.fromkeys(inputs))
    if unique != inputs:
        kwargs = {"fn": functools.partial(fn, **kwargs), "where": [unique.index(c) for c in inputs]}
        fn = _spread
    bound = functools.partial(fn, **kwargs)
    bound.__qualname__ = name  # type: ignore[attr-defined]  # what function_name shows
    return frame.map(bound, unique, outputs)


class AddOns:
    """NNC's add-ons as :class:`~fnnc.data.DataFrame` methods; each returns a new
    dataframe with the derived column(s) (default name: ``<input>_<add-on>``)."""

    __slots__ = ()
    map: Any  # DataFrame.map

    def one_hot(
        self,
        column: str,
        depth: int,
        output: str | None = None,
        *,
        on: float = 1.0,
        off: float = 0.0,
        dtype: Any = np.float32,
    ) -> Any:
        """``output``: the integer labels of ``column`` as one-hot vectors of ``depth``
        (NNC's ``range``) entries, ``on`` at the label (NNC's ``onval``), ``off``
        elsewhere, in ``dtype``. A label outside ``[0, depth)`` raises :class:`DataError`
        naming the row.

        >>> import numpy as np
        >>> from fnnc.data import DataFrame
        >>> df = DataFrame.from_arrays(y=np.array([2, 0])).one_hot("y", 3)
        >>> df[0]["y_one_hot"].tolist()
        [0.0, 0.0, 1.0]
        """
        depth = integer(depth, "one_hot", 1, "depth")
        dtype = np.dtype(dtype)
        on, off = _fill(on, dtype, "on"), _fill(off, dtype, "off")
        options = dict(depth=depth, on=on, off=off, dtype=dtype)
        return _map_columns(
            self, "one_hot", one_hot, column, output or f"{column}_one_hot", **options
        )

    def copy_scalar(
        self, column: str, output: str | None = None, *, dtype: Any = np.float32
    ) -> Any:
        """``output``: each scalar of ``column`` as a ``[1]`` tensor of ``dtype`` (NNC
        converts ``from_dt`` to ``to_dt``; the source dtype is the column's own)."""
        output = output or f"{column}_scalar"
        return _map_columns(self, "copy_scalar", copy_scalar, column, output, dtype=np.dtype(dtype))

    def one_squared(
        self,
        columns: str | Sequence[str],
        max_length: int,
        outputs: str | Sequence[str] | None = None,
        *,
        variable_size: bool = False,
    ) -> Any:
        """For each column of sequence lengths (a batch ``[B]`` of them, or one), an int32
        mask ``[B, L, L]`` with 1 where row and column index are both below the length:
        the attention mask of padded sequences. ``L`` is ``max_length``, or with
        ``variable_size`` the longest length in the batch of any of ``columns``: one
        call's masks all have one size, as NNC's."""
        max_length = integer(max_length, "one_squared", 0, "max_length")
        names, outs = _pairs(columns, outputs, "mask")
        variable_size = flag(variable_size, "one_squared", "variable_size")
        options = dict(max_length=max_length, variable_size=variable_size)
        return _map_columns(self, "one_squared", one_squared_columns, names, outs, **options)

    def truncate(
        self,
        vectors: str | Sequence[str],
        lengths: str | Sequence[str],
        outputs: str | Sequence[str] | None = None,
    ) -> Any:
        """Each of ``vectors`` cut to the largest length in any column of ``lengths``
        (NNC's ``vec_idxs`` and ``len_idxs``, paired in order; one call's outputs all
        have one length, as NNC's): a batch of padded sequences ``[B, L, ...]`` becomes
        ``[B, max(lengths), ...]``."""
        names, outs = _pairs(vectors, outputs, "truncated")
        lens = (lengths,) if isinstance(lengths, str) else tuple(lengths)
        if len(lens) != len(names):
            raise DataError(f"truncate: {len(names)} vector columns but {len(lens)} length columns")
        return _map_columns(self, "truncate", truncate_columns, names + lens, outs)

    def image_random_jitter(
        self, column: str, output: str | None = None, *, seed: int | None = None, **options: Any
    ) -> Any:
        """``output``: NNC's image augmentation of ``column`` (``[H, W, C]`` images,
        or a batch of them), random per row and epoch and replayed exactly from the
        iterator's seed (or ``seed``). ``options`` are :class:`~fnnc.data.jitter.Jitter`'s
        fields, NNC's ``ccv_cnnp_random_jitter_t``: ``resize=(min, max)``,
        ``size=(rows, cols)``, ``offset=(x, y)``, ``aspect_ratio``, ``center_crop``,
        ``symmetric``, ``brightness``, ``contrast``, ``saturation``, ``lighting``,
        ``normalize=(mean, std)``, ``roundup``. Output is float32."""
        try:
            jitter = Jitter(**options)
        except (TypeError, ValueError) as e:
            raise DataError(f"image_random_jitter: {e}; see fnnc.data.jitter.Jitter") from e
        return self.map(jitter, column, output or f"{column}_jitter", random=True, seed=seed)
