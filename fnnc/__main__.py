"""Command line: ``python -m fnnc inspect FILE [--stats]``.

``inspect`` lists the tensors of an NNC or fnnc SQLite file (name, dtype, shape,
format, stored bytes), the graphs and checkpoint steps fnnc keeps beside them, and with
``--stats`` each tensor's min, max, mean (NaNs left out) and NaN count.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fnnc.errors import FnncError


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m fnnc", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser("inspect", help="list the tensors of an NNC/fnnc file")
    inspect.add_argument("file", help="an SQLite file with NNC's tensors table")
    inspect.add_argument("--stats", action="store_true", help="add min, max, mean, NaN count")
    args = parser.parse_args(argv)

    from fnnc.io.cli import inspect_lines

    try:
        lines = inspect_lines(args.file, stats=args.stats)
    except FnncError as e:
        print(f"python -m fnnc inspect: error: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
