"""Model parameters in a tensor file, named as ``ccv_cnnp_model_write`` names them.

NNC writes a compiled model's parameters and internals (running statistics) in one
transaction, each under its id (``lib/nnc/ccv_cnnp_model_io.c``):

============================  ==============================
without a model name          with model name ``n``
============================  ==============================
parameter ``<id>``            ``__n__[<id>]``
internal ``<id>(<device>)``   ``__n__[<id>(<device>)]``
============================  ==============================

Ids are NNC's (see :class:`fnnc.models.BuildContext`): ``t-`` for parameters, ``r-``
for internals, then ``<name>-<seq>`` (or ``<seq>`` unnamed) per model level and the
index in the layer: NNC's ``sequential([dense(8), relu(), dense(3)])`` writes
``t-0-0``, ``t-0-1``, ``t-1-0``, ``t-1-1``; a batch norm's running statistics are rows
like ``r-1-0(0)``.

``<device>`` is the data-parallel index (0 for a model on one device). Reading back
matches rows to what the model expects and names every row that is missing or has
the wrong shape, in one error.

>>> import os, tempfile
>>> import numpy as np
>>> from fnnc.io import TensorFile, read_parameters, write_parameters
>>> path = os.path.join(tempfile.mkdtemp(), "model.sqlite")
>>> write_parameters(path, {"t-linear-0-0": np.ones((4, 3), np.float32)}, name="mlp",
...                  internals={"r-batch_norm-0-0": np.zeros(4, np.float32)})
>>> TensorFile(path, readonly=True).names()
['__mlp__[r-batch_norm-0-0(0)]', '__mlp__[t-linear-0-0]']
>>> got = read_parameters(path, {"t-linear-0-0": ((4, 3), np.float32),
...                              "t-linear-0-1": ((4,), np.float32)}, name="mlp", strict=False)
>>> list(got), got.missing
(['t-linear-0-0'], ('t-linear-0-1',))
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from fnnc.core.params import require_flag
from fnnc.errors import ParameterError
from fnnc.io.convert import open_tensors
from fnnc.io.format import FLOATS
from fnnc.io.processes import writes_files
from fnnc.io.tensor_file import Encoder, TensorFile

Source = TensorFile | str | os.PathLike[str]
_INTERNAL = re.compile(r"^(.*)\((\d+)\)$")


def parameter_row(key: str, *, name: str | None = None) -> str:
    """The row name NNC gives parameter ``key`` (of the model called ``name``; ``""`` is
    a name, as to ``ccv_cnnp_model_write``: rows ``____[<key>]``)."""
    return key if name is None else f"__{name}__[{key}]"


def internal_row(key: str, *, name: str | None = None, device: int = 0) -> str:
    """The row name NNC gives internal ``key`` on data-parallel ``device``."""
    return parameter_row(f"{key}({device})", name=name)


@contextlib.contextmanager
def opened(source: Source, *, readonly: bool = False) -> Iterator[TensorFile]:
    """``source`` itself if it is an open file (a :class:`TensorFile`, a
    :class:`~fnnc.io.SafetensorsFile`, a :class:`~fnnc.io.convert.Renamed` view), else
    the path opened by its extension (``.safetensors`` or an NNC tensor file) and closed."""
    if not isinstance(source, (str, os.PathLike)):
        yield source
        return
    with open_tensors(source, readonly=readonly) as f:
        yield f  # type: ignore[misc]


def write_parameters(
    target: Source,
    params: Mapping[str, Any],
    *,
    name: str | None = None,
    internals: Mapping[str, Any] | None = None,
    device: int = 0,
    format: str = "NHWC",  # noqa: A002 (NNC's word)
    encoder: Encoder | None = None,
) -> None:
    """Writes a model's parameters (and internals) in one transaction, named as NNC does.

    Args:
        target: a :class:`TensorFile` or a path.
        params: parameter id -> array.
        name: the model name; rows become ``__<name>__[<id>]``.
        internals: internal id -> array (e.g. batch-norm running statistics), stored as
            ``<id>(<device>)``.
        device: the data-parallel index in internal rows.
        format: the layout tag of every row.
        encoder: passed to :meth:`TensorFile.write`.

    In a multi-process run only process 0 writes (:mod:`fnnc.io.processes`); the
    others return without touching the file. ``params`` or ``internals`` that is not a
    mapping is a :class:`~fnnc.errors.ParameterError` (also a ``TypeError``).
    """
    _mapping(params, "write_parameters", "params", "parameter id -> array", optional=False)
    _mapping(internals, "write_parameters", "internals", "internal id -> array")
    rows = [(parameter_row(k, name=name), v) for k, v in params.items()]
    rows += [(internal_row(k, name=name, device=device), v) for k, v in (internals or {}).items()]
    _distinct([row for row, _ in rows], [*params, *(f"internal {k}" for k in internals or {})])
    if not writes_files():
        return
    with opened(target) as f, f.transaction():
        for row, value in rows:
            f.write(row, value, format, encoder=encoder)


def _distinct(rows: list[str], ids: list[str]) -> None:
    """Each id gets its own row, else a :class:`ParameterError` naming the ids that share
    one (the later write would silently replace the earlier one)."""
    first: dict[str, str] = {}
    for row, key in zip(rows, ids, strict=True):
        if row in first:
            raise ParameterError(
                f"write_parameters: {first[row]!r} and {key!r} are both stored as row "
                f"{row!r}, so one would replace the other; rename one of them (NNC's ids "
                "never collide: parameters start with t-, internals with r-)"
            )
        first[row] = key


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """A stored row whose shape or dtype is not what the model expects."""

    key: str
    row: str
    stored: str
    expected: str

    def __str__(self) -> str:
        return f"{self.key}: stored {self.stored}, expected {self.expected}"


class ParameterSet(Mapping[str, np.ndarray]):
    """Parameters read back: a mapping id -> array, with what did not match.

    Attributes:
        internals: internal id -> array.
        missing: expected ids (internals as ``<id>(<device>)``) with no row.
        mismatched: rows whose shape or dtype differs from the expected one.
    """

    def __init__(
        self,
        params: dict[str, np.ndarray],
        internals: dict[str, np.ndarray],
        missing: list[str],
        mismatched: list[Mismatch],
    ):
        self._params: dict[str, np.ndarray] = params
        self.internals: dict[str, np.ndarray] = internals
        self.missing: tuple[str, ...] = tuple(missing)
        self.mismatched: tuple[Mismatch, ...] = tuple(mismatched)

    def __getitem__(self, key: str) -> np.ndarray:
        return self._params[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def __repr__(self) -> str:
        return (
            f"ParameterSet({len(self)} parameters, {len(self.internals)} internals, "
            f"missing={list(self.missing)}, mismatched={[str(m) for m in self.mismatched]})"
        )


def read_parameters(
    source: Source,
    expected: Mapping[str, Any] | None = None,
    *,
    name: str | None = None,
    internals: Mapping[str, Any] | None = None,
    device: int = 0,
    strict: bool = True,
) -> ParameterSet:
    """Reads a model's parameters, checking them against what the model expects.

    Args:
        source: a :class:`TensorFile` or a path.
        expected: parameter id -> ``(shape, dtype)`` (or anything with ``.shape`` and
            ``.dtype``; dtype ``None`` takes any). ``None`` reads every parameter row of
            the model (every unnamed row, or every ``__<name>__[...]`` row).
        name: the model name used when writing.
        internals: expected internals, like ``expected``; ``None`` reads every internal
            row of ``device`` when ``expected`` is ``None``, and none otherwise.
        device: the data-parallel index of the internals to read.
        strict: raise if anything expected is missing or mis-shaped; with ``False``,
            return what matched and list the rest in ``missing`` / ``mismatched``.

    Floating rows are converted to the expected floating dtype (NNC converts 16F and
    32F); a scalar expected as ``()`` matches NNC's ``[1]`` (and a ``[1]`` parameter a
    scalar row fnnc wrote, which NNC reads as ``[1]``), and a zero-size shape such as
    ``(0, 4)`` the ``(0,)`` of a row with no elements (NNC's ``dim`` cannot hold either);
    a row whose shape is the expected one with size-1 axes inserted or removed reads as
    the expected shape (NNC's norm layers keep scale and bias x-ranked, ``[1, 1, C]``
    beside fnnc's ``[C]``; ``[1, 4]`` is not taken for ``[4, 1]``).

    Raises:
        ParameterError: (strict) listing every missing and every mismatched parameter;
            also (and as a ``TypeError``) for ``expected`` or ``internals`` that is not a
            mapping, or a spec that is not ``(shape, dtype)`` or an array-like.
    """
    strict = require_flag(strict, "read_parameters(strict=...)", ParameterError)
    _mapping(expected, "read_parameters", "expected", "parameter id -> (shape, dtype)")
    _mapping(internals, "read_parameters", "internals", "internal id -> (shape, dtype)")
    with opened(source, readonly=True) as f:
        if expected is None:
            expected, found = _discover(f, name, device)
            internals = found if internals is None else internals
        params, missing, mismatched = _match(f, expected, name, None)
        inner, imissing, imismatched = _match(f, internals or {}, name, device)
        result = ParameterSet(params, inner, missing + imissing, mismatched + imismatched)
        hint = _names_hint(f, result.missing, name) if strict and result.missing else []
    if strict and (result.missing or result.mismatched):
        lines = [f"read_parameters: {f.path} does not hold what the model expects"]
        lines[0] += f" (model name {name!r})" if name is not None else " (no model name)"
        if result.missing:
            lines.append(f"  missing ({len(result.missing)}): " + ", ".join(result.missing))
            lines += hint
        if result.mismatched:
            lines.append(f"  wrong shape or dtype ({len(result.mismatched)}):")
            lines += [f"    {m}" for m in result.mismatched]
        lines.append("pass strict=False to get what matched and these lists")
        raise ParameterError("\n".join(lines))
    return result


_NAMED = re.compile(r"^__(.*?)__\[(.*)\]$", re.DOTALL)


def _names_hint(f: TensorFile, missing: tuple[str, ...], name: str | None) -> list[str]:
    """Lines naming the models the file does hold (``__<name>__[...]`` rows, and bare
    rows) under which the ``missing`` ids are found, with the ``name=`` to read them:
    the usual cause of every id missing is the model name given or not given."""
    holds: dict[str | None, int] = {}
    for row in f.names():
        if not isinstance(row, str):
            continue
        m = _NAMED.match(row)
        holds.setdefault(m.group(1) if m else None, 0)
    lines = []
    for other in holds:
        if other == name:
            continue
        found = sum(parameter_row(key, name=other) in f for key in missing)
        if found:
            rows = "rows <id>" if other is None else f"rows __{other}__[<id>]"
            what = "a model without a name" if other is None else f"a model named {other!r}"
            lines.append(
                f"  the file holds {what} ({rows}) with {found} of the {len(missing)} "
                f"missing ids: read it with name={other!r}"
            )
    named = [repr(n) for n in holds if n is not None and n != name]
    if not lines and named:
        lines.append(f"  the file holds models named {', '.join(named)}; none has these ids")
    return lines


def _discover(f: TensorFile, name: str | None, device: int):
    params: dict[str, Any] = {}
    internals: dict[str, Any] = {}
    prefix = f"__{name}__["
    for row in f.names():
        if not isinstance(row, str):  # a damaged or foreign row: no parameter's name
            continue
        if name is not None:
            if not (row.startswith(prefix) and row.endswith("]")):
                continue
            key = row[len(prefix) : -1]
        elif row.startswith("__") and "__[" in row:
            continue  # another named model's row
        else:
            key = row
        m = _INTERNAL.match(key)
        if m is None:
            params[key] = None
        elif int(m.group(2)) == device:
            internals[m.group(1)] = None
    return params, internals


class _ParameterTypeError(ParameterError, TypeError):
    """An argument of the wrong kind: a :class:`ParameterError` that ``except TypeError``
    (what the spec check raised before) still catches."""


def _mapping(value: Any, where: str, what: str, holds: str, optional: bool = True) -> None:
    """``value`` is a mapping (or ``None``, if ``optional``), else a
    :class:`ParameterError` saying so."""
    if (value is not None or not optional) and not isinstance(value, Mapping):
        got = f"a {type(value).__name__}" + (
            f" of {len(value)} item(s)" if isinstance(value, (list, tuple)) else ""
        )
        raise _ParameterTypeError(
            f"{where}: {what} is {got}; give a dict {holds}, e.g. model.parameters()"
        )


def _spec(key: str, spec: Any) -> tuple[tuple[int, ...] | None, np.dtype | None]:
    if spec is None:
        return None, None
    if hasattr(spec, "shape") and hasattr(spec, "dtype"):
        return tuple(spec.shape), np.dtype(spec.dtype)
    if isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[0], (tuple, list)):
        try:
            return tuple(int(d) for d in spec[0]), None if spec[1] is None else np.dtype(spec[1])
        except (TypeError, ValueError):  # NumPy's "data type 'float99' not understood"
            pass
    raise _ParameterTypeError(
        f"read_parameters: expected[{key!r}] is {spec!r}; give (shape, dtype), e.g. "
        "((4, 3), np.float32), or an array / jax.ShapeDtypeStruct"
    )


def _ones_inserted(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether one shape is the other with size-1 axes inserted (``[1, 1, 4]`` and
    ``[4]``, ``[1, 3, 4]`` and ``[3, 4]``): the same values in the same order. Shapes of
    one length must be equal (``[1, 4]`` is not taken for ``[4, 1]``)."""
    long, short = (a, b) if len(a) > len(b) else (b, a)
    if len(long) == len(short):
        return False
    rest = iter(short)
    want = next(rest, None)
    for d in long:
        if d == want:
            want = next(rest, None)
        elif d != 1:
            return False
    return want is None


def _match(f: TensorFile, expected: Mapping[str, Any], name: str | None, device: int | None):
    values: dict[str, np.ndarray] = {}
    missing: list[str] = []
    mismatched: list[Mismatch] = []
    for key, spec in expected.items():
        shape, dtype = _spec(key, spec)
        if device is None:
            row, label = parameter_row(key, name=name), key
        else:
            row, label = internal_row(key, name=name, device=device), f"{key}({device})"
        if row not in f:
            missing.append(label)
            continue
        info = f.info(row)
        stored_shape = info.shape
        if shape is not None and (
            {shape, info.shape} == {(), (1,)}
            or (info.shape == (0,) and 0 in shape)
            or _ones_inserted(tuple(info.shape), shape)
        ):
            # NNC has no rank 0 (a scalar is [1] to NNC; fnnc reads its own as ()) nor
            # zero-size axes, and its layer/group/rms norms keep scale and bias x-ranked
            # ([1, 1, C] beside fnnc's [C]): each matches as in NNC, which reads by count
            stored_shape = shape
        held = info.dtype or info.palettized  # an NNC QX row reads as its element type
        dtype_ok = dtype is None or dtype == held or {dtype, held} <= FLOATS
        if (shape is not None and stored_shape != shape) or not dtype_ok:
            want = f"{dtype.name if dtype else '*'}{list(shape) if shape is not None else ''}"
            stored = f"{held.name if held else 'qx'}{list(info.shape)}"
            mismatched.append(Mismatch(label, row, stored, want))
            continue
        values[key] = f.read(row, shape=shape, dtype=dtype)
    return values, missing, mismatched
