"""``python -m fnnc inspect FILE [--stats]``: what an NNC or fnnc tensor file holds.

>>> import os, tempfile
>>> import numpy as np
>>> from fnnc.io import TensorFile
>>> from fnnc.io.cli import inspect_lines
>>> path = os.path.join(tempfile.mkdtemp(), "w.sqlite")
>>> with TensorFile(path) as f:
...     f.write("w", np.array([[1, 2], [3, np.nan]], np.float32))
>>> print("\\n".join(inspect_lines(path, stats=True)[1:]))
name  dtype    shape   format  bytes  min  max  mean  nan
w     float32  [2, 2]  NHWC    16     1    3    2     1
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from fnnc.errors import FnncError
from fnnc.io.tensor_file import TensorFile


def inspect_lines(path: str | os.PathLike[str], *, stats: bool = False) -> list[str]:
    """The report ``python -m fnnc inspect`` prints, line by line.

    Raises:
        TensorFileError: the file is missing, not SQLite, or has no ``tensors`` table.
    """
    with TensorFile(path, readonly=True) as f:
        header = ["name", "dtype", "shape", "format", "bytes"]
        header += ["min", "max", "mean", "nan"] if stats else []
        table, total = [header], 0
        for name in f.names():
            table.append(_row(f, name, stats))
            total += int(table[-1][4]) if table[-1][4].isdigit() else 0
        lines = [f"{f.path}: {len(table) - 1} tensors, {_human(total)} of data"]
        lines += _aligned(table)
        lines += _extras(f)
    return lines


def _row(f: TensorFile, name: str, stats: bool) -> list[str]:
    try:
        info = f.info(name)
    except FnncError as e:
        return [name, "?", "?", "?", "?"] + (["?"] * 4 if stats else []) + [f"({e})"]
    dtype = info.dtype.name if info.dtype is not None else "qx"
    if info.encoder:
        dtype += f" (encoder {info.encoder:#x})"
    row = [name, dtype, str(list(info.shape)), info.format, str(info.nbytes)]
    if stats:
        try:
            row += _stats(f.read(name))
        except FnncError:
            row += ["n/a"] * 4
    return row


def _stats(arr: np.ndarray) -> list[str]:
    values = arr.reshape(-1)
    nan = 0
    if np.issubdtype(values.dtype, np.inexact) or values.dtype.kind == "V":
        values = values.astype(np.float64)
        mask = np.isnan(values)
        nan = int(mask.sum())
        values = values[~mask]
    if values.size == 0:
        return ["nan", "nan", "nan", str(nan)]
    lo, hi = values.min(), values.max()
    mean = values.mean(dtype=np.float64)
    return [_num(lo), _num(hi), _num(mean), str(nan)]


def _num(x: Any) -> str:
    return f"{float(x):.6g}"


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def _aligned(table: list[list[str]]) -> list[str]:
    columns = max(len(r) for r in table)
    widths = [max(len(r[i]) for r in table if i < len(r)) for i in range(columns)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]


def _extras(f: TensorFile) -> list[str]:
    lines = []
    if f.has_table("fnnc_graphs"):
        names = [r[0] for r in f.connection.execute("SELECT name FROM fnnc_graphs ORDER BY name")]
        lines.append(f"graphs: {', '.join(names) or 'none'}")
    if f.has_table("fnnc_checkpoints"):
        query = "SELECT step FROM fnnc_checkpoints ORDER BY step"
        steps = [str(r[0]) for r in f.connection.execute(query)]
        lines.append(f"checkpoint steps: {', '.join(steps) or 'none'}")
    return lines
