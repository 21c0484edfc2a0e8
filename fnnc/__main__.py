"""Command line: ``python -m fnnc inspect FILE [--stats] [--verify]``.

``inspect`` lists the tensors of an NNC or fnnc SQLite file (name, dtype, shape,
format, stored bytes), the graphs and checkpoint steps fnnc keeps beside them, with
``--stats`` each tensor's min, max, mean (NaNs left out) and NaN count, and with
``--verify`` a check of every row (exit status 1 on damage). See :mod:`fnnc.io.cli`.
"""

from __future__ import annotations

import sys

from fnnc.io.cli import main as main

if __name__ == "__main__":
    sys.exit(main())
