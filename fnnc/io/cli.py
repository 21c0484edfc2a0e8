"""``python -m fnnc inspect FILE [--stats] [--verify]``: what an NNC or fnnc tensor file holds;
``python -m fnnc convert A B [--map FILE] [--encoder NAME]``: NNC tensor file <-> safetensors.

``inspect`` lists the tensors of an NNC or fnnc SQLite file (name, dtype, shape,
format, stored bytes), the graphs and checkpoint steps fnnc keeps beside them, and with
``--stats`` each tensor's min, max, mean (NaNs left out) and NaN count. ``--verify``
adds a check of every row (SQLite's ``integrity_check``, each row's format and length,
its checksum where fnnc wrote one; of a safetensors file, that each tensor reads; of a
``jax.export`` artifact, that its module reads) and exits with status 1 if anything is
damaged.

``inspect`` also lists a safetensors file's tensors (with ``--stats``; recognised by
its contents, whatever its extension), shows the signature of a ``jax.export``
artifact (:meth:`fnnc.models.Model.export`) and the nodes of a JSON graph file
(``fnnc.graph.save(graph, "g.json")``).
``convert`` copies every tensor (:func:`fnnc.io.convert`): ``--map`` is a JSON object
``{"old name": "new name" or null}``, ``--encoder`` an NNC codec for the target's rows.

A missing, damaged or non-SQLite file prints one line, ``python -m fnnc inspect:
error: ...``, and exits with status 1 (never a traceback); the file is only read.

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

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from fnnc.core.dtypes import is_inexact
from fnnc.errors import FnncError, TensorFileError
from fnnc.io import format as fmt
from fnnc.io.convert import convert
from fnnc.io.documents import describe_document
from fnnc.io.exported import describe_exported, load_exported
from fnnc.io.safetensors_io import SafetensorsFile, is_safetensors
from fnnc.io.sniff import looks_exported, looks_json, looks_safetensors
from fnnc.io.tensor_file import TensorFile

_DIGITS = re.compile(r"(\d+)")

DESCRIPTION = "What an NNC or fnnc tensor file holds."
INSPECT_HELP = """\
List the tensors of an NNC or fnnc SQLite file (name, dtype, shape, format, stored
bytes), in name order with numbers sorted as numbers, and the graphs and checkpoint
steps fnnc keeps beside them. Shapes are what fnnc reads: a scalar fnnc wrote shows
[] (NNC, which has no rank 0, reads its row as [1]). A missing, damaged or
non-SQLite file prints one error line and exits with status 1; the file is only read."""


def inspect_lines(path: str | os.PathLike[str], *, stats: bool = False) -> list[str]:
    """The report ``python -m fnnc inspect`` prints, line by line (a row that cannot
    be read shows ``?`` and why).

    Raises:
        TensorFileError: the file is missing, not SQLite, or has no ``tensors`` table.
    """
    return _inspect(path, stats)[0]


def _inspect(path: str | os.PathLike[str], stats: bool) -> tuple[list[str], int]:
    """The report's lines and how many rows could not be read."""
    if is_safetensors(path) or looks_safetensors(path):
        return _table(SafetensorsFile(path, readonly=True), stats, extras=False)
    if looks_exported(path):
        return describe_exported(path), 0
    if looks_json(path):
        return describe_document(path), 0
    with TensorFile(path, readonly=True) as f, f.operation("inspect"):
        return _table(f, stats, extras=True)


def _table(f: Any, stats: bool, *, extras: bool) -> tuple[list[str], int]:
    """The listing of an open tensor file (NNC's or safetensors) and its unreadable rows."""
    header = ["name", "dtype", "shape", "format", "bytes"]
    header += ["min", "max", "mean", "nan"] if stats else []
    table, total, unreadable = [header], 0, 0
    for name in sorted(f.names(), key=_sort_key):
        cells = _row(f, name, stats)
        unreadable += cells[1] == "?"
        table.append([str(cell) for cell in cells])
        total += int(table[-1][4]) if table[-1][4].isdigit() else 0
    lines = [f"{f.path}: {len(table) - 1} tensors, {_human(total)} of data"]
    lines += _aligned(table)
    lines += _extras(f) if extras else []
    return lines, unreadable


def natural_key(name: str) -> list[Any]:
    """Sorts names with their numbers as numbers: ``__ckpt-4__`` before ``__ckpt-12__``,
    ``t-fc-0-2`` before ``t-fc-0-10``.

    >>> sorted(["__ckpt-12__[w]", "__ckpt-4__[w]", "b", "__ckpt-4__[v]"], key=natural_key)
    ['__ckpt-4__[v]', '__ckpt-4__[w]', '__ckpt-12__[w]', 'b']
    """
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in _DIGITS.split(name)]


def _sort_key(name: Any) -> list[Any]:
    """:func:`natural_key`, with rows whose name is not TEXT (NULL, a BLOB) last."""
    return natural_key(name) if isinstance(name, str) else [(2, 0, fmt.label(name))]


def _row(f: Any, name: Any, stats: bool) -> list[str]:
    try:
        why = fmt.untitled(name, f.path)
        if why is not None:
            raise TensorFileError(why)
        info = f.info(name)
    except FnncError as e:
        unknown = ["?"] * (8 if stats else 4)
        return [fmt.label(name), *unknown, f"({e})"]
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
    if is_inexact(values.dtype) or values.dtype.kind == "V":
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
    """A statistic as printed: integers (an integer tensor's min and max) exactly,
    floats to 6 significant digits."""
    if isinstance(x, (int, np.integer)):
        return str(int(x))
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
        query = "SELECT name FROM fnnc_graphs ORDER BY name"
        names = [str(r[0]) for r in f.connection.execute(query)]
        lines.append(f"graphs: {', '.join(names) or 'none'}")
    if f.has_table("fnnc_checkpoints"):
        query = "SELECT step FROM fnnc_checkpoints ORDER BY step"
        steps = [str(r[0]) for r in f.connection.execute(query)]
        lines.append(f"checkpoint steps: {', '.join(steps) or 'none'}")
    return lines


def verify_lines(path: str | os.PathLike[str]) -> tuple[list[str], bool]:
    """The report of ``inspect --verify`` and whether the file is undamaged: an NNC
    SQLite file's rows checked (:meth:`TensorFile.verify`); a safetensors file's tensors
    or a ``jax.export`` artifact's module read, as those formats keep no checksums.

    Raises:
        TensorFileError: the file is missing, not SQLite, or has no ``tensors`` table.
    """
    if is_safetensors(path) or looks_safetensors(path):  # as inspect opens it
        return _verify_safetensors(path)
    if looks_exported(path):
        load_exported(path)  # a damaged module raises TensorFileError
        return [f"{path}: jax.export artifact: its module reads (it keeps no checksum)"], True
    if looks_json(path):  # a damaged one raises GraphFormatError
        return [describe_document(path)[0] + ": it reads (it keeps no checksum)"], True
    with TensorFile(path, readonly=True) as f:
        report = f.verify()
    return report.lines(), report.ok


def _verify_safetensors(path: str | os.PathLike[str]) -> tuple[list[str], bool]:
    """Every tensor of a safetensors file read (the format keeps no checksums)."""
    damaged = []
    with SafetensorsFile(path, readonly=True) as f:
        names = f.names()
        for name in names:
            try:
                f.read(name)
            except FnncError as e:
                damaged.append(f"  damaged: {name}: {e}")
    head = f"{os.fspath(path)}: {len(names)} tensors: {len(names) - len(damaged)} read, "
    head += f"{len(damaged)} damaged (safetensors keeps no checksums)"
    return [head, *damaged], not damaged


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fnnc``: runs the command line on ``argv``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m fnnc", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser(
        "inspect", help="list the tensors of an NNC/fnnc file", description=INSPECT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    inspect.add_argument("file", help="an SQLite file with NNC's tensors table")
    inspect.add_argument("--stats", action="store_true", help="add min, max, mean, NaN count")
    inspect.add_argument(
        "--verify", action="store_true", help="check every row; exit status 1 on damage"
    )
    conv = commands.add_parser("convert", help="copy tensors: NNC tensor file <-> safetensors")
    conv.add_argument("source", help="an NNC tensor file or a .safetensors file")
    conv.add_argument("target", help="the file to write (.safetensors or an NNC tensor file)")
    conv.add_argument("--map", help='JSON object {"old name": "new name" or null}')
    conv.add_argument("--encoder", help="an NNC codec for the target's rows, e.g. q8p, ezm7")
    conv.add_argument("--from", dest="source_format", choices=("nnc", "safetensors"))
    conv.add_argument("--to", dest="target_format", choices=("nnc", "safetensors"))
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except BrokenPipeError:
        # the reader left (``| head``): stop quietly, as cat and ls do. Point stdout
        # at devnull so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE: what a shell reports for a writer cut off by a pipe


def _run(args: argparse.Namespace) -> int:
    if args.command == "convert":
        return _convert(args)
    status = 0
    try:
        lines, unreadable = _inspect(args.file, args.stats)
        print("\n".join(lines), flush=True)
        if unreadable:
            print(
                f"python -m fnnc inspect: error: {args.file}: {unreadable} rows cannot be "
                "read (marked ?); the file is damaged or not NNC's: --verify lists them all",
                file=sys.stderr,
            )
            status = 1
    except FnncError as e:
        print(f"python -m fnnc inspect: error: {e}", file=sys.stderr)
        status = 1  # with --verify, the report may still say what is readable
    if args.verify:
        try:
            lines, ok = verify_lines(args.file)
        except FnncError as e:
            if not status:  # the listing's error said it already
                print(f"python -m fnnc inspect: error: {e}", file=sys.stderr)
            return 1
        print("\n".join(lines), flush=True)
        status = status or (0 if ok else 1)
    return status


def _convert(args: argparse.Namespace) -> int:
    try:
        names = convert(
            args.source,
            args.target,
            rename=args.map,
            encoder=args.encoder,
            source_format=args.source_format,
            target_format=args.target_format,
        )
    except FnncError as e:
        print(f"python -m fnnc convert: error: {e}", file=sys.stderr)
        return 1
    print(f"{args.source} -> {args.target}: {len(names)} tensors")
    return 0
